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
"""

from __future__ import annotations

import math
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


def call(module: nn.Module, x: torch.Tensor, pathway: bool) -> torch.Tensor:
    """`module(x)` with the source's weights, or with the pathway's (a `DeltaLinear`'s W + dW)."""
    return module(x, True) if pathway else module(x)


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

    def __init__(self, gate: torch.Tensor):
        self.shape = tuple(gate.shape)
        flat = gate.reshape(-1).bool()
        n_path = int(flat.sum())
        self.pure = "pathway" if n_path == flat.numel() else "source" if n_path == 0 else None
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


# ------------------------------------------------------------------ a gated model's forward (`aogpt.model`)
def block_forward(block: nn.Module, parts: tuple[torch.Tensor | None, torch.Tensor | None], cond: Any,
                  split: RowSplit, attn_mask: Any, cache: Any, cache_pos: Any = None, rope: Any = None,
                  kernel: str = "auto") -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """A gated model's block (`aogpt.model.Block`): `parts` are the rows of the source's slots and of the
    pathway's (`split`); the source's are computed by its own norms and weights, exactly as the source's
    block computes them, the pathway's by the modulated norms (`cond`: their adaLN rows; sigma-GPT: none)
    and W + dW. They meet in attention only."""
    x0, x1 = parts
    if callable(cond):
        cond = cond(block)
    h0 = None if x0 is None else block.ln_1(x0)
    h1 = None
    if x1 is not None:
        if block.adaptive:
            shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = cond if isinstance(cond, tuple) else cond.chunk(6, -1)
            h1 = block.ln_1.modulate(x1, shift_a, scale_a)
        else:
            h1 = block.ln_1(x1)
    attn = block.attn
    qkv = split.join(None if h0 is None else attn.c_attn(h0), None if h1 is None else attn.c_attn(h1, True))
    y0, y1 = split.split(attn.mix(qkv, attn_mask, cache, cache_pos, rope, kernel))
    if x0 is not None:
        x0 = x0 + attn.resid_dropout(attn.c_proj(y0))
        x0 = x0 + block.mlp(block.ln_2(x0))
    if x1 is not None:
        a1 = attn.resid_dropout(attn.c_proj(y1, True))
        if block.adaptive:
            x1 = torch.addcmul(x1, gate_a, a1)
            x1 = torch.addcmul(x1, gate_m, block.mlp(block.ln_2.modulate(x1, shift_m, scale_m), True))
        else:
            x1 = x1 + a1
            x1 = x1 + block.mlp(block.ln_2(x1), True)
    return x0, x1


def gated_forward(model: nn.Module, x: torch.Tensor, target: torch.Tensor, gate: torch.Tensor, attn_mask: Any,
                  cache: Any, cache_pos: Any, select: torch.Tensor | None, conditions: Any, rope: Any,
                  kernel: str) -> torch.Tensor:
    """`Transformer.forward_slots` of a gated model from its embedded slots `x` (the source's embedding): the
    source's slots (gate 0) and the pathway's (gate 1) apart wherever rows are computed one by one,
    together in attention (module docstring)."""
    cfg, tr = model.config, model.transformer
    target = target.expand(gate.shape)
    split = RowSplit(gate)
    x0, x1 = split.split(x)
    conds: list[Any] = [None] * len(tr.h)
    if split.has_pathway:
        wanted = split.select(target)
        if cfg.target == "input":
            x1 = x1 + F.embedding(wanted, F.pad(tr.wtpe.weight, (0, 0, 0, 1)))  # `aogpt.model.embed_target`
        else:
            conds = model._block_conditions(wanted, conditions)
    for block, cond in zip(tr.h, conds, strict=True):
        x0, x1 = block_forward(block, (x0, x1), cond, split, attn_mask, cache, cache_pos, rope, kernel)
    x = split.join(x0, x1)
    if select is not None:
        x = x.gather(1, select.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        target, gate = target.gather(1, select), gate.gather(1, select)
        split = RowSplit(gate)
    h0, h1 = split.split(x)
    if cfg.target == "adaln":
        final = tr.final_layer
        h0 = None if h0 is None else final.ln_f(h0)
        if h1 is not None:
            table = None if conditions is None else conditions.final
            h1 = final(h1, model._adaptive(final, split.select(target), table))
    else:
        h0, h1 = (None if h is None else tr.ln_f(h) for h in (h0, h1))
    return model.lm_head(split.join(h0, h1))


__all__ = ["DELTA_NAMES", "PATHWAYS", "DeltaLinear", "RowSplit", "block_forward", "call", "freeze_source",
           "gated_forward", "is_gated", "is_pathway", "linear"]
