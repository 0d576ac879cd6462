"""`aogpt reproduce`: the paper's findings at CPU scale in one command, with verdicts from the numbers."""

from __future__ import annotations

import argparse
import sys

from aogpt.cli.common import add_common, emit_json, finite_float, int_arg, path_arg


def add_parser(sub: argparse._SubParsersAction) -> None:
    from aogpt.reproduce.findings import FINDINGS

    listing = "; ".join(f"{k}: {f.title}" for k, f in FINDINGS.items())
    p = sub.add_parser(
        "reproduce",
        help="re-run the paper's findings at small scale and judge each by the numbers",
        description="Train the models behind the paper's findings on the bundled Shakespeare corpus (all models "
        "of a comparison the same size, data and steps; runs interleaved), measure, and write DIR/report.md "
        "and DIR/report.json with a verdict per finding (reproduced / not reproduced / inconclusive at this "
        "scale) decided by 95% confidence intervals. A rerun continues where the last one stopped. "
        f"Findings: {listing}.",
    )
    p.add_argument("findings", nargs="*", metavar="FINDING",
                   help="which findings (default: all but infill, which runs only when named); e.g. f1 f3 orders")
    p.add_argument("--out", type=path_arg, required=True, help="output directory (runs, analyses, figures, report)")
    p.add_argument("--seeds", type=int_arg(ge=1, le=1000), default=None,
                   help="seeds per run for every finding (default: 3 for the training-recipe findings f1, f2, f3, "
                   "injection, ema, adaln-ema and infill, decided by intervals over seeds, and 1 for the others; "
                   "--quick: 1)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the whole pipeline (~1 minute)")
    p.add_argument("--budget-minutes", type=finite_float(gt=0, le=10**6), default=None, metavar="M",
                   help="pick the training steps so that everything fits M minutes on this machine "
                   "(timed once, then fixed for DIR; with too few minutes for 3 seeds, one); default: the standard "
                   "scale (about 50 minutes of one core; about 25 with --jobs 2 on 2 free cores)")
    p.add_argument("--device", default="cpu", help="cpu (default: the documented scale), cuda, auto")
    p.add_argument("--jobs", type=int_arg(ge=1, le=256), default=1, metavar="N",
                   help="train N runs side by side, each in its own process with its share of the threads "
                   "(default 1; on 2 cores --jobs 2 is faster: docs/reproduce.md); resumable as ever")
    p.add_argument("--no-progress", action="store_true", help="no progress bars or heartbeat lines")
    add_common(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from aogpt.reproduce import reproduce

    try:
        report = reproduce(args.out, args.findings, seeds=args.seeds, seed=args.seed, quick=args.quick,
                           budget_minutes=args.budget_minutes, device=args.device,
                           show_progress=not args.no_progress, jobs=args.jobs)
    except KeyboardInterrupt:
        print(f"interrupted: finished work is kept in {args.out}; run the same command again to continue",
              file=sys.stderr)
        return 130
    print(f"scale: {report['scale']['description']}")
    for finding in report["findings"]:
        print(f"{finding['title']}: {finding['verdict']}")
    print(f"report: {report['files']['markdown']}")
    if args.json:
        emit_json(report)
    return 0
