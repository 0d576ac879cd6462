"""Helpers shared by the subcommands: common flags, JSON summary, progress bars."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tqdm.auto import tqdm


def add_common(parser: argparse.ArgumentParser, seed: bool = True) -> None:
    parser.add_argument("--json", action="store_true", help="print a one-line JSON summary last on stdout")
    if seed:
        parser.add_argument("--seed", type=int, default=1337, help="random seed (default 1337)")


def emit_json(summary: dict[str, Any]) -> None:
    """The machine-readable summary: one line, last on stdout."""
    sys.stdout.flush()
    print(json.dumps(summary, default=float), flush=True)


def progress(total: int | None = None, desc: str = "", disable: bool = False, **kw: Any) -> tqdm:
    """A progress bar on stderr (never on stdout, which carries results and --json); shown only when
    stderr is a terminal, so logs and pipes are not flooded with redraws."""
    disable = disable or not sys.stderr.isatty()
    return tqdm(total=total, desc=desc, disable=disable, file=sys.stderr, dynamic_ncols=True, leave=False, **kw)
