"""Exponential moving average of the weights (AO-GPT trains with decay 0.9999).

The EMA lives in a full copy of the model, so evaluating it is just running that copy. Like the
paper's reference code, the decay ramps up as min(decay, (1 + u) / (10 + u)) after u updates,
so early averages are not dominated by the random initialisation.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class EMA:
    def __init__(self, model: nn.Module, decay: float, warmup: bool = True):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay {decay} must lie in [0, 1)")
        self.decay = decay
        self.warmup = warmup
        self.num_updates = 0
        self.model = copy.deepcopy(model).eval()
        self.model.requires_grad_(False)

    def current_decay(self) -> float:
        u = self.num_updates
        return min(self.decay, (1 + u) / (10 + u)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """ema <- d * ema + (1 - d) * param, for every parameter that trains, in one fused call (a frozen
        one, such as a gated model's source weights, `aogpt.pathway`, is left as it is)."""
        weight = 1.0 - self.current_decay()
        mine = list(self.model.parameters())  # read each time: FSDP replaces them by their shards
        pairs = [(m, p.detach()) for m, p in zip(mine, model.parameters(), strict=True) if p.requires_grad]
        if pairs:
            torch._foreach_lerp_([m for m, _ in pairs], [p for _, p in pairs], weight)
        self.num_updates += 1

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor], num_updates: int) -> None:
        self.model.load_state_dict(state, strict=False)
        self.num_updates = num_updates
