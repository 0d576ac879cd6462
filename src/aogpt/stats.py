"""Estimates with 95% confidence intervals, and the rule that turns them into verdicts.

A *measurement* is a list of values, one per independent unit: per seed when a comparison ran
several seeds, else per evaluation batch, sequence, sample or timing repeat (whatever the quantity is
averaged over). An *exact* measurement (a count of operations, which does not vary) is one value
whose interval is the value itself. Two measurements over the same units (the same seeds, the same evaluation batches in
the same orders) are compared *paired*; others (generated samples of two models) by Welch's
unpaired t interval.

The verdict rule, for a claim "A is lower than B" (a loss, a time) with d = B - A and its 95% CI
[lo, hi]:

* **reproduced** when lo > 0 (the data show the claimed direction),
* **not reproduced** when hi < 0 (the data show the opposite direction),
* **inconclusive** otherwise (at this scale, the interval contains no difference).

For a claim "A is comparable to B, within a margin m" (A at most m above B), with e = A - B:
reproduced when hi(e) < m, not reproduced when lo(e) > m, inconclusive otherwise. A finding is
reproduced when all its checks are, not reproduced when any check is not, and inconclusive
otherwise. With a single unit no interval exists, and every verdict is inconclusive.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import scipy.stats

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)
LEVEL = 0.95


@dataclass(frozen=True)
class Measurement:
    """Values of one quantity, one per unit; `units` names what the units are (seeds, batches...)
    and `ids` identifies them, so two measurements over the same units can be paired."""

    values: tuple[float, ...]
    units: str
    ids: tuple[Any, ...] = ()
    exact: bool = False

    @staticmethod
    def of(values: Sequence[float], units: str, ids: Sequence[Any] | None = None, exact: bool = False
           ) -> Measurement:
        values = tuple(float(v) for v in values)
        if exact and len(values) != 1:
            raise ValueError("an exact measurement is one value")
        return Measurement(values, units, tuple(ids) if ids is not None else tuple(range(len(values))), exact)

    @property
    def mean(self) -> float:
        return float(np.mean(self.values)) if self.values else math.nan

    def pairs_with(self, other: Measurement) -> bool:
        return self.units == other.units and self.ids == other.ids


@dataclass(frozen=True)
class Estimate:
    """A mean (or mean difference) with its 95% interval [low, high] over `n` units of `units`."""

    value: float
    low: float
    high: float
    n: int
    units: str
    paired: bool = True
    exact: bool = False  # computed from exact values only: the interval is the value

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}

    def text(self, digits: int = 3) -> str:
        """``0.123 [0.100, 0.146]`` (no interval with fewer than two units)."""
        if not math.isfinite(self.low):
            return f"{self.value:.{digits}f} (no interval: {self.n} of {self.units})"
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def _t_interval(values: np.ndarray) -> tuple[float, float, float]:
    mean = float(values.mean())
    if len(values) < 2:
        return mean, -math.inf, math.inf
    se = float(values.std(ddof=1)) / math.sqrt(len(values))
    half = float(scipy.stats.t.ppf(0.5 + LEVEL / 2, len(values) - 1)) * se
    return mean, mean - half, mean + half


def mean_interval(m: Measurement) -> Estimate:
    """The mean of a measurement with its Student-t 95% interval (an exact value: itself)."""
    if m.exact:
        return Estimate(m.values[0], m.values[0], m.values[0], 1, m.units, exact=True)
    mean, low, high = _t_interval(np.asarray(m.values, dtype=np.float64))
    return Estimate(mean, low, high, len(m.values), m.units)


def difference(high: Measurement, low: Measurement) -> Estimate:
    """mean(high) - mean(low) with a 95% interval: paired over shared units, else Welch's; a
    difference involving an exact value has the other side's interval."""
    if high.exact or low.exact:
        h, l_ = mean_interval(high), mean_interval(low)
        other = l_ if high.exact else h
        return Estimate(h.value - l_.value, h.low - l_.high, h.high - l_.low, other.n, other.units,
                        exact=high.exact and low.exact)
    a, b = np.asarray(high.values, dtype=np.float64), np.asarray(low.values, dtype=np.float64)
    if high.pairs_with(low):
        mean, lo, hi = _t_interval(a - b)
        return Estimate(mean, lo, hi, len(a), high.units)
    mean = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return Estimate(mean, -math.inf, math.inf, min(len(a), len(b)), high.units, paired=False)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return Estimate(mean, mean, mean, min(len(a), len(b)), high.units, paired=False)
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))  # Welch-Satterthwaite
    half = float(scipy.stats.t.ppf(0.5 + LEVEL / 2, dof)) * se
    return Estimate(mean, mean - half, mean + half, min(len(a), len(b)), high.units, paired=False)


def offset(m: Measurement, constant: float) -> Estimate:
    """mean(m) - constant with the interval of the mean."""
    e = mean_interval(m)
    return Estimate(e.value - constant, e.low - constant, e.high - constant, e.n, e.units, exact=e.exact)


def verdict_lower(gap: Estimate) -> str:
    """Claim "A < B", gap = B - A: reproduced if the interval lies above 0, not reproduced if below."""
    if gap.low > 0:
        return REPRODUCED
    if gap.high < 0:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def verdict_within(excess: Estimate, margin: float) -> str:
    """Claim "A at most `margin` above B", excess = A - B: reproduced if the interval lies below the
    margin, not reproduced if above it."""
    if excess.high < margin:
        return REPRODUCED
    if excess.low > margin:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def json_safe(obj: Any) -> Any:
    """`obj` with every non-finite float replaced by None (strict JSON parsers refuse NaN/inf)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def combine(verdicts: Sequence[str]) -> str:
    """All reproduced: reproduced; any not reproduced: not reproduced; else (or none): inconclusive."""
    if verdicts and all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    if any(v == NOT_REPRODUCED for v in verdicts):
        return NOT_REPRODUCED
    return INCONCLUSIVE
