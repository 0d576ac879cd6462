"""The recipe sweep's report: one table row per candidate over its seeds, and its curves as a PNG.

Figures over seeds are means with a Student-t 95% interval (`aogpt.stats`); a candidate
has left the unigram plateau at the first validation point `PLATEAU_MARGIN` bits per byte below the
unigram level of the scored text (`aogpt.bench.training.diagnostics.unigram_bpb`).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from aogpt.plots import save_png
from aogpt.stats import Measurement, mean_interval

PLATEAU_MARGIN = 0.3  # bits per byte below the unigram level


def left_plateau_at(row: dict[str, Any]) -> int | None:
    """The first curve step whose any-order bits per byte is `PLATEAU_MARGIN` below the unigram level."""
    limit = row.get("unigram_bpb", math.nan) - PLATEAU_MARGIN
    return next((p["step"] for p in row.get("curve", []) if p.get("any") is not None and p["any"] <= limit), None)


def _by_candidate(result: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in result["rows"]:
        groups.setdefault(row["name"], []).append(row)
    return groups


def _estimate(values: list[float | None]) -> str:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    if not kept:
        return "-"
    if len(kept) == 1:
        return f"{kept[0]:.3f}"
    return mean_interval(Measurement.of(kept, "seeds")).text(3)


def candidate_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The table: one row per candidate, its seeds' figures as mean [95% interval]."""
    headers = ["candidate", "tokenizer", "layers/width/heads", "context", "batch", "lr/warm-up", "params", "seeds",
               "steps", "CPU s/step", "steps in budget", "train loss", "bpb l2r EMA", "bpb l2r raw", "bpb any EMA",
               "left the plateau", "load"]
    rows = []
    for name, runs in _by_candidate(result).items():
        r = runs[0]
        label = name if r.get("variant", "aogpt") == "aogpt" else f"{name} ({r['variant']})"
        left = [left_plateau_at(x) for x in runs]
        reached = [s for s in left if s is not None]
        plateau = "-" if not any(x.get("curve") for x in runs) else (
            f"{len(reached)}/{len(runs)}" + (f", step {statistics.median(reached):g}" if reached else ""))
        rows.append([label, r["tokenizer"], f"{r['layers']}/{r['width']}/{r['heads']}", str(r["block"]),
                     str(r["batch"]), f"{r['lr']:g}/{r['warmup']}", f"{r['params'] / 1e6:.1f} M", str(len(runs)),
                     str(r["steps"]), f"{statistics.mean(x['cpu_seconds_per_step'] for x in runs):.2f}",
                     str(r.get("steps_in_budget", "-")), _estimate([x["train_loss_end"] for x in runs]),
                     _estimate([x["l2r_ema"]["bpb"] for x in runs]), _estimate([x["l2r_raw"]["bpb"] for x in runs]),
                     _estimate([x["any_ema"]["bpb"] for x in runs]), plateau,
                     f"{statistics.mean(x.get('load_average') or 0 for x in runs):.1f}"])
    return headers, rows


PANELS = (("any", "any order, EMA (bits/byte)"), ("l2r", "left to right, EMA (bits/byte)"),
          ("lift/max", "attention on the target's neighbours (lift)"),
          ("shift_attn/target", "adaLN shift: its target-dependent part (RMS)"))


def _mean_curve(runs: list[dict[str, Any]], key: str) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps, mean, min and max over seeds of `key` (the steps every seed has)."""
    per_step: dict[int, list[float]] = {}
    for run in runs:
        for p in run.get("curve", []):
            if p.get(key) is not None:
                per_step.setdefault(p["step"], []).append(float(p[key]))
    steps = sorted(s for s, v in per_step.items() if len(v) == len(runs))
    return (steps, [statistics.mean(per_step[s]) for s in steps], [min(per_step[s]) for s in steps],
            [max(per_step[s]) for s in steps])


def plot_curves(result: dict[str, Any], out_png: Path) -> Path | None:
    """Four panels over training steps, one line per candidate (mean over seeds, the band from the
    lowest to the highest seed): the two validation curves and two diagnostics of the target pathway."""
    groups = _by_candidate(result)
    if not any(r.get("curve") for r in result["rows"]):
        return None
    unigram = next((r["unigram_bpb"] for r in result["rows"] if "unigram_bpb" in r), None)

    def draw(axes: Any) -> None:
        for ax, (key, title) in zip(axes.flat, PANELS, strict=True):
            for name, runs in groups.items():
                steps, mean, low, high = _mean_curve(runs, key)
                if not steps:
                    continue
                (line,) = ax.plot(steps, mean, label=name, linewidth=1.2)
                if len(runs) > 1:
                    ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
            if key in ("any", "l2r") and unigram is not None:
                ax.axhline(unigram, color="grey", linestyle=":", linewidth=1, label="unigram level")
            if key == "lift/max":
                ax.set_yscale("log")
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=7)
        axes.flat[0].legend(fontsize=6, loc="upper right")

    return save_png(draw, out_png, figsize=(11, 7.5), grid=(2, 2))
