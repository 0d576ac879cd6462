"""One forward for the steps of many requests at once, row for row what each would compute alone.

Every request decodes with the library's own samplers (`aogpt.generate`), which call
``model.forward_slots(tokens, pos, target, attn_mask=..., cache=..., cache_pos=..., select=...)``
once per step with their own static KV cache. The engine collects the calls that are waiting at a
step (`ForwardCall`) and runs them as one forward (`run_together`):

- the slots of all calls are laid end to end in one row dimension (input (1, R)), so the
  embeddings, every linear layer, the norms and the output head run once, on exactly the real rows;
- attention is the only operation that mixes rows. `StackedCaches` hands each call's rows, in the
  call's own layout, to the call's own cache with the call's own `cache_pos` and mask: the very
  attention call the request makes when it decodes alone (same shapes, same strides, same kernel),
  and lays the outputs end to end again.

Why this is batch-invariant (docs/serve.md): a row's result then depends only on that row (and, in
attention, on its own request), provided the row-wise kernels do not change their arithmetic with
the number of rows. Elementwise operations and row reductions do not; matrix products are the
risk: the CPU's default GEMM (MKL) rounds a row differently at 1, 2..8 and 9+ rows, while oneDNN
with a weight packed once (`aogpt.inference`, the default decode path of `generate` on the CPU)
reduces every row in the same order whatever the row count. `row_invariant` checks that at start-up.
Attention over one padded batch would not be invariant: its kernel reduces over the batch's longest
span, which depends on the other requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from aogpt.inference import DECODE_PATH
from aogpt.kv_cache import Conditions, KVCache


@dataclass
class ForwardCall:
    """The arguments of one request's ``forward_slots`` call (cache given: a KV-cache step)."""

    tokens: torch.Tensor
    pos: torch.Tensor
    target: torch.Tensor | None
    attn_mask: torch.Tensor | None
    cache: KVCache | None
    cache_pos: Any
    select: torch.Tensor | None
    conditions: Conditions | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    gate: torch.Tensor | None = None  # a gated model's slots through its pathway (`aogpt.pathway`)

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.tokens.shape[0]), int(self.tokens.shape[1])


class StackedCaches:
    """Stands in for the KV cache of a stacked forward: `attend` splits the rows (1, H, R, D) back
    into each call's (B, H, S, D), lets the call's own cache write and attend, and stacks the outputs."""

    def __init__(self, calls: list[ForwardCall], conditions: Conditions | None):
        self.calls = calls
        self.conditions = conditions

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_pos: Any,
               attn_mask: torch.Tensor | None) -> torch.Tensor:
        out, start = [], 0
        for call in self.calls:
            B, S = call.shape
            rows = slice(start, start + B * S)
            if B == 1:  # a packed step, or one sequence: its rows as they are
                y = call.cache.attend(layer, q[:, :, rows], k[:, :, rows], v[:, :, rows], call.cache_pos,
                                      call.attn_mask)
                out.append(y[0])
            else:
                q_c, k_c, v_c = (t[0, :, rows].unflatten(1, (B, S)).transpose(0, 1) for t in (q, k, v))
                y = call.cache.attend(layer, q_c, k_c, v_c, call.cache_pos, call.attn_mask)
                out.append(y.transpose(0, 1).flatten(1, 2))
            start += B * S
        return torch.cat(out, dim=1)[None]

    def attend_rows(self, layer: int, qkv: torch.Tensor, cache_pos: Any, attn_mask: torch.Tensor | None
                    ) -> torch.Tensor:
        """The fast decode path's attention (`KVCache.attend_rows`): each call's rows (R, 3, H, D), in
        the call's own row order, through the call's own cache; the outputs stacked again."""
        out, start = [], 0
        for call in self.calls:
            B, S = call.shape
            out.append(call.cache.attend_rows(layer, qkv[start:start + B * S], call.cache_pos, call.attn_mask))
            start += B * S
        return torch.cat(out)


def run_together(model: torch.nn.Module, calls: list[ForwardCall], conditions: Conditions | None
                 ) -> list[torch.Tensor]:
    """The logits each call would get from ``model.forward_slots`` on its own, from one stacked
    forward (calls with a KV cache; `conditions`: the adaLN tables every call's cache holds)."""
    tokens, pos, target, select, shapes, gates = [], [], [], [], [], []
    start = 0
    for call in calls:
        B, S = call.shape
        if call.gate is not None:  # row for row, like the slots: each row's gate is its own
            gates.append(call.gate.expand(B, S).reshape(-1))
        tokens.append(call.tokens.reshape(-1))
        pos.append(call.pos.reshape(-1))
        tgt = call.target if call.target is not None else torch.full_like(call.pos, model.config.block_size)
        target.append(tgt.reshape(-1))
        if call.select is None:  # every slot's logits
            select.append(torch.arange(start, start + B * S, device=call.tokens.device))
            shapes.append((B, S))
        else:  # call.select (B, Q) indexes each sequence's S slots
            offsets = torch.arange(start, start + B * S, S, device=call.tokens.device)[:, None] if B > 1 else start
            select.append((call.select + offsets).reshape(-1))
            shapes.append((B, call.select.shape[1]))
        start += B * S
    if gates and len(gates) != len(calls):
        raise ValueError("a stacked forward needs every call's gates or none")
    extra = {"gate": torch.cat(gates)[None]} if gates else {}
    logits = model.forward_slots(torch.cat(tokens)[None], torch.cat(pos)[None], torch.cat(target)[None],
                                 cache=StackedCaches(calls, conditions), cache_pos=0,
                                 select=torch.cat(select)[None], **extra)[0]
    out, at = [], 0
    for B, Q in shapes:
        out.append(logits[at:at + B * Q].view(B, Q, -1))
        at += B * Q
    return out


def run_alone(model: torch.nn.Module, call: ForwardCall) -> torch.Tensor:
    """A call without a KV cache (the encoder, or a decoder recomputing every slot): run as it came."""
    extra = {} if call.gate is None else {"gate": call.gate}
    return model.forward_slots(call.tokens, call.pos, call.target, attn_mask=call.attn_mask, cache=call.cache,
                               cache_pos=call.cache_pos, select=call.select, conditions=call.conditions, **extra)


def row_invariant(model: Any, rows: tuple[int, ...] = (1, 2, 5, 9, 17, 40)) -> bool:
    """Whether the decode path's linear layers give every row the same bits whatever the number of
    rows multiplied with it (the premise of `run_together`'s batch invariance), on random rows. The
    fast decode path checks its own kernels, as it calls them (`SmallStepModel.row_invariant`)."""
    if hasattr(model, "row_invariant"):
        return model.row_invariant()
    gen = torch.Generator().manual_seed(0)
    linears = [m for name, m in model.named_modules() if name.endswith(DECODE_PATH)]
    p = next(model.parameters())
    with torch.inference_mode():
        for layer in linears:
            x = torch.randn(max(rows), layer.in_features, generator=gen).to(device=p.device, dtype=p.dtype)
            for pathway in (False, True) if getattr(layer, "gated", False) else (False,):  # both weights
                alone = torch.cat([layer(x[i:i + 1], *[True] * pathway) for i in range(max(rows))])
                if any(not torch.equal(layer(x[:r], *[True] * pathway), alone[:r]) for r in rows):
                    return False
    return True
