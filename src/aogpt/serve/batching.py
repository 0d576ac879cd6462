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

After the forward, each request draws its tokens from its rows of logits with its own uniforms;
`draw_together` makes those draws in one call per sampling configuration: softmax, truncation,
cumulative sums and the search act on each row alone, so a row's token does not depend on the rows
beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from aogpt.attention import attend_few
from aogpt.decode import runner as decode_runner
from aogpt.kv_cache import Conditions, KVCache
from aogpt.sampling import SamplingConfig, sample_tokens


@dataclass(slots=True)
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
    gate: torch.Tensor | None = None  # a gated model's slots through its pathway (`aogpt.pathway`)
    shape: tuple[int, int] = field(init=False)  # (B, S): sequences, slots per sequence

    def __post_init__(self) -> None:
        self.shape = (int(self.tokens.shape[0]), int(self.tokens.shape[1]))


class StackedCaches:
    """Stands in for the KV cache of a stacked forward: `attend_rows` splits the rows (R, 3, H, D) back
    into each call's rows, lets the call's own cache write and attend (in the call's own layout, with
    the call's own `cache_pos` and mask), and stacks the outputs again."""

    def __init__(self, calls: list[ForwardCall], conditions: Conditions | None):
        self.calls = calls
        self.conditions = conditions

    def attend_rows(self, layer: int, qkv: torch.Tensor, cache_pos: Any, attn_mask: torch.Tensor | None,
                    scale: float = 1.0) -> torch.Tensor:
        """The decode step's attention (`KVCache.attend_rows`): each call's rows (R, 3, H, D), in the
        call's own row order, through the call's own cache; the outputs stacked again.

        The usual call, one sequence whose rows go to consecutive columns, is `KVCache.attend_rows`'s
        own step written out (`_attend_one`): the same writes and the same attention call on the same
        views (so the same bits), without the per-call layout work around them; its output joins the
        others' in one copy. At sixteen requests a step this took a fifth off the attention's time."""
        out, start, H, D = [], 0, qkv.shape[2], qkv.shape[3]
        for call in self.calls:
            B, S = call.shape
            rows = qkv[start:start + B * S]
            if (B == 1 and type(call.cache_pos) is int and rows.dtype == call.cache.kv.dtype
                    and (call.attn_mask is None or call.attn_mask.dtype == rows.dtype)):
                out.append(self._attend_one(layer, rows, call, scale))  # (S, H, D), a view
            else:
                out.append(call.cache.attend_rows(layer, rows, call.cache_pos, call.attn_mask, scale).view(B * S, H, D))
            start += B * S
        return torch.cat(out).view(-1, H * D)

    @staticmethod
    def _attend_one(layer: int, rows: torch.Tensor, call: ForwardCall, scale: float) -> torch.Tensor:
        """`KVCache.attend_rows` for one sequence's S rows (S, 3, H, D) at columns c .. c + S - 1 (in
        the cache's dtype): keys and values written there, the queries attend with the cache's
        kernel over the mask's span; returns the output as (S, H, D) (a transposed view)."""
        cache, c, mask = call.cache, call.cache_pos, call.attn_mask
        S = rows.shape[0]
        kv = cache.kv[layer]  # (2, 1, H, capacity, D)
        kv[:, 0, :, c:c + S] = rows[:, 1:].permute(1, 2, 0, 3)
        span = mask.shape[-1] if mask is not None else c + S
        y = attend_few(rows[:, 0].transpose(0, 1)[None], kv[0, :, :, :span], kv[1, :, :, :span], mask,
                       cache.kernel, scale)
        return y[0].transpose(0, 1)


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


@dataclass(slots=True)
class DrawCall:
    """The arguments of one request's token draw (`aogpt.sampling.sample_tokens`) after a step."""

    logits: torch.Tensor  # (R, V)
    cfg: SamplingConfig
    uniforms: torch.Tensor | None  # (R, 1), the request's own stream's; None: greedy


def draw_together(calls: list[DrawCall]) -> list[torch.Tensor | Exception]:
    """Each call's tokens, what ``sample_tokens(logits, cfg, uniforms=uniforms)`` gives it alone, from
    one call per sampling configuration over all their rows: every operation of a draw acts on each
    row alone (softmax, truncation, cumulative sums, the search), so a row's token does not depend on
    the rows beside it. A failing group hands its exception to its calls."""
    out: list[torch.Tensor | Exception] = [None] * len(calls)  # type: ignore[list-item]
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(calls):
        groups.setdefault((c.cfg, c.logits.dtype, c.logits.shape[-1], c.uniforms is None), []).append(i)
    for members in groups.values():
        first = calls[members[0]]
        try:
            if len(members) == 1:
                out[members[0]] = sample_tokens(first.logits, first.cfg, uniforms=first.uniforms)
                continue
            logits = torch.cat([calls[i].logits for i in members])
            u = None if first.uniforms is None else torch.cat([calls[i].uniforms.reshape(-1, 1) for i in members])
            tokens = sample_tokens(logits, first.cfg, uniforms=u).split([calls[i].logits.shape[0] for i in members])
            for i, t in zip(members, tokens, strict=True):
                out[i] = t
        except Exception as exc:  # handed to the jobs, which report it
            for i in members:
                out[i] = exc
    return out


def run_alone(model: torch.nn.Module, call: ForwardCall) -> torch.Tensor:
    """A call without a KV cache (the encoder, or a decoder recomputing every slot): run as it came."""
    extra = {} if call.gate is None else {"gate": call.gate}
    return model.forward_slots(call.tokens, call.pos, call.target, attn_mask=call.attn_mask, cache=call.cache,
                               cache_pos=call.cache_pos, select=call.select, conditions=call.conditions, **extra)


def row_invariant(model: Any) -> bool:
    """Whether the decode path's linear layers give every row the same bits whatever the number of
    rows multiplied with it, as a step calls them (the premise of `run_together`'s batch invariance),
    on random rows (`aogpt.decode.runner.row_invariant`)."""
    return decode_runner.row_invariant(model)
