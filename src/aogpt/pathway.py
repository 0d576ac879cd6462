"""A gated pathway: any order added to a left-to-right model without changing it (docs/adapt.md).

A model adapted from a left-to-right source (`aogpt.adaptation`) with ``pathway = "gated"``
(`ModelConfig.pathway`) keeps the source's weights frozen and adds a new pathway: a delta for every
linear layer of the blocks (`DeltaLinear`: low rank, ``B A``, or full rank), AO-GPT's adaLN
modulation (or sigma-GPT's target table at the input) and the target table. Each slot has a gate
(`aogpt.orders.gates`): 0 when the order so far is the identity (the slot reads left to right), 1
otherwise. Every new parameter enters multiplied by the gate, so

- a slot with gate 0 is computed by the source's weights alone, exactly as the source computes it:
  its norms with their own affine part, its linear layers ``W x + b``, nothing of the pathway (the
  pathway's parameters are not read at all, so no value of theirs, trained or not, reaches it);
- a slot with gate 1 is computed by the source plus the pathway: linear layers ``(W + dW) x + b``,
  norms modulated per target position (``norm(x) (1 + scale) + shift``, residual branches scaled by
  ``1 + gate``), the target table.

In exact arithmetic this is ``W x + g dW x`` with g in {0, 1}; computed this way the gate-0 rows
never meet the pathway (a multiplication by zero would still read it) and a step costs one matrix
product per layer and row, as the source does, not two. The rows of a forward are split by gate
(`RowSplit`) wherever they are computed row by row, and meet in attention, where every slot reads
the keys and values of the slots before it: a left-to-right slot's keys and values are the
source's, so the KV cache of a left-to-right read is the source's cache.

The forward itself is the model's (`aogpt.model.Transformer.forward_slots` passes the split to every
`aogpt.model.Block`, whose two halves each group goes through); this module holds the parts: the
delta layers, the split, which weights are the pathway's, and `side`, the one place a row's group
picks its weights.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

PATHWAYS = ("shared", "gated")  # `ModelConfig.pathway`: every slot through the same weights, or gated by the order
DELTA_NAMES = ("delta", "delta_down", "delta_up")  # `DeltaLinear`'s parameters


class DeltaLinear(nn.Linear):
    """A source linear layer (``weight``, ``bias``: frozen) and its trainable delta: ``delta_up @
    delta_down`` of rank `rank`, or a full matrix ``delta`` (rank 0). ``forward(x)`` is the source's
    ``W x + b``; ``forward(x, pathway=True)`` is ``(W + dW) x + b``. The delta starts at zero (the
    up-projection or the full matrix), so at step 0 both forms are the source's function. The
    down-projection is drawn with std sqrt(in_features) / rank: under Adam every entry of the
    up-projection moves by about the learning rate a step, so a step moves ``dW x`` by about lr x
    rank x E|A x|, against lr x in_features x E|x| for a full-rank delta; this draw makes the two
    equal (for a normalised x), so one learning rate serves every rank."""

    def __init__(self, in_features: int, out_features: int, bias: bool, rank: int):
        super().__init__(in_features, out_features, bias=bias)
        self.rank = rank
        if rank:
            self.delta_down = nn.Parameter(torch.empty(rank, in_features))
            self.delta_up = nn.Parameter(torch.zeros(out_features, rank))
        else:
            self.delta = nn.Parameter(torch.zeros(out_features, in_features))
        self._kept: tuple[tuple, torch.Tensor] | None = None
        self.reset_delta()

    @torch.no_grad()
    def reset_delta(self) -> None:
        if self.rank:
            nn.init.normal_(self.delta_down, 0.0, math.sqrt(self.in_features) / self.rank)
            nn.init.zeros_(self.delta_up)
        else:
            nn.init.zeros_(self.delta)

    def deltas(self) -> list[nn.Parameter]:
        return [self.delta_up, self.delta_down] if self.rank else [self.delta]

    def delta_weight(self) -> torch.Tensor:
        return self.delta_up @ self.delta_down if self.rank else self.delta

    def pathway_weight(self) -> torch.Tensor:
        """W + dW. Without gradients it is kept and reused until a weight changes (an optimizer step,
        a load bumps the version), so decode steps do not rebuild it."""
        parts = [self.weight, *self.deltas()]
        if torch.is_grad_enabled() and any(p.requires_grad for p in parts):
            return self.weight + self.delta_weight()
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in parts)
        if self._kept is None or self._kept[0] != key:
            with torch.no_grad():
                self._kept = (key, (self.weight + self.delta_weight()).detach())
        return self._kept[1]

    def forward(self, x: torch.Tensor, pathway: bool = False) -> torch.Tensor:
        if not pathway:
            return F.linear(x, self.weight, self.bias)
        return F.linear(x, self.pathway_weight(), self.bias)

    def pathway_linear(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The layer as the pathway's rows compute it, x -> (W + dW) x + b (`side`)."""
        return functools.partial(self.forward, pathway=True)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", delta rank={self.rank or 'full'}"


def is_gated(model: object) -> bool:
    """Whether a model (or a decode runner: anything with a ``config``) has a gated pathway."""
    return getattr(getattr(model, "config", None), "pathway", "shared") == "gated"


def linear(cfg, in_features: int, out_features: int, bias: bool) -> nn.Linear:
    """A block's linear layer: plain, or with a gated delta when the model's pathway is gated."""
    if getattr(cfg, "pathway", "shared") == "gated":
        return DeltaLinear(in_features, out_features, bias, cfg.pathway_rank)
    return nn.Linear(in_features, out_features, bias=bias)


def side(layer: Any, pathway: bool) -> Any:
    """The linear layer a group of rows computes with: `layer` itself for the source's rows (its W),
    its ``pathway_linear()`` for the pathway's (W + dW: a `DeltaLinear`'s, or in the fast decode path
    the kernel of the merged weight, `aogpt.decode.gated.GatedKernel`). Either is called like the
    layer, so `aogpt.backbone.linear_gelu` and `project` take it as they take any linear layer."""
    return layer.pathway_linear() if pathway else layer


def is_pathway(name: str) -> bool:
    """Whether a parameter (by its name in a `Transformer`) belongs to a gated model's pathway: the
    deltas, the adaLN layers and the target tables; the rest is the source's, frozen."""
    last = name.rpartition(".")[2]
    return last in DELTA_NAMES or "adaLN" in name or "wtpe" in name


def freeze_source(model: nn.Module) -> None:
    """Every parameter outside the pathway stops requiring gradients: the optimizer holds no state for
    them, the EMA leaves them as they are, and no step can change the source."""
    for name, p in model.named_parameters():
        p.requires_grad_(is_pathway(name))


class RowSplit:
    """The rows of a forward (B, S) split by gate: ``source`` rows (gate 0) and ``pathway`` rows (gate
    1). `split` takes a (B, S, ...) tensor to the two groups' rows ((R0, ...), (R1, ...); a group
    without rows is None), `join` puts them back. A row is computed the same way whichever rows share
    its forward (the premise of batch invariance): always as one of the (R, ...) rows of its group;
    when every row is in one group those are a view of the tensor, nothing gathered or copied."""

    def __init__(self, gate: torch.Tensor, pure: str | None = None):
        """`pure`: the group every row is known to be in (the rows picked from a pure split), so that
        nothing is counted; None: counted from `gate`."""
        self.shape = tuple(gate.shape)
        flat = gate.reshape(-1).bool()
        if pure is None:
            n_path = int(flat.sum())
            pure = "pathway" if n_path == flat.numel() else "source" if n_path == 0 else None
        self.pure = pure
        if self.pure is None:
            self.source_rows = (~flat).nonzero().squeeze(1)
            self.pathway_rows = flat.nonzero().squeeze(1)

    @property
    def has_source(self) -> bool:
        return self.pure != "pathway"

    @property
    def has_pathway(self) -> bool:
        return self.pure != "source"

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """`x` (B, S, ...) as rows (B * S, ...)."""
        return x.reshape(-1, *x.shape[len(self.shape):])

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        flat = self.rows(x)
        if self.pure == "source":
            return flat, None
        if self.pure == "pathway":
            return None, flat
        return flat.index_select(0, self.source_rows), flat.index_select(0, self.pathway_rows)

    def join(self, source: torch.Tensor | None, pathway: torch.Tensor | None) -> torch.Tensor:
        if self.pure is not None:
            rows = source if self.pure == "source" else pathway
            return rows.view(*self.shape, *rows.shape[1:])
        rows = source.shape[0] + pathway.shape[0]
        dtype = torch.promote_types(source.dtype, pathway.dtype)
        out = source.new_empty((rows, *source.shape[1:]), dtype=dtype)
        out = out.index_copy(0, self.source_rows, source.to(dtype)).index_copy(0, self.pathway_rows, pathway.to(dtype))
        return out.view(*self.shape, *source.shape[1:])

    def select(self, values: torch.Tensor) -> torch.Tensor:
        """The pathway rows of a per-row tensor (B, S, ...)."""
        flat = self.rows(values)
        return flat if self.pure == "pathway" else flat.index_select(0, self.pathway_rows)


__all__ = ["DELTA_NAMES", "PATHWAYS", "DeltaLinear", "RowSplit", "freeze_source", "is_gated", "is_pathway", "linear",
           "side"]
