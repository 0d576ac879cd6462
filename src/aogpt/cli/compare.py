"""`aogpt compare`: overlay the curves of training runs and tabulate their final metrics."""

from __future__ import annotations

import argparse

from aogpt.cli.common import add_common, emit_json, path_arg


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="overlay the loss curves of runs and tabulate their final metrics",
        description="Read the metrics.jsonl of each run directory and write DIR/compare.png (one panel per "
        "validation loss and the training loss, one line per run), DIR/compare.md and DIR/compare.json.",
    )
    p.add_argument("runs", nargs="+", type=path_arg, metavar="RUN",
                   help="run directories (from aogpt train or reproduce)")
    p.add_argument("--out", type=path_arg, required=True, help="where to write compare.png/.md/.json")
    p.add_argument("--labels", help="comma-separated names for the runs, in order (default: directory names)")
    p.add_argument("--weights", default="ema", choices=("ema", "raw", "both"),
                   help="which weights' validation curves to show (default ema)")
    add_common(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from aogpt.reproduce.compare import compare_runs

    labels = [s.strip() for s in args.labels.split(",")] if args.labels else None
    summary = compare_runs(args.runs, args.out, labels=labels, weights=args.weights)
    print(open(summary["files"]["markdown"], encoding="utf-8").read().strip())
    if args.json:
        emit_json(summary)
    return 0
