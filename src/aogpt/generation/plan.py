"""The plan of a generation: along which chain order, and how many positions each step reveals.

Under the count schedules and Lemma 4.1 neither depends on the sampled tokens, so the whole plan is
drawn before the model runs (docs/design.md, "Sampling the reverse process"):

- the chain order of every sequence: its known positions first (ascending), then the positions to
  generate in the unmasking order (`aogpt.orders`: a spec such as ``random`` or ``l2r``, or
  explicit permutations);
- a (B, T) table of how many positions each sequence reveals at each step (`step_counts`): the
  same deterministic counts for every sequence (``count``), or per-sequence Binomial counts
  (``bernoulli``: every still-masked position fires with probability (t - s) / t).

Orders and counts come from each sequence's own ``order`` and ``plan`` streams
(`aogpt.generation.streams`), tokens from its ``tokens`` stream, so a seed gives every sequence
the same plan on every device, in every batch size and on every decode path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from aogpt.generation.streams import SequenceStreams
from aogpt.orders import OrderSampler, check_permutation, make_order_sampler
from aogpt.schedules import count_schedule, unmask_probabilities


def resolve_order(order: Any, num_samples: int, n: int) -> OrderSampler | torch.Tensor:
    """An unmasking order as a sampler (a spec, default uniform) or checked explicit orders (N, n)."""
    if order is None or isinstance(order, (str, OrderSampler)):
        return make_order_sampler(order or "uniform")
    return check_permutation(order, n, rows=num_samples).expand(num_samples, n)


def base_orders(order: OrderSampler | torch.Tensor, start: int, batch: int, n: int,
                streams: SequenceStreams) -> torch.Tensor:
    """The unmasking orders (batch, n) of sequences start .. start + batch - 1 (CPU), each drawn
    from its own ``order`` stream."""
    if isinstance(order, torch.Tensor):
        return order[start:start + batch]
    return torch.cat([order.sample(1, n, "cpu", streams.generator(b)) for b in range(batch)])


def chain_orders(base: torch.Tensor, known_mask: torch.Tensor) -> torch.Tensor:
    """Known positions first (ascending), then the other entries of `base` (B, n) in their order."""
    B, n = base.shape
    idx = torch.arange(n, device=base.device).expand(B, n)
    key = torch.where(known_mask[base], base - n, idx)  # known: negative keys, ascending by position
    return base.gather(1, key.argsort(dim=1, stable=True))


def step_counts(policy: str, schedule: str, steps: int, masked: int, batch: int,
                streams: SequenceStreams) -> np.ndarray:
    """(batch, T) positions revealed per step (module docstring); Bernoulli draws from each
    sequence's ``plan`` stream."""
    if policy == "count":
        return np.tile(np.asarray(count_schedule(masked, steps, schedule), dtype=np.int64), (batch, 1))
    return _bernoulli_steps(masked, unmask_probabilities(steps, schedule), batch, streams)


def _bernoulli_steps(masked: int, probs: list[float], batch: int, streams: SequenceStreams,
                     block: int = 8) -> np.ndarray:
    """`bernoulli_counts` at every step (Lemma 4.1: each still-masked position fires with the step's
    probability), each sequence's uniforms taken in order from its ``plan`` stream: the very draws of
    calling it step by step with ``streams.uniforms``, read `block` x masked at a time
    (`SequenceStreams.ahead`) instead of with one stream call per step, which cost more than the whole
    rest of a one-sequence plan."""
    if batch == 1:
        return _bernoulli_one(masked, probs, streams, block)[None]
    left = np.full(batch, masked, dtype=np.int64)
    out = np.zeros((batch, len(probs)), dtype=np.int64)
    used = np.zeros(batch, dtype=np.int64)  # words of the block taken so far, per sequence
    ahead = np.empty((batch, 0))
    for t, p in enumerate(probs):
        if p >= 1.0:  # as bernoulli_counts: everything, and no draw
            out[:, t], left = left, np.zeros_like(left)
            continue
        if p <= 0.0 or not left.any():
            continue
        need = used + left
        if need.max() > ahead.shape[1]:
            streams.advance("plan", used)
            used, need = np.zeros_like(used), left.copy()
            ahead = streams.ahead("plan", max(block * masked, int(left.max())))
        lo, hi = int(used.min()), int(need.max())
        cols = np.arange(lo, hi)
        fired = (ahead[:, lo:hi] < p) & (cols >= used[:, None]) & (cols < need[:, None])
        out[:, t] = fired.sum(axis=1)
        left -= out[:, t]
        used = need
    streams.advance("plan", used)
    return out


def _bernoulli_one(masked: int, probs: list[float], streams: SequenceStreams, block: int) -> np.ndarray:
    """`_bernoulli_steps` for one sequence (every served request), in plain integers: the same draws
    and counts, a few microseconds a step instead of a dozen array operations."""
    out = np.zeros(len(probs), dtype=np.int64)
    left, used, ahead = masked, 0, np.empty(0)
    for t, p in enumerate(probs):
        if p >= 1.0:
            out[t], left = left, 0
            continue
        if p <= 0.0 or left == 0:
            continue
        if used + left > len(ahead):
            streams.advance("plan", np.array([used]))
            used, ahead = 0, streams.ahead("plan", max(block * masked, left))[0]
        k = int(np.count_nonzero(ahead[used:used + left] < p))
        out[t] = k
        used += left
        left -= k
    streams.advance("plan", np.array([used]))
    return out
