"""Helpers shared by the subcommands: common flags, checked number types, JSON summary, progress.

Every number a flag takes is checked by its argparse ``type=`` (so a bad value is refused by the
parser, before anything runs, as ``error: argument --lr: must be in (0, 1], got nan``):

- a flag that sets a config field takes the range declared on the field: ``type=config_arg(TrainConfig,
  "lr")`` (`aogpt.validation.bounded`);
- any other number states its range where the flag is added: ``type=positive_int``,
  ``type=int_arg(ge=1, le=100_000)``, ``type=finite_float(gt=0)``, ``type=probability``.

A new option therefore gets its check by being declared; `tests/cli/test_malformed.py` and the
property test in `tests/cli/test_options.py` fail for a number flag declared without one.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aogpt.progress import progress
from aogpt.validation import INT64_MAX, SEED_MAX, Range, field_range

NumberArg = Callable[[str], int | float]


def number_arg(bounds: Range) -> NumberArg:
    """An argparse ``type=`` that parses a number and checks it against `bounds`."""

    def parse(text: str) -> int | float:
        try:
            return bounds.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = "integer" if bounds.integer else "number"
    parse.bounds = bounds  # type: ignore[attr-defined]  # read by the option tests
    return parse


def int_arg(*, ge: int | None = None, gt: int | None = None, le: int | None = INT64_MAX,
            lt: int | None = None) -> NumberArg:
    """An integer flag in a range (at most int64 unless a smaller bound is given)."""
    return number_arg(Range(ge=ge, gt=gt, le=le, lt=lt, integer=True))


def finite_float(*, ge: float | None = None, gt: float | None = None, le: float | None = None,
                 lt: float | None = None) -> NumberArg:
    """A finite float flag in a range (NaN and infinities are always refused)."""
    return number_arg(Range(ge=ge, gt=gt, le=le, lt=lt))


def config_arg(cls: type, name: str) -> NumberArg:
    """The argparse type of a flag that sets field `name` of config dataclass `cls`: the range is
    the one declared on the field."""
    bounds = field_range(cls, name)
    if bounds is None:
        raise ValueError(f"{cls.__name__}.{name} declares no range")
    return number_arg(bounds)


def path_arg(text: str) -> Path:
    """A file or directory path flag: not empty (an empty --out would mean the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must be a path, got an empty string")
    if "\0" in text:
        raise argparse.ArgumentTypeError(f"must be a path, got {text!r}")
    return Path(text)


path_arg.__name__ = "path"

positive_int = int_arg(ge=1)
nonnegative_int = int_arg(ge=0)
probability = finite_float(ge=0, le=1)
seed_arg = int_arg(ge=0, le=SEED_MAX)


def add_common(parser: argparse.ArgumentParser, seed: bool = True) -> None:
    parser.add_argument("--json", action="store_true", help="print a one-line JSON summary last on stdout")
    if seed:
        parser.add_argument("--seed", type=seed_arg, default=1337, help="random seed, 0..2^62 (default 1337)")


def emit_json(summary: dict[str, Any]) -> None:
    """The machine-readable summary: one line, last on stdout."""
    sys.stdout.flush()
    print(json.dumps(summary, default=float), flush=True)


__all__ = ["add_common", "config_arg", "emit_json", "finite_float", "int_arg", "nonnegative_int", "number_arg",
           "path_arg", "positive_int", "probability", "progress", "seed_arg"]
