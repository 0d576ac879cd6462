"""Helpers shared by the subcommands: common flags, JSON summary, progress (from `aogpt.progress`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from aogpt.progress import progress


def add_common(parser: argparse.ArgumentParser, seed: bool = True) -> None:
    parser.add_argument("--json", action="store_true", help="print a one-line JSON summary last on stdout")
    if seed:
        parser.add_argument("--seed", type=int, default=1337, help="random seed (default 1337)")


def emit_json(summary: dict[str, Any]) -> None:
    """The machine-readable summary: one line, last on stdout."""
    sys.stdout.flush()
    print(json.dumps(summary, default=float), flush=True)


__all__ = ["add_common", "emit_json", "progress"]
