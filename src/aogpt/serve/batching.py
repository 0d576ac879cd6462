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

from aogpt.decode import runner as decode_runner
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

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.tokens.shape[0]), int(self.tokens.shape[1])


class StackedCaches:
    """Stands in for the KV cache of a stacked forward: `attend_rows` splits the rows (R, 3, H, D) back
    into each call's rows, lets the call's own cache write and attend (in the call's own layout, with
    the call's own `cache_pos` and mask), and stacks the outputs again."""

    def __init__(self, calls: list[ForwardCall], conditions: Conditions | None):
        self.calls = calls
        self.conditions = conditions

    def attend_rows(self, layer: int, qkv: torch.Tensor, cache_pos: Any, attn_mask: torch.Tensor | None,
                    scale: float = 1.0) -> torch.Tensor:
        out, start = [], 0
        for call in self.calls:
            B, S = call.shape
            out.append(call.cache.attend_rows(layer, qkv[start:start + B * S], call.cache_pos, call.attn_mask, scale))
            start += B * S
        return torch.cat(out)


def run_together(model: torch.nn.Module, calls: list[ForwardCall], conditions: Conditions | None
                 ) -> list[torch.Tensor]:
    """The logits each call would get from ``model.forward_slots`` on its own, from one stacked
    forward (calls with a KV cache; `conditions`: the adaLN tables every call's cache holds)."""
    tokens, pos, target, select, shapes = [], [], [], [], []
    start = 0
    for call in calls:
        B, S = call.shape
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
    logits = model.forward_slots(torch.cat(tokens)[None], torch.cat(pos)[None], torch.cat(target)[None],
                                 cache=StackedCaches(calls, conditions), cache_pos=0,
                                 select=torch.cat(select)[None])[0]
    out, at = [], 0
    for B, Q in shapes:
        out.append(logits[at:at + B * Q].view(B, Q, -1))
        at += B * Q
    return out


def run_alone(model: torch.nn.Module, call: ForwardCall) -> torch.Tensor:
    """A call without a KV cache (the encoder, or a decoder recomputing every slot): run as it came."""
    return model.forward_slots(call.tokens, call.pos, call.target, attn_mask=call.attn_mask, cache=call.cache,
                               cache_pos=call.cache_pos, select=call.select, conditions=call.conditions)


def row_invariant(model: Any) -> bool:
    """Whether the decode path's linear layers give every row the same bits whatever the number of
    rows multiplied with it, as a step calls them (the premise of `run_together`'s batch invariance),
    on random rows (`aogpt.decode.runner.row_invariant`)."""
    return decode_runner.row_invariant(model)
