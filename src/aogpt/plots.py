"""PNG plots (matplotlib, headless). Plotting never breaks a run: failures become a warning."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any


def pyplot():
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(draw: Callable[[Any], None], out_png: Path, figsize: tuple[float, float] = (6.4, 4.4),
             dpi: int = 120, grid: tuple[int, int] | None = None) -> Path | None:
    """Draw on one axes (`draw(ax)`), or on a grid of panels (`draw(axes)`, a (rows, cols) array, with
    `grid`), and write the figure to `out_png` atomically. Never raises: a missing or broken matplotlib,
    or a failing drawing, becomes a warning and no PNG, so a plot never loses the numbers it shows."""
    try:
        plt = pyplot()
        if grid is None:
            fig, ax = plt.subplots(figsize=figsize, dpi=dpi)
        else:
            fig, ax = plt.subplots(*grid, figsize=figsize, dpi=dpi, squeeze=False)
        try:
            draw(ax)
            fig.tight_layout()
            tmp = Path(out_png).with_suffix(".tmp.png")
            fig.savefig(tmp)
        finally:
            plt.close(fig)
        os.replace(tmp, out_png)
        return Path(out_png)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        warnings.warn(f"could not write plot {out_png}: {exc}", stacklevel=2)
        return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics log (`aogpt.io.read_jsonl`; a torn last line is left out quietly)."""
    from aogpt.errors import AOGPTError
    from aogpt.io import read_jsonl as read

    try:
        return read(path, warn=False)
    except AOGPTError:  # a damaged log: no plot rather than a failed run
        return []


def plot_loss_curves(metrics_path: Path, out_png: Path, title: str = "") -> Path | None:
    """Training loss and the validation losses (left-to-right and any-order, raw and EMA)."""
    rows = read_jsonl(metrics_path)
    train = [(r["step"], r["loss"]) for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    if not train and not evals:
        return None

    def draw(ax: Any) -> None:
        if train:
            ax.plot(*zip(*train, strict=True), lw=0.8, alpha=0.6, color="0.5", label="train (sampled orders)")
        styles = {"l2r": "-", "any": "--", "own": "-."}
        names = {"l2r": "left-to-right", "any": "any-order", "own": "own order"}
        colors = {"raw": "tab:blue", "ema": "tab:red"}
        keys = sorted({k for r in evals for k in r if k.startswith("val/")})
        for key in keys:
            _, kind, weights = key.split("/")
            pts = [(r["step"], r[key]) for r in evals if key in r]
            ax.plot(*zip(*pts, strict=True), styles.get(kind, ":"), marker="o", ms=3, color=colors.get(weights),
                    label=f"val {names.get(kind, kind)} ({weights})")
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats / token)")
        ax.set_title(title or "loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)

    return save_png(draw, out_png, figsize=(7, 4.5), dpi=110)
