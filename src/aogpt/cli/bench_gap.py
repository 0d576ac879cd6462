"""`aogpt bench gap-length`: how often a model finds the length of a gap it is not told, against a
fixed guess (`aogpt.bench.gap_length`; docs/generation.md, "Gaps of unknown length")."""

from __future__ import annotations

import argparse
from typing import Any

from aogpt.cli.bench_common import progress_bar, report, run_flags, setup
from aogpt.cli.common import int_arg, path_arg

DEFAULTS = {"spans": 64, "seeds": 3}


def add_gap_length_benchmark(sub: Any) -> None:
    """Register `gap-length` under `aogpt bench`."""
    g = sub.add_parser("gap-length", help="the gap length an any-order model chooses, against the true one and a "
                       "fixed guess", description="Cut held-out spans of whole words out of a prepared data "
                       "directory's validation split, give the model the text on both sides without the length, and "
                       "compare the length it chooses from its exact likelihoods (importance sampling with its own "
                       "fills, 1, 4 and 16 per length) with the true one and with a fixed guess (the median length on "
                       "the training split): exact, within 1 and 2 tokens, and the bits per byte of the filled text. "
                       "Writes DIR/gap-length.md and .json.")
    g.add_argument("--checkpoint", metavar="RUN", type=path_arg, required=True,
                   help="an any-order decoder's run or ckpt-* directory")
    g.add_argument("--data", metavar="DIR", type=path_arg, required=True,
                   help="the prepared data directory the model was trained on (its val split is held out)")
    g.add_argument("--spans", type=int_arg(ge=1, le=100_000), default=None,
                   help=f"spans per seed (default {DEFAULTS['spans']})")
    g.add_argument("--seeds", type=int_arg(ge=1, le=100), default=None,
                   help=f"seeds, each its own spans and draws (default {DEFAULTS['seeds']})")
    g.add_argument("--weights", choices=("ema", "raw"), default="ema", help="EMA (default) or raw weights")
    run_flags(g, checkpoints=False, device=False)
    g.add_argument("--threads", type=int_arg(ge=1, le=4096), default=None, metavar="N",
                   help="CPU threads for torch (default: torch's, 1 on a busy machine)")
    g.set_defaults(func=run_gap_length)


def run_gap_length(args: argparse.Namespace) -> int:
    from aogpt.bench.gap_length import QUICK, bench_gap_length, to_markdown
    from aogpt.checkpoint import load
    from aogpt.data import PreparedData
    from aogpt.generation.length import check_model

    setup(args)
    data = PreparedData(args.data)
    loaded = load(args.checkpoint, weights=args.weights)
    check_model(loaded.model)
    spans = args.spans or (QUICK["spans"] if args.quick else DEFAULTS["spans"])
    seeds = args.seeds or (QUICK["seeds"] if args.quick else DEFAULTS["seeds"])
    extra = {k: v for k, v in QUICK.items() if k not in ("spans", "seeds")} if args.quick else {}
    bar, update = progress_bar(spans * seeds, args, "bench gap-length")
    try:
        result = bench_gap_length(loaded.model, loaded.tokenizer, data.split("val"), data.split("train"),
                                  spans=spans, seeds=seeds, seed=args.seed, out=args.out, progress=update,
                                  meta={"checkpoint": str(loaded.path), "step": loaded.step, "data": str(args.data),
                                        "weights": args.weights}, **extra)
    finally:
        bar.close()
    return report(args, "bench gap-length", {k: v for k, v in result.items() if k != "per_span"}, to_markdown(result))
