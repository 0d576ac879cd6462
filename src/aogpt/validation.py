"""Ranges of numbers, stated once, next to the field or flag they belong to.

A config field declares its range where it is defined::

    @dataclass
    class TrainConfig:
        lr: float = bounded(1e-3, gt=0, le=1)

and `check_ranges(config, where)` (called by the config's ``validate()``) refuses a value outside
it, NaN or an infinity, with one `AOGPTError` line. A command-line flag gets the same check from
the same statement (the argparse type ``config_arg(TrainConfig, "lr")`` of the CLI's shared
helpers), or, for a flag that sets no config field, from a ranged argparse ``type=`` such as
``positive_int`` or ``finite_float(gt=0)`` (built on `Range.parse`).
So a new option cannot forget its check: declaring it is checking it.

Floats must always be finite (NaN and infinities are refused). An optional field (``int | None``)
accepts None. `Range.parse` turns command-line text into a checked number (used by the argparse
types). `require` checks the shape of what a JSON file gave us (a missing key, a wrong type).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

from aogpt.errors import AOGPTError

INT64_MAX = 2**63 - 1
SEED_MAX = 2**62  # seeds are offset (seed + 1, seed + 7919 * rank) and must stay within int64


@dataclass(frozen=True)
class Range:
    """Bounds on a number: ``ge``/``gt`` below, ``le``/``lt`` above (None: unbounded). Floats are
    always required to be finite; ``integer`` asks for an int (bools are not ints here)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    integer: bool = False

    def describe(self) -> str:
        """The range in words: ``in (0, 1]``, ``>= 1``, ``a finite number``."""
        low = f"[{_num(self.ge)}" if self.ge is not None else f"({_num(self.gt)}" if self.gt is not None else None
        high = f"{_num(self.le)}]" if self.le is not None else f"{_num(self.lt)})" if self.lt is not None else None
        if self.le == INT64_MAX:  # the machine's limit, not the option's: not worth reading
            high = None
        if low and high:
            return f"in {low}, {high}"
        if low:
            return (">= " if low[0] == "[" else "> ") + low[1:]
        if high:
            return ("<= " if high[-1] == "]" else "< ") + high[:-1]
        return "an integer" if self.integer else "a finite number"

    def problem(self, value: Any) -> str | None:
        """Why `value` is not in the range (None when it is)."""
        kind = "an integer" if self.integer else "a number"
        if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy scalars are Real too
            return f"must be {kind}, got {value!r}"
        if self.integer and not isinstance(value, numbers.Integral):
            return f"must be an integer, got {value!r}"
        if not isinstance(value, numbers.Integral) and not math.isfinite(value):
            return f"must be a finite number {self.describe()}, got {value}"
        if self.le == INT64_MAX and value > INT64_MAX:
            return f"must be below 2^63, got {value!r}"
        if (self.ge is not None and value < self.ge or self.gt is not None and value <= self.gt
                or self.le is not None and value > self.le or self.lt is not None and value >= self.lt):
            return f"must be {self.describe()}, got {value!r}"
        return None

    def check(self, name: str, value: Any, fix: str = "") -> Any:
        """`value` if it is in the range, else a user error naming `name`."""
        problem = self.problem(value)
        if problem is not None:
            raise AOGPTError(f"{name} {problem}", fix or f"use a value {self.describe()}")
        return value

    def parse(self, text: str) -> int | float:
        """Command-line text as a number in the range; ValueError (with the reason) otherwise."""
        text = text.strip()
        try:
            value: int | float = int(text) if self.integer else float(text)
        except ValueError:
            raise ValueError(f"must be {'an integer' if self.integer else 'a number'}, got {text!r}") from None
        problem = self.problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


def _num(x: float) -> str:
    """A bound in short form: 1, 0.5, 1_000_000, 2^62."""
    if x == SEED_MAX:
        return "2^62"
    if isinstance(x, float):
        return str(int(x)) if x.is_integer() and abs(x) < 1e15 else f"{x:g}"
    return f"{x:_}" if abs(x) >= 10**6 else str(x)


def bounded(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
            lt: float | None = None, integer: bool | None = None) -> Any:
    """A dataclass field with a range: ``lr: float = bounded(1e-3, gt=0, le=1)``. An int default (or
    ``integer=True``) makes it an integer range; `check_ranges` enforces it."""
    whole = isinstance(default, int) and not isinstance(default, bool) if integer is None else integer
    spec = Range(ge=ge, gt=gt, le=le, lt=lt, integer=whole)
    return dataclasses.field(default=default, metadata={"range": spec})


def field_range(cls: type, name: str) -> Range | None:
    """The range declared for field `name` of dataclass `cls` (None when it has none)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.metadata.get("range")
    raise KeyError(f"{cls.__name__} has no field {name!r}")


def check_ranges(obj: Any, where: str, fix: str = "") -> None:
    """Refuse any field of dataclass `obj` outside its declared range (None passes: optional)."""
    for f in dataclasses.fields(obj):
        spec = f.metadata.get("range")
        value = getattr(obj, f.name)
        if spec is not None and value is not None:
            spec.check(f"{where}: {f.name}", value, fix)


def require(data: Any, key: str, kind: type | tuple[type, ...], where: str, fix: str) -> Any:
    """``data[key]``, refused with one line when `data` is not a mapping, the key is missing or its
    value has the wrong type (bools are not numbers here)."""
    if not isinstance(data, dict):
        raise AOGPTError(f"{where} must be a JSON object, got {type(data).__name__}", fix)
    if key not in data:
        raise AOGPTError(f"{where} lacks the key {key!r}", fix)
    value = data[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    wrong_bool = isinstance(value, bool) and bool not in kinds
    if wrong_bool or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise AOGPTError(f"{where}: {key} must be {names}, got {value!r}", fix)
    return value


__all__ = ["INT64_MAX", "SEED_MAX", "Range", "bounded", "check_ranges", "field_range", "require"]
