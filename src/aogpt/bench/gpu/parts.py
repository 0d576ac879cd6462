"""What a part of `aogpt bench gpu` is given and what it records (`aogpt.bench.gpu.run` runs the parts).

A part is a function ``part(ctx: Context) -> None``. It records pass/fail comparisons (`Context.check`,
`Context.verdict`), checks that do not apply here (`Context.skip`, e.g. "no CUDA device"), figures
(`Context.metric`) and markdown lines for the report (`Context.lines`); it may raise `Skipped` when
nothing of it applies. Long parts call `Context.save` after each finished piece (the report is then
rewritten, so a run stopped by a time limit keeps it) and watch `Context.left`, the seconds left of
their time share.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from aogpt.bench.gpu.plan import Plan

NO_CUDA = "no CUDA device"


@dataclass
class Check:
    """One pass/fail comparison: its value against a stated bound; `passed` None means skipped."""

    name: str
    passed: bool | None
    value: Any = None
    bound: str = ""
    note: str = ""


class Skipped(Exception):  # noqa: N818 - a part that does not apply here; the message says why
    """Raised by a part that cannot run here (the reason is its message)."""


class PartError(Exception):
    """A part that did not finish, in words that say why (a part run in its own process: its own
    error, or its end at its time share, `aogpt.bench.gpu.isolate`)."""


@dataclass
class Part:
    """What one part recorded: checks, figures (``metrics``), report lines and its status."""

    name: str
    share_s: float
    status: str = "pending"  # pending, running, passed, failed, error, skipped
    seconds: float | None = None
    checks: list[Check] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)  # markdown of the part's own tables
    error: str | None = None
    trace: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["checks"] = [asdict(c) for c in self.checks]
        return d


class Context:
    """What a part is given: the plan, the device, the seed, its deadline, and ways to record."""

    def __init__(self, plan: Plan, device: torch.device, seed: int, part: Part, deadline: float,
                 save: Callable[[], None] = lambda: None, say: Callable[[str], None] = lambda line: None):
        self.plan, self.device, self.seed, self.part, self.deadline = plan, device, seed, part, deadline
        self._save, self._say = save, say

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def left(self) -> float:
        """Seconds left of this part's share."""
        return self.deadline - time.monotonic()

    def check(self, name: str, value: float | None, bound: float, *, at_most: bool = True, fmt: str = "{:.3g}",
              note: str = "") -> Check:
        """Record `value` <= `bound` (>= with ``at_most=False``); a missing or NaN value fails."""
        ok = value is not None and value == value and (value <= bound if at_most else value >= bound)
        c = Check(name, bool(ok), None if value is None else float(value),
                  ("≤ " if at_most else "≥ ") + fmt.format(bound), note)
        self.part.checks.append(c)
        return c

    def verdict(self, name: str, ok: bool, value: Any = None, bound: str = "", note: str = "") -> Check:
        """Record a comparison that is not one number against a bound."""
        c = Check(name, bool(ok), value, bound, note)
        self.part.checks.append(c)
        return c

    def skip(self, name: str, why: str) -> Check:
        c = Check(name, None, note=f"skipped: {why}")
        self.part.checks.append(c)
        return c

    def metric(self, key: str, value: Any) -> None:
        self.part.metrics[key] = value

    def lines(self, *lines: str) -> None:
        self.part.lines.extend(lines)

    def save(self) -> None:
        """Rewrite the report now (after each finished piece of a long part)."""
        self._save()

    def progress(self, label: str) -> None:
        self._say(f"{self.part.name}: {label}")


PartFn = Callable[[Context], None]

__all__ = ["NO_CUDA", "Check", "Context", "Part", "PartError", "PartFn", "Skipped"]
