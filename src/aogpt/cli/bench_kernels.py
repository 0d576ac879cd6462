"""`aogpt bench attention`: the exact attention kernels side by side at a model's shapes, with the
kernel `auto` picks marked (`aogpt.bench.generation.attention`; docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from aogpt.cli.bench_common import REPEATS, progress_bar, report, run_flags, setup
from aogpt.cli.common import int_arg


def add_kernel_benchmarks(sub: Any) -> None:
    """Register `attention` under `aogpt bench`."""
    a = sub.add_parser("attention", help="the exact attention kernels (SDPA, explicit, fp32 SDPA) side by side",
                       description="Time every exact attention kernel on training (forward + backward, causal and "
                       "any-order masks), evaluation and decode-step shapes, in fp32 and bf16, each output checked "
                       "against float64 attention first; marks the fastest and the kernel `auto` picks. Writes "
                       "DIR/attention.md and .json.")
    a.add_argument("--batch", type=int_arg(ge=1, le=4096), default=16, help="sequences (default 16)")
    a.add_argument("--heads", type=int_arg(ge=1, le=256), default=3, help="attention heads (default 3)")
    a.add_argument("--block", type=int_arg(ge=2, le=8192), default=128, help="keys per sequence (default 128)")
    a.add_argument("--head-dim", type=int_arg(ge=1, le=1024), default=64, help="head size (default 64)")
    a.add_argument("--decode-queries", type=int_arg(ge=1, le=8192), default=8,
                   help="queries of the decode-step case (default 8)")
    a.add_argument("--dtype", default="fp32,bf16", metavar="P,P,...",
                   help="precisions: fp32 (float32), bf16 (bfloat16), fp16 (float16), fp64 (float64) (default "
                   "fp32,bf16; one this CPU cannot compute in is skipped with a note)")
    a.add_argument("--repeats", type=REPEATS, default=15, help="timed calls per kernel, median reported (default 15)")
    run_flags(a, checkpoints=False)
    a.set_defaults(func=run_attention)


def run_attention(args: argparse.Namespace) -> int:
    from aogpt.bench.generation.attention import bench_attention
    from aogpt.bench.generation.attention import to_markdown as attention_markdown
    from aogpt.device import resolve_device
    from aogpt.precision import WEIGHTS, parse_list, usable_only

    setup(args)
    names, skipped = usable_only(parse_list(args.dtype, tuple(n for n in WEIGHTS if n != "auto")),
                                 resolve_device(args.device))  # refused before any work
    dtypes = tuple(names)
    for note in skipped:
        print(f"note: {note}", file=sys.stderr)
    if args.quick:
        args.batch, args.heads, args.block, args.head_dim, args.decode_queries, args.repeats = 2, 2, 16, 8, 2, 2
    bar, update = progress_bar(4 * len(dtypes), args, "bench attention")
    try:
        result = bench_attention(batch=args.batch, heads=args.heads, block=args.block, head_dim=args.head_dim,
                                 decode_queries=min(args.decode_queries, args.block - 1), dtypes=dtypes,
                                 repeats=args.repeats, device=args.device, seed=args.seed, out=args.out,
                                 progress=update)
    finally:
        bar.close()
    return report(args, "bench attention", result, attention_markdown(result))
