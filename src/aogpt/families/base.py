"""What a model family is: its architecture defaults, its capabilities and how it is scored.

A *family* answers, in one place, every question that depends on which kind of model we hold:
which architecture a variant name stands for, which orders it can read, how it is trained and
validated, how the likelihood of a sequence under an order is computed, and what generation may ask
of it (the samplers themselves are generation's: `aogpt.generation.samplers` picks one from these
capabilities). Training (`aogpt.train`), evaluation (`aogpt.evaluation`) and generation
(`aogpt.generation`) ask the family; none of them compares variant names.

A family is a frozen object, one per variant name, registered in `aogpt.families` (the registry).
Adding a family means writing one module with a subclass of `ModelFamily` and adding one line to
the registry. Nothing here imports the model or the configs: families act on the model object they
are given, so the configs can ask the registry for architecture defaults without an import circle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from aogpt.errors import AOGPTError
from aogpt.orders import is_adaptive, is_left_to_right, make_order_sampler


def unwrap(model: Any) -> nn.Module:
    """The `Transformer` inside whatever holds it: DDP/FSDP (`.module`), `torch.compile`
    (`._orig_mod`) or `aogpt.load`'s `Loaded` (`.model`). The one place that knows the wrappers."""
    while True:
        if hasattr(model, "config") and hasattr(model, "forward_slots"):
            return model
        for attr in ("module", "_orig_mod", "model"):
            inner = getattr(model, attr, None)
            if isinstance(inner, nn.Module) or hasattr(inner, "forward_slots"):
                model = inner
                break
        else:
            return model


@dataclass(frozen=True)
class ModelFamily:
    """One variant name's architecture, capabilities and behaviour (subclasses supply behaviour).

    Capabilities:
      causal          decoder slots with causal attention (False: a bidirectional encoder)
      target_position the model is told the position it must predict (sigma-GPT, AO-GPT)
      any_order       reads, scores and generates in orders other than left to right
      ensemble        context-order ensembling (paper Eq. 4) is defined for it
      parallel_steps  generation may reveal several positions per step
      kv_cache        generation keeps a KV cache (O(n) per sequence)
      one_pass_nll    the exact NLL under one order costs one forward (a decoder), not n
      adaptive_order  generation can choose the order from the model's confidence
    """

    name: str
    summary: str
    architecture: Mapping[str, Any]
    default_order: str
    causal: bool = True
    target_position: bool = False
    any_order: bool = False
    ensemble: bool = False
    parallel_steps: bool = False
    kv_cache: bool = False
    one_pass_nll: bool = True
    adaptive_order: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ orders
    def check_order(self, order: Any, where: str = "") -> None:
        """Refuse an order this family cannot read (a spec, a sampler or explicit orders)."""
        if not self.any_order and not is_left_to_right(order):
            shown = order if isinstance(order, str) else getattr(order, "spec", "given")
            raise AOGPTError(f"variant {self.name} reads left to right only (order {shown!r}{where})",
                             "use order l2r")

    # ------------------------------------------------------------------ training and scoring
    def train_loss(self, model: nn.Module, idx: torch.Tensor, order: torch.Tensor,
                   generator: torch.Generator | None) -> torch.Tensor:
        """Per-token training losses (B, n) of a batch read in `order` (drawn by the trainer);
        their mean is what the optimizer minimises. `model` may be a DDP wrapper: call it, so that
        gradients synchronise."""
        raise NotImplementedError

    def order_nll(self, model: nn.Module, idx: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
        """Exact per-step NLL (B, n) under `order` (None: left to right): step i is
        -log p(x[order[:, i]] | x[order[:, :i]])."""
        raise NotImplementedError

    def mc_bound(self, model: nn.Module, idx: torch.Tensor, generator: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """An unbiased estimate (B,) of the any-order bound E_sigma[-log p_sigma(x)] per sequence, and
        the orders it drew (None if it drew none). Default: one uniform order per sequence (drawn on
        the CPU from `generator`), scored exactly."""
        B, n = idx.shape
        sigma = make_order_sampler("uniform").sample(B, n, "cpu", generator).to(idx.device)
        return self.order_nll(model, idx, sigma).double().sum(1), sigma

    def conditional_logits(self, model: nn.Module, idx: torch.Tensor, context: torch.Tensor,
                           targets: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) for the positions `targets` (B, T), each given only the tokens of idx at
        `context` (B, m), read in that order (`aogpt.conditional_logprobs`)."""
        raise NotImplementedError

    def validation_losses(self, model: nn.Module, idx: torch.Tensor, order: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Summed (over the batch) left-to-right NLL and any-order loss under `order` (uniform
        orders from the trainer), or None where the family has no any-order loss."""
        raise NotImplementedError

    # ------------------------------------------------------------------ generation
    def check_generation(self, *, policy: str, counts: Callable[[], list[int]], order: Any,
                         known_positions: torch.Tensor) -> None:
        """Refuse a generation request this family cannot serve (before any work is done)."""
        if is_adaptive(order) and not self.adaptive_order:
            raise AOGPTError(f"variant {self.name} cannot choose its own unmasking order (order {order!r})",
                             "use an any-order model (aogpt, sigma, encoder-mdm), or a fixed order such as l2r")
        if self.parallel_steps:
            return
        if policy != "count":
            raise AOGPTError(f"variant {self.name} generates one token per step, left to right", "use policy count")
        self.check_order(order)
        if max(counts(), default=0) > 1:
            raise AOGPTError(f"variant {self.name} cannot reveal several tokens per step",
                             f"use steps {sum(counts())}")
        if not bool((known_positions.sort().values == torch.arange(known_positions.numel())).all()):
            raise AOGPTError(f"variant {self.name} can only continue a prefix, not fill blanks",
                             "use an aogpt or sigma model")

    @property
    def default_policy(self) -> str:
        """Lemma 4.1's Bernoulli unmasking where several tokens per step are possible, else counts."""
        return "bernoulli" if self.parallel_steps else "count"
