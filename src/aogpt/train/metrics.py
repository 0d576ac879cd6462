"""The run's metrics: `metrics.jsonl` (one JSON record per line, rank 0 only) and `loss.png`.

A resumed run first drops the records a crashed run wrote after the checkpoint it resumes from (and
a last line torn by the crash, with a warning), so the file reads as one uninterrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aogpt.io import atomic_write_text, read_jsonl
from aogpt.plots import plot_loss_curves


class MetricsLog:
    """Appends records to `<out>/metrics.jsonl` on the main rank; does nothing without a run directory."""

    def __init__(self, out: Path | None, is_main: bool):
        self.out, self.is_main = out, is_main

    @property
    def path(self) -> Path | None:
        return self.out / "metrics.jsonl" if self.out else None

    def log(self, record: dict[str, Any]) -> None:
        if self.is_main and self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def truncate(self, step: int) -> None:
        """Drop records a crashed run wrote after the checkpoint we resume from."""
        path = self.path
        if not self.is_main or path is None or not path.is_file():
            return
        keep = [row for row in read_jsonl(path) if row.get("step", 0) <= step]  # a torn last line is dropped
        atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in keep))

    def plot(self, title: str) -> Path | None:
        """Draw the loss curves to `<out>/loss.png` (main rank only)."""
        if not self.is_main or self.out is None:
            return None
        return plot_loss_curves(self.path, self.out / "loss.png", title=title)
