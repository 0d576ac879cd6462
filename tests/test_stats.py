"""Intervals against scipy, and the verdict rule on synthetic estimates."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from aogpt import stats
from aogpt.stats import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Estimate, Measurement


def test_mean_interval_is_the_student_t_interval():
    values = np.random.default_rng(0).normal(2.0, 0.3, 17)
    e = stats.mean_interval(Measurement.of(values, "batches"))
    lo, hi = scipy.stats.t.interval(0.95, len(values) - 1, loc=values.mean(), scale=scipy.stats.sem(values))
    assert (e.value, e.low, e.high, e.n) == pytest.approx((values.mean(), lo, hi, 17))


def test_paired_difference_uses_the_per_unit_differences():
    rng = np.random.default_rng(1)
    shared = rng.normal(0, 5, 30)  # a large per-unit effect that pairing removes
    a, b = shared + 1.0 + rng.normal(0, 0.1, 30), shared + rng.normal(0, 0.1, 30)
    e = stats.difference(Measurement.of(a, "batches"), Measurement.of(b, "batches"))
    ref = stats.mean_interval(Measurement.of(a - b, "batches"))
    assert e.paired and (e.value, e.low, e.high) == pytest.approx((ref.value, ref.low, ref.high))
    assert e.low > 0.9 and e.high < 1.1


def test_unpaired_difference_is_welch():
    rng = np.random.default_rng(2)
    a, b = rng.normal(1.0, 1.0, 40), rng.normal(0.5, 2.0, 25)
    e = stats.difference(Measurement.of(a, "samples", [("a", i) for i in range(40)]),
                         Measurement.of(b, "samples", [("b", i) for i in range(25)]))
    ci = scipy.stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert not e.paired and (e.low, e.high) == pytest.approx((ci.low, ci.high))


def est(value, low, high, n=10):
    return Estimate(value, low, high, n, "batches")


@pytest.mark.parametrize("estimate, verdict", [
    (est(0.5, 0.1, 0.9), REPRODUCED),
    (est(-0.5, -0.9, -0.1), NOT_REPRODUCED),
    (est(0.1, -0.2, 0.4), INCONCLUSIVE),
    (est(0.0, 0.0, 0.0), INCONCLUSIVE),  # an interval touching zero decides nothing
    (est(2.0, -math.inf, math.inf, 1), INCONCLUSIVE),  # one unit: no interval
])
def test_verdict_lower(estimate, verdict):
    assert stats.verdict_lower(estimate) == verdict


@pytest.mark.parametrize("estimate, verdict", [
    (est(0.0, -0.05, 0.05), REPRODUCED),  # surely within 0.1
    (est(0.05, 0.01, 0.09), REPRODUCED),  # worse, but surely by less than the margin
    (est(0.3, 0.2, 0.4), NOT_REPRODUCED),  # surely beyond the margin
    (est(0.1, 0.0, 0.2), INCONCLUSIVE),
])
def test_verdict_within_a_margin(estimate, verdict):
    assert stats.verdict_within(estimate, 0.1) == verdict


@pytest.mark.parametrize("verdicts, combined", [
    ([REPRODUCED, REPRODUCED], REPRODUCED),
    ([REPRODUCED, INCONCLUSIVE], INCONCLUSIVE),
    ([REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE], NOT_REPRODUCED),
    ([], INCONCLUSIVE),
])
def test_combine(verdicts, combined):
    assert stats.combine(verdicts) == combined


def test_json_safe_drops_non_finite_numbers():
    assert stats.json_safe({"a": [1.0, math.inf, (math.nan, 2)], "b": "x"}) == {"a": [1.0, None, [None, 2]], "b": "x"}


def test_exact_values_have_no_spread():
    exact = Measurement.of([2.0], "count", exact=True)
    assert stats.mean_interval(exact) == Estimate(2.0, 2.0, 2.0, 1, "count", exact=True)
    assert stats.verdict_lower(stats.offset(exact, 1.5)) == REPRODUCED  # exactly 0.5 above: decided
    noisy = Measurement.of([1.0, 1.2, 0.8], "rounds")
    e = stats.difference(exact, noisy)
    ref = stats.mean_interval(noisy)
    assert (e.value, e.low, e.high, e.n, e.exact) == pytest.approx((1.0, 2.0 - ref.high, 2.0 - ref.low, 3, False))
    with pytest.raises(ValueError):
        Measurement.of([1.0, 2.0], "count", exact=True)
