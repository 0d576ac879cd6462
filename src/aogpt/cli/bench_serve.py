"""`aogpt bench serve`: the HTTP server under concurrent clients against the same requests one at a
time, and a bounded soak (`aogpt.bench.serve`; docs/serve.md)."""

from __future__ import annotations

import argparse
from typing import Any

from aogpt.cli.bench_common import LENGTH, REPEATS, THREADS, progress_bar, report, run_flags, setup
from aogpt.cli.common import finite_float, int_arg, path_arg

DEFAULTS = {"requests": 64, "clients": 16, "max_tokens": 64, "repeats": 3}
MAX_CLIENTS = 256


def add_serve_benchmark(sub: Any) -> None:
    """Register `serve` under `aogpt bench`."""
    s = sub.add_parser("serve", help="the HTTP server: N concurrent clients against one request at a time",
                       description="Start `aogpt serve` on the loopback interface, send the same requests (each its "
                       "own seed) one at a time and from N concurrent clients, round after round: tokens/s, p50/p99 "
                       "latency, the server's CPU time and the share of outputs identical to the one-at-a-time run "
                       "and to generate(); in-process generate() rows for reference; optionally a bounded soak that "
                       "counts lost, duplicated and wrong answers. Writes DIR/serve.md and .json.")
    s.add_argument("--checkpoint", metavar="RUN", type=path_arg, required=True, help="run or ckpt-* directory to serve")
    s.add_argument("--clients", type=int_arg(ge=1, le=MAX_CLIENTS), default=None,
                   help=f"concurrent clients, 1..{MAX_CLIENTS} (default {DEFAULTS['clients']})")
    s.add_argument("--requests", type=int_arg(ge=1, le=100_000), default=None,
                   help=f"requests per round, 1..100000 (default {DEFAULTS['requests']})")
    s.add_argument("--max-tokens", type=LENGTH, default=None,
                   help=f"tokens per request (default {DEFAULTS['max_tokens']}; at most the model's context)")
    s.add_argument("--repeats", type=REPEATS, default=None,
                   help=f"rounds, each contender once per round (default {DEFAULTS['repeats']})")
    s.add_argument("--duration", type=finite_float(ge=0, le=86_400), default=0.0, metavar="S",
                   help="then a soak: the clients send requests in a loop for S seconds (default 0: none)")
    s.add_argument("--threads", type=THREADS, default=None, metavar="N",
                   help="torch threads, for the server and the in-process rows (default: torch's, 1 on a busy "
                   "machine)")
    run_flags(s, checkpoints=False, device=False)
    s.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    import torch

    from aogpt.bench.serve import QUICK, bench_serve, to_markdown

    setup(args)
    pick = {k: getattr(args, k) if getattr(args, k) is not None else (QUICK if args.quick else DEFAULTS)[k]
            for k in DEFAULTS}
    bar, update = progress_bar(4 * pick["repeats"] + (args.duration > 0), args, "bench serve")
    try:
        result = bench_serve(args.checkpoint, pick["clients"], pick["requests"], pick["max_tokens"], pick["repeats"],
                             args.duration, torch.get_num_threads(), args.seed, args.out, update)
    finally:
        bar.close()
    return report(args, "bench serve", result, to_markdown(result))
