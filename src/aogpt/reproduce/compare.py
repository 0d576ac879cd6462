"""Compare training runs: overlay their curves and tabulate their final metrics (`aogpt compare`).

A run is a directory written by `aogpt train` (or by `aogpt reproduce`): its ``metrics.jsonl`` holds
train records (``{"kind": "train", "step", "loss", ...}``) and validation records (``{"kind":
"eval", "step", "val/l2r/raw", "val/any/ema", ...}``, nats per token). `compare_runs` writes

    DIR/compare.png   one panel per validation loss (left-to-right, any-order, own order) and the
                      training loss, one line per run
    DIR/compare.md    the table of final metrics, DIR/compare.json the same as data

`overlay` draws panels of curves for any caller (the reproduction report uses it for its figures).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aogpt.errors import AOGPTError
from aogpt.io import atomic_write_text, ensure_writable_dir, write_json
from aogpt.plots import pyplot, read_jsonl

KIND_TITLES = {"l2r": "Left-to-Right", "any": "Any-Order", "own": "Own order"}
Series = list[tuple[float, float]]


@dataclass
class RunCurves:
    """A run's curves: validation losses by key (``val/<kind>/<weights>``) and the training loss."""

    path: Path
    label: str
    evals: dict[str, Series] = field(default_factory=dict)
    train: Series = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)

    def final(self) -> dict[str, Any]:
        """The last value of every curve, the last step and tokens seen."""
        out: dict[str, Any] = {key: series[-1][1] for key, series in sorted(self.evals.items()) if series}
        if self.train:
            out["train/loss"] = self.train[-1][1]
        steps = [s for series in [*self.evals.values(), self.train] for s, _ in series]
        out["step"] = int(max(steps)) if steps else 0
        return out


def read_run(path: Path | str, label: str | None = None) -> RunCurves:
    """The curves of the run directory `path` (its metrics.jsonl); later records of a step win."""
    path = Path(path)
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise AOGPTError(f"{path} holds no metrics.jsonl", "pass run directories written by aogpt train")
    try:
        rows = read_jsonl(metrics)
    except json.JSONDecodeError as exc:
        raise AOGPTError(f"{metrics} is not valid JSON lines ({exc.msg})", "check the file") from None
    evals: dict[str, dict[int, float]] = {}
    train: dict[int, float] = {}
    for row in rows:
        if row.get("kind") == "train" and "loss" in row:
            train[int(row["step"])] = float(row["loss"])
        elif row.get("kind") == "eval":
            for key, value in row.items():
                if key.startswith("val/") and isinstance(value, (int, float)):
                    evals.setdefault(key, {})[int(row["step"])] = float(value)
    config = {}
    if (path / "run.json").is_file():
        config = json.loads((path / "run.json").read_text(encoding="utf-8"))
    return RunCurves(path, label or path.name, {k: sorted(v.items()) for k, v in evals.items()},
                     sorted(train.items()), config)


def overlay(panels: list[tuple[str, dict[str, Series]]], out_png: Path, *, title: str = "",
            ylabel: str = "loss (nats / token)", xlabel: str = "step") -> Path | None:
    """Side-by-side panels (title, {label: series}), one coloured line per label, the same colour for
    a label in every panel; a panel without data is left out. Plot failures become warnings."""
    panels = [(t, {k: v for k, v in d.items() if v}) for t, d in panels]
    panels = [(t, d) for t, d in panels if d]
    if not panels:
        return None
    import warnings

    try:
        plt = pyplot()
        fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), dpi=110, squeeze=False)
        labels = list(dict.fromkeys(label for _, d in panels for label in d))
        colors = {label: plt.get_cmap("tab10")(i % 10) for i, label in enumerate(labels)}
        for ax, (panel_title, data) in zip(axes[0], panels, strict=True):
            for label, series in data.items():
                xs, ys = zip(*series, strict=True)
                ax.plot(xs, ys, marker="o", ms=3, lw=1.4, color=colors[label], label=label)
            ax.set_title(panel_title)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        out_png = Path(out_png)
        tmp = out_png.with_suffix(".tmp.png")
        fig.savefig(tmp)
        plt.close(fig)
        tmp.replace(out_png)
        return out_png
    except Exception as exc:  # noqa: BLE001 - a plot must never lose the numbers
        warnings.warn(f"could not write plot {out_png}: {exc}", stacklevel=2)
        return None


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if math.isfinite(value) else "-"
    return "-" if value is None else str(value)


def compare_runs(runs: list[Path | str], out: Path | str, *, labels: list[str] | None = None,
                 weights: str = "ema") -> dict[str, Any]:
    """Overlay the curves of `runs` (validation losses of `weights`: "ema", "raw" or "both") and
    tabulate their final metrics; writes DIR/compare.{png,md,json} and returns the summary."""
    if not runs:
        raise AOGPTError("no runs to compare", "pass one or more run directories")
    if weights not in ("ema", "raw", "both"):
        raise AOGPTError(f"unknown weights {weights!r}", "use ema, raw or both")
    if labels is not None and len(labels) != len(runs):
        raise AOGPTError(f"{len(labels)} labels for {len(runs)} runs", "give one label per run")
    curves = [read_run(path, labels[i] if labels else None) for i, path in enumerate(runs)]
    seen: dict[str, int] = {}
    for c in curves:  # runs of the same name (or one run twice) stay apart in legends and tables
        seen[c.label] = seen.get(c.label, 0) + 1
        if seen[c.label] > 1:
            c.label = f"{c.label} #{seen[c.label]}"
    wanted = ("ema", "raw") if weights == "both" else (weights,)
    panels = []
    for kind, panel_title in KIND_TITLES.items():
        data = {}
        for c in curves:
            for w in wanted:
                series = c.evals.get(f"val/{kind}/{w}")
                if series:
                    data[c.label if weights != "both" else f"{c.label} ({w})"] = series
        panels.append((f"{panel_title} (validation)", data))
    panels.append(("Training loss (sampled orders)", {c.label: c.train for c in curves}))
    out = Path(out)
    ensure_writable_dir(out)
    png = overlay(panels, out / "compare.png", title="Runs compared")
    finals = {c.label: c.final() for c in curves}
    keys = sorted({k for f in finals.values() for k in f if k.startswith("val/") and k.split("/")[2] in wanted})
    headers = ["run", "step", *keys, "train/loss"]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for label, f in finals.items():
        lines.append("| " + " | ".join([label, *(_fmt(f.get(k)) for k in headers[1:])]) + " |")
    markdown = "# Runs compared\n\nFinal metrics (nats per token; the last record of each run).\n\n" + "\n".join(lines)
    if png is not None:
        markdown += f"\n\n![curves]({png.name})\n"
    summary = {"runs": {c.label: str(c.path) for c in curves}, "final": finals, "weights": weights,
               "files": {"markdown": str(out / "compare.md"), "json": str(out / "compare.json"),
                         "png": str(png) if png else None}}
    atomic_write_text(out / "compare.md", markdown + "\n")
    write_json(out / "compare.json", summary)
    return summary
