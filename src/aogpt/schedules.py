"""Unmasking schedules: how many masked positions each of the T generation steps reveals.

Two policies (docs/design.md, paper Eq. 5 and Lemma 4.1):

- ``count``: a deterministic number per step, the same for every sequence (the reference code's
  rule). With u positions to generate, the number revealed after step k is ``floor(u * (1 - t_k))``
  on the time grid below, i.e. for the linear grid the differences of ``floor(u * k / T)``
  (u = 32, T = 5 gives [6, 6, 7, 6, 7], as the fixture pins). Steps may reveal 0 positions (T > u,
  or the start of the cosine grid); such steps cost nothing.
- ``bernoulli``: the masked-diffusion reverse process. Going from time t to s < t, every still-masked
  position is revealed independently with probability (t - s) / t (Lemma 4.1: draw the Bernoulli
  first, evaluate the model only where it fired). Per-sequence counts therefore differ and follow
  Binomial(still masked, (t - s) / t). The last step goes to s = 0, so everything is revealed.

Time grids (t_0 = 1 down to t_T = 0): ``linear`` t_k = 1 - k / T; ``cosine`` t_k = cos(pi/2 * k / T)
(MaskGIT's masking ratio: few tokens early, many late).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from aogpt.errors import AOGPTError, check_choice

POLICIES = ("bernoulli", "count")
SCHEDULES = ("linear", "cosine")


def time_grid(steps: int, schedule: str = "linear") -> list[float]:
    """t_0 = 1 > t_1 >= ... > t_T = 0 (exactly 1 and 0 at the ends)."""
    check_choice("schedule", schedule, SCHEDULES)
    if steps < 1:
        raise AOGPTError(f"steps must be >= 1, got {steps}", "use at least one step")
    if schedule == "linear":
        grid = [1.0 - k / steps for k in range(steps + 1)]
    else:
        grid = [math.cos(math.pi / 2 * k / steps) for k in range(steps + 1)]
    grid[0], grid[-1] = 1.0, 0.0
    return grid


def count_schedule(total: int, steps: int, schedule: str = "linear") -> list[int]:
    """Deterministic positions revealed per step; sums to `total`."""
    check_choice("schedule", schedule, SCHEDULES)
    if steps < 1:
        raise AOGPTError(f"steps must be >= 1, got {steps}", "use at least one step")
    if schedule == "linear":  # integer arithmetic: no rounding surprises at k = T
        cumulative = [total * k // steps for k in range(steps + 1)]
    else:
        grid = time_grid(steps, schedule)
        cumulative = [min(total, math.floor(total * (1.0 - t) + 1e-9)) for t in grid]  # 1e-9: cos(pi/3) != 0.5
        cumulative[-1] = total
    return [b - a for a, b in zip(cumulative[:-1], cumulative[1:], strict=True)]


def unmask_probabilities(steps: int, schedule: str = "linear") -> list[float]:
    """(t - s) / t for every step of the grid: the chance a still-masked position is revealed."""
    grid = time_grid(steps, schedule)
    return [(t - s) / t for t, s in zip(grid[:-1], grid[1:], strict=True)]


def bernoulli_counts(masked: np.ndarray, prob: float, uniforms: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Number of revealed positions per sequence: one Bernoulli(prob) per still-masked position.

    masked: (B,) still-masked counts. `uniforms(seqs)` returns one float64 uniform per entry of
    `seqs` (sequence b listed masked[b] times; each sequence's own stream, `aogpt.generation.streams`).
    Literally Lemma 4.1's first stage, so the counts are exactly Binomial(masked, prob); prob 1
    reveals everything.
    """
    masked = np.asarray(masked, dtype=np.int64)
    if prob >= 1.0:
        return masked.copy()
    if prob <= 0.0 or not masked.any():
        return np.zeros_like(masked)
    seqs = np.repeat(np.arange(len(masked)), masked)
    fired = uniforms(seqs) < prob
    return np.bincount(seqs[fired], minlength=len(masked)).astype(np.int64)
