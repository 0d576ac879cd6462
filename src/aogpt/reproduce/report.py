"""The reproduction report: DIR/report.md, DIR/report.json and one figure per finding in DIR/figures/.

`build_report` gathers the verdicts (`aogpt.reproduce.results`) and the figures; `to_markdown`
renders the same dictionary as text, so the markdown and the JSON always say the same thing.
"""

from __future__ import annotations

import math
import os
import platform
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aogpt import stats
from aogpt.io import atomic_write_text, ensure_writable_dir, write_json
from aogpt.plots import save_png
from aogpt.reproduce.compare import overlay, read_run
from aogpt.reproduce.findings import ANNEALING, ENSEMBLE_SIZES, FINDINGS, RUNS, Finding, value
from aogpt.reproduce.results import finding_result, lookup_for, metric_key
from aogpt.reproduce.runner import Plan

RULE = ("Each check states a claim of the paper as 'A is lower than B' (a loss or a time) and is decided by the 95% "
        "confidence interval of the difference B - A: reproduced when it lies above zero, not reproduced when it "
        "lies below zero, inconclusive at this scale when it contains zero. A claim that A is comparable to B "
        "within a margin m is reproduced when the interval of A - B lies below m, not reproduced when it lies "
        "above m. Intervals are Student-t intervals over seeds when several seeds ran, else over evaluation "
        "batches, held-out sequences, generated samples or timing rounds (paired where both sides share them); "
        "counts of operations are exact and need none. A finding is reproduced when all its checks are, not "
        "reproduced when any is not, else inconclusive.")


def _mean_curves(plan: Plan, key: str, metric: str) -> list[tuple[float, float]]:
    """The run's validation curve of `metric` (EMA weights), averaged over seeds by step."""
    by_step: dict[int, list[float]] = {}
    for seed in plan.seeds:
        curves = read_run(plan.run(key, seed).dir)
        for step, loss in curves.evals.get(metric_key(key, metric), []):
            by_step.setdefault(int(step), []).append(loss)
    return [(s, float(np.mean(v))) for s, v in sorted(by_step.items()) if len(v) == len(plan.seeds)]


def curve_figure(plan: Plan, finding: Finding, out: Path) -> Path | None:
    panels = []
    for panel in finding.panels:
        runs = panel.runs or finding.runs
        panels.append((panel.title, {finding.label(k): _mean_curves(plan, k, panel.metric) for k in runs}))
    return overlay(panels, out, title=finding.title)


def ensemble_figure(result: dict[str, Any], out: Path) -> Path | None:
    """Fig. 4 style: the decoder's any-order NLL against the ensemble size, the encoder as a band."""

    def draw(ax: Any) -> None:
        dec = [result["table"][f"decoder M={m}"] for m in ENSEMBLE_SIZES]
        ax.errorbar(ENSEMBLE_SIZES, [d["mean"] for d in dec], yerr=_errors(dec), marker="o", capsize=3,
                    label="decoder (AO-GPT), context-order ensemble")
        enc = result["table"]["encoder"]
        ax.axhline(enc["mean"], color="tab:red", label="encoder-only MDM")
        if enc["interval"]:
            ax.axhspan(*enc["interval"], color="tab:red", alpha=0.15)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ENSEMBLE_SIZES, [str(m) for m in ENSEMBLE_SIZES])
        _label(ax, "ensemble size M", "any-order NLL (nats / token)", "Fig. 4: context-order ensembles")

    return save_png(draw, out, figsize=(5.5, 4.2), dpi=110)


def genppl_figure(result: dict[str, Any], out: Path) -> Path | None:
    def draw(ax: Any) -> None:
        x = np.arange(len(ANNEALING))
        for i, model in enumerate(("aogpt", "encoder")):
            ys = [result["table"][f"{model} {s}"]["genppl"] for s, _, _ in ANNEALING]
            ax.bar(x + (i - 0.5) * 0.38, ys, 0.38, label="AO-GPT" if model == "aogpt" else "encoder-only MDM")
        ax.set_xticks(x, [f"{s}\ntop-p {p}, temp {t}" for s, p, t in ANNEALING], fontsize=8)
        ax.set_yscale("log")
        _label(ax, None, "generation perplexity (our left-to-right model)",
               "Table 1: generation perplexity under annealing", grid_axis="y")

    return save_png(draw, out, figsize=(6, 4.2), dpi=110)


def orders_figure(rows: list[dict[str, Any]], out: Path) -> Path | None:
    """The trade-off: final left-to-right NLL against final any-order NLL, one point per training
    order, the Mallows sweep joined from left to right (theta = inf) to uniform (theta = 0)."""

    def draw(ax: Any) -> None:
        for group, style, color, label in (
                ([r for r in rows if r["run"] != "mixture"], "-o", "tab:blue", "Mallows sweep (θ: ∞ → 0)"),
                ([r for r in rows if r["run"] == "mixture"], "s", "tab:red",
                 "uniform + 10% left to right (AO-GPT recipe)")):
            if group:
                xs, ys = [r["any"] for r in group], [r["l2r"] for r in group]
                ax.errorbar([e["mean"] for e in xs], [e["mean"] for e in ys], xerr=_errors(xs), yerr=_errors(ys),
                            fmt=style, color=color, capsize=2, ms=6, label=label)
        for r in rows:
            if r["theta"]:
                ax.annotate(f"θ={r['theta'].replace('inf', '∞')}", (r["any"]["mean"], r["l2r"]["mean"]),
                            fontsize=8, xytext=(4, 4), textcoords="offset points")
        _label(ax, "any-order NLL, uniform orders (nats / token)", "left-to-right NLL (nats / token)",
               "Which orders matter: the trade-off")

    return save_png(draw, out, figsize=(6, 4.6), dpi=110)


def _errors(entries: list[dict[str, Any]]) -> list[list[float]]:
    """Error-bar lengths below and above each mean, from its 95% interval (none: zero)."""
    return [[e["mean"] - (e["interval"] or [e["mean"]] * 2)[0] for e in entries],
            [(e["interval"] or [e["mean"]] * 2)[1] - e["mean"] for e in entries]]


def _label(ax: Any, xlabel: str | None, ylabel: str, title: str, grid_axis: str = "both") -> None:
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis=grid_axis)
    ax.legend(fontsize=8)


def _summary_entry(m: stats.Measurement) -> dict[str, Any]:
    e = stats.mean_interval(m)
    return {"mean": e.value, "interval": [e.low, e.high] if math.isfinite(e.low) else None, "n": e.n, "units": e.units}


def analysis_tables(finding: Finding, lookup: Any, analyses: dict[str, Any], plan: Plan | None = None
                    ) -> dict[str, Any]:
    """The numbers behind a finding's analyses, for its tables and figure."""
    out: dict[str, Any] = {}
    if "infill" in finding.analyses:
        from aogpt.reproduce.infill import tables

        out["infill"] = tables(plan, lookup, analyses)
    if "ensemble" in finding.analyses:
        out["table"] = {k: _summary_entry(lookup(value("ensemble", k)))
                        for k in [f"decoder M={m}" for m in ENSEMBLE_SIZES] + ["encoder"]}
    if "genppl" in finding.analyses:
        table = {}
        for model in ("aogpt", "encoder"):
            for setting, _, _ in ANNEALING:
                key = f"{model} {setting}"
                extras = [r["extra"][key] for r in analyses["genppl"].values()]
                table[key] = {**_summary_entry(lookup(value("genppl", key))),
                              "genppl": float(np.mean([e["genppl"] for e in extras])),
                              "entropy": float(np.mean([e["entropy"] for e in extras])),
                              "example": extras[0]["example"]}
        out["table"] = table
    if "speed" in finding.analyses:
        extra = next(iter(analyses["speed"].values()))["extra"]
        gap = stats.difference(lookup(value("speed", "log time encoder")), lookup(value("speed", "log time aogpt")))
        out["seconds"], out["slots"], out["padded_slots"] = extra["seconds"], extra["slots"], extra["padded_slots"]
        out["rounds"] = len(next(iter(analyses["speed"].values()))["values"]["log time aogpt"]["values"])
        out["n"], out["batch"], out["steps"] = extra["n"], extra["batch"], extra["steps"]
        out["speedup_at_n"] = {"mean": math.exp(gap.value),
                               "interval": [math.exp(gap.low), math.exp(gap.high)] if math.isfinite(gap.low)
                               else None}
        out["environment"] = extra["environment"]
        out["bench_files"] = extra["files"]
    return out


def orders_rows(plan: Plan, result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for r in result["runs"]:
        order = RUNS[r["run"]].order
        theta = {"l2r": "inf", "uniform": "0"}.get(order, order.split(":")[1] if order.startswith("mallows") else "")
        rows.append({"run": r["run"], "label": r["label"], "order": order, "theta": theta,
                     "l2r": r.get("l2r final"), "any": r.get("any final")})
    return rows


def build_report(plan: Plan, analyses: dict[str, Any], *, wall_seconds: float, device: str, notes: list[str],
                 request: dict[str, Any]) -> dict[str, Any]:
    """Verdicts, tables and figures of every planned finding; writes DIR/report.{md,json}."""
    figures = plan.out / "figures"
    ensure_writable_dir(figures)
    lookup = lookup_for(plan, analyses)
    results = []
    for key in plan.findings:
        finding = FINDINGS[key]
        sub = plan.for_finding(key)  # its seeds: the checks pair over them
        lookup = lookup_for(sub, analyses)
        res = finding_result(sub, finding, lookup)
        res["seeds"] = list(sub.seeds)
        res.update(analysis_tables(finding, lookup, analyses, sub))
        png = None
        if key == "infill":
            from aogpt.reproduce.infill import figure

            png = figure(res["infill"], figures / f"{key}.png")
        elif key == "f6":
            png = ensemble_figure(res, figures / f"{key}.png")
        elif key == "genppl":
            png = genppl_figure(res, figures / f"{key}.png")
        elif key == "speed" and res.get("bench_files", {}).get("png"):
            png = Path(shutil.copyfile(res["bench_files"]["png"], figures / f"{key}.png"))
        elif finding.panels:
            png = curve_figure(sub, finding, figures / f"{key}.png")
        if key == "orders":
            res["sweep"] = orders_rows(sub, res)
            sweep_png = orders_figure(res["sweep"], figures / "orders-tradeoff.png")
            res["figures"] = [str(p.relative_to(plan.out)) for p in (sweep_png, png) if p]
        else:
            res["figures"] = [str(png.relative_to(plan.out))] if png else []
        results.append(res)
    report = {
        "scale": {**plan.scale.to_dict(), "description": plan.scale.describe(infill="infill" in plan.findings)},
        "seeds": list(plan.seeds),
        "request": request,
        "rule": RULE,
        "machine": {"device": device, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                    "torch": torch.__version__, "python": platform.python_version(),
                    "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None},
        "wall_seconds": wall_seconds,
        "notes": notes,
        "findings": results,
        "verdicts": {r["key"]: r["verdict"] for r in results},
    }
    from aogpt.reproduce.markdown import to_markdown

    write_json(plan.out / "report.json", stats.json_safe(report))
    atomic_write_text(plan.out / "report.md", to_markdown(report))
    report["files"] = {"markdown": str(plan.out / "report.md"), "json": str(plan.out / "report.json"),
                       "figures": str(figures)}
    return report
