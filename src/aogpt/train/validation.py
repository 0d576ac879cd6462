"""Periodic validation: the mean loss per token on the same held-out windows every time.

For each set of weights (raw and EMA): the left-to-right loss, and, for families that read any
order, the any-order loss under uniform orders drawn from a generator re-seeded with
`eval_orders_seed` (the same orders every time). The losses are the family's
(`ModelFamily.validation_losses`); under DDP the batches are split over the ranks and summed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from aogpt.config import TrainConfig
from aogpt.errors import AOGPTError
from aogpt.families import ModelFamily
from aogpt.orders import make_order_sampler
from aogpt.train import distributed
from aogpt.train.sources import BatchSource
from aogpt.train.step import autocast


@dataclass
class Validation:
    """Scores models on the validation split: `validation({"raw": model, "ema": ema_model})`."""

    data: BatchSource
    cfg: TrainConfig
    block_size: int
    family: ModelFamily
    info: distributed.DistInfo
    device: torch.device
    amp: torch.dtype | None

    @torch.no_grad()
    def __call__(self, models: Mapping[str, nn.Module]) -> dict[str, float]:
        """`val/l2r/<weights>` (and `val/any/<weights>` for any-order families) for each model."""
        results: dict[str, float] = {}
        for weights, model in models.items():
            l2r, anyo, tokens = self._sums(model).tolist()
            if tokens == 0:
                raise AOGPTError("the validation split gave no batches", "prepare more validation data")
            results[f"val/l2r/{weights}"] = l2r / tokens
            if self.family.any_order:
                results[f"val/any/{weights}"] = anyo / tokens
        return results

    def _sums(self, model: nn.Module) -> torch.Tensor:
        """Summed left-to-right loss, any-order loss and token count over all ranks (float64)."""
        model.eval()
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # l2r, any, tokens
        order_gen = torch.Generator(self.device).manual_seed(self.cfg.eval_orders_seed)
        batches = self.data.iter_eval_batches("val", self.cfg.batch_size, self.block_size, self.cfg.eval_batches)
        for i, idx in enumerate(batches):
            order = make_order_sampler("uniform").sample(idx.shape[0], idx.shape[1], self.device, order_gen)
            if i % self.info.world_size != self.info.rank:
                continue
            idx = idx.to(self.device)
            with autocast(self.device, self.amp):
                l2r, anyo = self.family.validation_losses(model, idx, order)
                anyo = torch.zeros((), device=self.device) if anyo is None else anyo
            sums += torch.stack(
                [l2r.double(), anyo.double(), torch.tensor(idx.numel(), device=self.device, dtype=torch.float64)]
            )
        return distributed.all_reduce_sum(sums, self.info)
