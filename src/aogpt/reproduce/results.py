"""From what was measured to verdicts: the numbers behind every check of every finding.

`curve_measurement` and `analysis_measurement` turn a `Quantity` into a `Measurement` (values per
seed, or per evaluation batch / sequence / sample / timing round when one seed ran); `judge` applies the rule of
`aogpt.stats` to a `Check`; `finding_result` gathers one finding's checks, its verdict and
the table of its runs. Everything here reads files written by the runner and the analyses, so a
report can be rebuilt at any time without training anything.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from aogpt import stats
from aogpt.errors import AOGPTError
from aogpt.orders import is_left_to_right, make_order_sampler
from aogpt.reproduce.findings import RUNS, Check, Finding, Quantity
from aogpt.reproduce.runner import Plan

WEIGHTS = "ema"  # the weights every run is judged by (equal to the raw ones without EMA)
Lookup = Callable[[Quantity], stats.Measurement]


def metric_key(run_key: str, metric: str) -> str:
    """``val/<kind>/ema``; a left-to-right run's own order is left to right."""
    if metric == "own" and is_left_to_right(RUNS[run_key].order):
        metric = "l2r"
    return f"val/{metric}/{WEIGHTS}"


def per_batch(plan: Plan, run_key: str, seed: int, metric: str, stage: str) -> np.ndarray:
    """The validation loss of every batch: at the last step ("final"), or averaged over the
    validations of the first half of training ("early")."""
    run = plan.run(run_key, seed)
    records = run.batch_records()
    key, steps, grid = metric_key(run_key, metric), run.train_cfg.max_steps, run.train_cfg.eval_interval
    wanted = [steps] if stage == "final" else [s for s in range(grid, steps // 2 + 1, grid)] or [grid]
    missing = [s for s in wanted if s not in records or key not in records[s]]
    if missing:
        raise AOGPTError(f"run {run.name} has no {key} validation at step(s) {missing}",
                         "rerun the same command to finish its training")
    return np.mean([records[s][key] for s in wanted], axis=0)


def curve_measurement(plan: Plan, q: Quantity) -> stats.Measurement:
    rows = [per_batch(plan, q.run, seed, q.metric, q.stage) for seed in plan.seeds]
    if len(rows) == 1:
        return stats.Measurement.of(rows[0], "evaluation batches")
    return stats.Measurement.of([r.mean() for r in rows], "seeds", plan.seeds)


def analysis_measurement(results: dict[Any, dict[str, Any]], key: str) -> stats.Measurement:
    """One seed (or the seed-free benchmark): one value per unit, paired within a group; several
    seeds: one mean per seed, paired by seed."""
    if len(results) == 1 or all(r["values"][key].get("exact") for r in results.values()):
        result = next(iter(results.values()))
        entry = result["values"][key]
        return stats.Measurement.of(entry["values"], result["units"] if not entry.get("exact") else "exact count",
                                    [(entry["group"], i) for i in range(len(entry["values"]))],
                                    exact=bool(entry.get("exact")))
    seeds = sorted(results, key=str)
    return stats.Measurement.of([float(np.mean(results[s]["values"][key]["values"])) for s in seeds], "seeds", seeds)


def lookup_for(plan: Plan, analyses: dict[str, dict[Any, dict[str, Any]]]) -> Lookup:
    def lookup(q: Quantity) -> stats.Measurement:
        if q.source == "curve":
            return curve_measurement(plan, q)
        return analysis_measurement(analyses[q.source], q.metric)

    return lookup


def _side(q: Quantity, lookup: Lookup, labels: dict[str, str]) -> tuple[dict[str, Any], stats.Measurement | None]:
    if q.source == "const":
        return {"label": q.label(labels), "mean": q.value, "interval": None}, None
    m = lookup(q)
    e = stats.mean_interval(m)
    return {"label": q.label(labels), "mean": e.value, "interval": [e.low, e.high] if math.isfinite(e.low) else None,
            "n": e.n, "units": e.units}, m


def judge(check: Check, lookup: Lookup, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The estimate and verdict of one check (rule in `aogpt.stats`)."""
    labels = labels or {}
    a_info, a = _side(check.a, lookup, labels)
    b_info, b = _side(check.b, lookup, labels)
    if check.rule == "lower":  # gap = b - a, claimed > 0
        if a is None and b is None:
            raise AOGPTError("a check compares two constants", "fix the finding's spec")
        est = (stats.offset(b, check.a.value) if a is None else
               stats.Estimate(*_negate(stats.offset(a, check.b.value))) if b is None else stats.difference(b, a))
        verdict = stats.verdict_lower(est)
        shown = "B - A"
    elif check.rule == "within":  # excess = a - b, claimed < margin
        if a is None or b is None:
            raise AOGPTError("a 'within' check needs two measured quantities", "fix the finding's spec")
        est = stats.difference(a, b)
        verdict = stats.verdict_within(est, check.margin)
        shown = "A - B"
    else:
        raise AOGPTError(f"unknown rule {check.rule!r}", "use lower or within")
    return {"claim": check.claim, "rule": check.rule, "margin": check.margin, "unit": check.unit, "a": a_info,
            "b": b_info, "difference": shown, "estimate": est.to_dict(), "estimate_text": est.text(4),
            "verdict": verdict}


def _negate(e: stats.Estimate) -> tuple:
    return (-e.value, -e.high, -e.low, e.n, e.units, e.paired, e.exact)


def _fixed_other_order(spec: str) -> bool:
    sampler = make_order_sampler(spec)
    return sampler.is_fixed and not is_left_to_right(sampler)


def run_table(plan: Plan, finding: Finding) -> list[dict[str, Any]]:
    """Early and final validation losses (mean and interval) of the finding's runs."""
    rows = []
    for key in finding.runs:
        row: dict[str, Any] = {"run": key, "label": finding.label(key), "order": RUNS[key].order}
        for metric in ("l2r", "any", "own"):
            if metric == "own" and not _fixed_other_order(RUNS[key].order):
                continue
            for stage in ("early", "final"):
                try:
                    e = stats.mean_interval(curve_measurement(plan, Quantity("curve", metric, key, stage)))
                except AOGPTError:
                    continue
                row[f"{metric} {stage}"] = {"mean": e.value, "interval": [e.low, e.high] if math.isfinite(e.low)
                                            else None}
        rows.append(row)
    return rows


def finding_result(plan: Plan, finding: Finding, lookup: Lookup) -> dict[str, Any]:
    """Checks, verdict and run table of one finding."""
    labels = {k: finding.label(k) for k in RUNS}
    checks = [judge(c, lookup, labels) for c in finding.checks]
    verdict = stats.combine([c["verdict"] for c in checks]) if checks else "measured (no claim to test)"
    return {"key": finding.key, "title": finding.title, "claim": finding.claim, "notes": finding.notes,
            "checks": checks, "verdict": verdict, "runs": run_table(plan, finding) if finding.runs else []}
