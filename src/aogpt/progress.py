"""Progress on stderr (never stdout, which carries results and --json): a bar or a heartbeat.

On a terminal, `progress(...)` is the usual tqdm bar. When stderr is a log file, a pipe or CI, a
redrawn bar would flood it, so instead a `Heartbeat` prints one plain line at most every
`AOGPT_HEARTBEAT_SECONDS` seconds (default 30, read when the bar is made) and one at the end (none
when nothing was done or the work failed, so a refused input prints its error line alone):

    train: 120/850 steps (14%), loss 5.123, 4,500 tok/s, elapsed 1m10s, ETA 6m02s

Both answer the same calls: `update`, `set_postfix`, `set_postfix_str`, `set_description`, `write`, `close`,
the context manager, `n` and `total`. `disable=True` shows nothing at all.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from tqdm.auto import tqdm

HEARTBEAT_ENV = "AOGPT_HEARTBEAT_SECONDS"
DEFAULT_HEARTBEAT_SECONDS = 30.0


def heartbeat_seconds() -> float:
    """Seconds between heartbeat lines: `$AOGPT_HEARTBEAT_SECONDS`, or 30 when unset or not a number >= 0."""
    try:
        value = float(os.environ.get(HEARTBEAT_ENV, ""))
    except ValueError:
        return DEFAULT_HEARTBEAT_SECONDS
    return value if math.isfinite(value) and value >= 0 else DEFAULT_HEARTBEAT_SECONDS


def progress(total: int | None = None, desc: str = "", disable: bool = False, **kw: Any) -> Any:
    """A tqdm bar on stderr when it is a terminal, a `Heartbeat` otherwise; nothing when `disable`.
    Extra keywords go to tqdm (`initial` and `unit` are used by the heartbeat too)."""
    if disable or sys.stderr.isatty():
        return tqdm(total=total, desc=desc, disable=disable, file=sys.stderr, dynamic_ncols=True, leave=False, **kw)
    return Heartbeat(total, desc, initial=kw.get("initial", 0), unit=kw.get("unit", "it"),
                     interval=heartbeat_seconds(), file=sys.stderr)


def duration(seconds: float) -> str:
    """45s, 1m10s, 2h03m07s."""
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s"


def _value(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v).strip()
    return f"{v:,}" if isinstance(v, int) else f"{v:.4g}"


class Heartbeat:
    """A progress display for logs: one line per `interval` seconds at most, and one on `close`."""

    disable = False

    def __init__(self, total: int | None = None, desc: str = "", *, initial: int = 0, unit: str = "it",
                 interval: float = DEFAULT_HEARTBEAT_SECONDS, file: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.desc, self.unit = total, desc, unit
        self.n = self.initial = initial
        self.interval, self.clock = interval, clock
        self.file = file if file is not None else sys.stderr
        self.start = self.last = clock()
        self.postfix = ""
        self.closed = False

    # ------------------------------------------------------------------ tqdm's interface
    def update(self, n: int | float = 1) -> None:
        self.n += n
        if not self.closed and self.clock() - self.last >= self.interval:
            self._beat()

    def set_postfix(self, ordered_dict: Mapping[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{key} {_value(value)}" for key, value in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = str(s)

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def write(self, s: str, file: TextIO | None = None, end: str = "\n") -> None:
        """A message between progress lines (tqdm's `write`, which the bar's callers also use)."""
        print(s, file=file if file is not None else self.file, end=end, flush=True)

    def close(self, failed: bool = False) -> None:
        """Print the last line (once), if any progress was made; none when the work `failed` (its
        error line says what happened) or never started (an input refused before any work: the
        error stays the only line)."""
        if not self.closed:
            if not failed and self.n != self.initial:
                self._beat()
            self.closed = True

    def __enter__(self) -> Heartbeat:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(failed=exc_type is not None)

    # ------------------------------------------------------------------ the line
    def line(self) -> str:
        """`desc: n/total units (pct%), postfix, elapsed E, ETA T`."""
        counted = self.total if self.total else self.n  # "1/100 steps" (of the total), "1 step" (no total)
        unit = self.unit + "s" if counted != 1 and len(self.unit) > 2 and not self.unit.endswith("s") else self.unit
        count = f"{_value(self.n)}/{_value(self.total)} {unit}" if self.total else f"{_value(self.n)} {unit}"
        if self.total:
            count += f" ({int(100 * self.n / self.total)}%)"
        elapsed = self.clock() - self.start
        parts = [count, self.postfix, f"elapsed {duration(elapsed)}"]
        done = self.n - self.initial
        if self.total and 0 < done and self.n < self.total:
            parts.append(f"ETA {duration(elapsed * (self.total - self.n) / done)}")
        text = ", ".join(p for p in parts if p)
        return f"{self.desc}: {text}" if self.desc else text

    def _beat(self) -> None:
        print(self.line(), file=self.file, flush=True)
        self.last = self.clock()
