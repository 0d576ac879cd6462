"""Checks judged on synthetic measurements: the verdict follows the stated rule, whatever the data."""

from __future__ import annotations

import numpy as np
import pytest

from aogpt import stats
from aogpt.reproduce.findings import Check, const, value
from aogpt.reproduce.results import judge
from aogpt.stats import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Measurement


def lookup_of(table):
    return lambda q: table[q.metric]


def noisy(mean, n=40, sd=0.05, seed=0, group="units"):
    values = np.random.default_rng(seed).normal(mean, sd, n)
    return Measurement.of(values, "evaluation batches", [(group, i) for i in range(n)])


@pytest.mark.parametrize("mean_a, mean_b, verdict", [
    (1.0, 1.2, REPRODUCED),  # a clearly lower: the claim holds
    (1.2, 1.0, NOT_REPRODUCED),  # a clearly higher: the opposite holds
    (1.0, 1.001, INCONCLUSIVE),  # within the noise
])
def test_lower_rule(mean_a, mean_b, verdict):
    table = {"A": noisy(mean_a, seed=1, group="a"), "B": noisy(mean_b, seed=2, group="b")}
    result = judge(Check("a below b", value("x", "A"), value("x", "B")), lookup_of(table))
    assert result["verdict"] == verdict
    e = stats.difference(table["B"], table["A"])  # B - A, unpaired (different groups)
    assert result["estimate"]["value"] == pytest.approx(e.value) and result["estimate"]["paired"] is False
    assert result["a"]["mean"] == pytest.approx(table["A"].mean)


def test_pairing_decides_when_noise_is_shared():
    """Two quantities on the same units whose common noise dwarfs their difference: paired, the small
    consistent difference is significant; the same numbers as unrelated samples are not."""
    rng = np.random.default_rng(3)
    base = rng.normal(0, 1, 30)
    a, b = base, base + 0.05 + rng.normal(0, 0.01, 30)
    paired = {"A": Measurement.of(a, "batches"), "B": Measurement.of(b, "batches")}
    unpaired = {"A": Measurement.of(a, "batches", [("a", i) for i in range(30)]),
                "B": Measurement.of(b, "batches", [("b", i) for i in range(30)])}
    check = Check("a below b", value("x", "A"), value("x", "B"))
    assert judge(check, lookup_of(paired))["verdict"] == REPRODUCED
    assert judge(check, lookup_of(unpaired))["verdict"] == INCONCLUSIVE


@pytest.mark.parametrize("slope, a_is_const, verdict", [
    (0.9, True, REPRODUCED),  # claim 0.5 < slope
    (0.1, True, NOT_REPRODUCED),
    (0.1, False, REPRODUCED),  # claim slope < 0.5
    (0.9, False, NOT_REPRODUCED),
])
def test_constants_on_either_side(slope, a_is_const, verdict):
    table = {"S": noisy(slope, sd=0.02)}
    check = (Check("const below", const(0.5), value("x", "S")) if a_is_const
             else Check("below const", value("x", "S"), const(0.5)))
    result = judge(check, lookup_of(table))
    assert result["verdict"] == verdict
    sign = 1 if a_is_const else -1
    assert result["estimate"]["value"] == pytest.approx(sign * (table["S"].mean - 0.5))


@pytest.mark.parametrize("excess, verdict", [(0.0, REPRODUCED), (0.5, NOT_REPRODUCED), (0.1, INCONCLUSIVE)])
def test_within_rule(excess, verdict):
    table = {"A": noisy(1.0 + excess, sd=0.05, seed=4), "B": noisy(1.0, sd=0.05, seed=5)}
    table = {k: Measurement.of(v.values, v.units) for k, v in table.items()}  # paired
    check = Check("a within 0.1 of b", value("x", "A"), value("x", "B"), rule="within", margin=0.1)
    result = judge(check, lookup_of(table))
    assert result["verdict"] == verdict
    e = result["estimate"]
    assert result["verdict"] == stats.verdict_within(stats.Estimate(e["value"], e["low"], e["high"], 1, ""), 0.1)


def test_a_single_unit_is_always_inconclusive():
    table = {"A": Measurement.of([1.0], "seeds"), "B": Measurement.of([9.0], "seeds")}
    result = judge(Check("a below b", value("x", "A"), value("x", "B")), lookup_of(table))
    assert result["verdict"] == INCONCLUSIVE and result["estimate"]["low"] is None
