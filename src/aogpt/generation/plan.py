"""The plan of a generation: along which chain order, and how many positions each step reveals.

Under the count schedules and Lemma 4.1 neither depends on the sampled tokens, so the whole plan is
drawn before the model runs (docs/design.md, "Sampling the reverse process"):

- the chain order of every sequence: its known positions first (ascending), then the positions to
  generate in the unmasking order (`aogpt.orders`: a spec such as ``random`` or ``l2r``, or
  explicit permutations);
- a (B, T) table of how many positions each sequence reveals at each step (`step_counts`): the
  same deterministic counts for every sequence (``count``), or per-sequence Binomial counts
  (``bernoulli``: every still-masked position fires with probability (t - s) / t).

Orders and counts come from the plan generator (CPU), tokens from another stream, so a seed gives
the same plan on every device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from aogpt.orders import OrderSampler, check_permutation, make_order_sampler
from aogpt.schedules import bernoulli_counts, count_schedule, unmask_probabilities


def resolve_order(order: Any, num_samples: int, n: int) -> OrderSampler | torch.Tensor:
    """An unmasking order as a sampler (a spec, default uniform) or checked explicit orders (N, n)."""
    if order is None or isinstance(order, (str, OrderSampler)):
        return make_order_sampler(order or "uniform")
    return check_permutation(order, n, rows=num_samples).expand(num_samples, n)


def base_orders(order: OrderSampler | torch.Tensor, start: int, batch: int, n: int,
                generator: torch.Generator) -> torch.Tensor:
    """The unmasking orders (batch, n) of sequences start .. start + batch - 1 (CPU)."""
    if isinstance(order, torch.Tensor):
        return order[start:start + batch]
    return order.sample(batch, n, "cpu", generator)


def chain_orders(base: torch.Tensor, known_mask: torch.Tensor) -> torch.Tensor:
    """Known positions first (ascending), then the other entries of `base` (B, n) in their order."""
    B, n = base.shape
    idx = torch.arange(n, device=base.device).expand(B, n)
    key = torch.where(known_mask[base], base - n, idx)  # known: negative keys, ascending by position
    return base.gather(1, key.argsort(dim=1, stable=True))


def step_counts(policy: str, schedule: str, steps: int, masked: int, batch: int,
                generator: torch.Generator) -> np.ndarray:
    """(batch, T) positions revealed per step (module docstring)."""
    if policy == "count":
        return np.tile(np.asarray(count_schedule(masked, steps, schedule), dtype=np.int64), (batch, 1))
    left = torch.full((batch,), masked, dtype=torch.long)
    out = []
    for p in unmask_probabilities(steps, schedule):
        k = bernoulli_counts(left, p, generator)
        out.append(k)
        left = left - k
    return torch.stack(out, dim=1).numpy()
