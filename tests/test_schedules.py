"""Unmasking schedules: the reference's count rule, time grids, Bernoulli counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from aogpt.errors import AOGPTError
from aogpt.schedules import bernoulli_counts, count_schedule, time_grid, unmask_probabilities
from tests.helpers import reference_expected


def pooled_chi2(observed: np.ndarray, expected: np.ndarray) -> float:
    """Chi-square p-value, cells with expected count < 5 pooled into one."""
    keep = expected >= 5
    o, e = observed[keep], expected[keep]
    if expected[~keep].sum() > 0:
        o, e = np.append(o, observed[~keep].sum()), np.append(e, expected[~keep].sum())
    return float(stats.chisquare(o, e * o.sum() / e.sum()).pvalue)


def test_linear_count_matches_reference():
    assert count_schedule(32, 5) == reference_expected()["gen_step_sizes"].tolist() == [6, 6, 7, 6, 7]


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_counts_sum_and_follow_the_grid(schedule):
    for total in (1, 7, 32, 256, 1000):
        for steps in sorted({1, 2, 3, 16, 64, total}):
            sizes = count_schedule(total, steps, schedule)
            assert len(sizes) == steps and sum(sizes) == total and min(sizes) >= 0
            grid = time_grid(steps, schedule)
            done = np.cumsum(sizes)
            for k in range(1, steps):  # revealed after step k = floor(total * (1 - t_k)) (brute force)
                assert done[k - 1] == math.floor(total * (1 - grid[k]) + 1e-9)
            if schedule == "linear" and steps <= total:
                assert min(sizes) >= 1  # one token per step at T = n


def test_cosine_counts_exact_values():
    # revealed after step k: floor(32 * (1 - cos(pi/2 * k/3))) = floor(32 * (1 - sqrt(3)/2)) = 4, then 16, 32
    assert count_schedule(32, 3, "cosine") == [4, 12, 16]
    assert count_schedule(4, 4, "cosine") == [0, 1, 1, 2]  # few early, many late; empty steps allowed


def test_time_grid_and_probabilities():
    for schedule in ("linear", "cosine"):
        grid = time_grid(10, schedule)
        assert grid[0] == 1.0 and grid[-1] == 0.0 and all(a > b for a, b in zip(grid[:-1], grid[1:], strict=True))
        probs = unmask_probabilities(10, schedule)
        assert probs[-1] == 1.0
        # surviving every step has probability t_T / t_0 = 0; surviving the first k is t_k
        survive = np.cumprod([1 - p for p in probs])
        np.testing.assert_allclose(survive, grid[1:], atol=1e-12)
    assert unmask_probabilities(4) == [1 / 4, 1 / 3, 1 / 2, 1.0]


def test_bernoulli_counts_are_binomial():
    masked = np.array([0, 1, 5, 16] * 5000)
    rng = np.random.default_rng(0)
    counts = bernoulli_counts(masked, 0.3, lambda seqs: rng.random(len(seqs)))
    assert (counts <= masked).all() and (counts[masked == 0] == 0).all()
    for m in (1, 5, 16):
        obs = np.bincount(counts[masked == m], minlength=m + 1)
        exp = stats.binom.pmf(np.arange(m + 1), m, 0.3) * obs.sum()
        assert pooled_chi2(obs, exp) > 1e-3
    assert np.array_equal(bernoulli_counts(masked, 1.0, rng.random), masked)
    assert bernoulli_counts(masked, 0.0, rng.random).sum() == 0


def test_bad_schedule_input():
    with pytest.raises(AOGPTError, match="schedule"):
        count_schedule(10, 2, "exp")
    with pytest.raises(AOGPTError, match="steps"):
        time_grid(0)
