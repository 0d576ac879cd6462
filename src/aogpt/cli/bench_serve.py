"""`aogpt bench serve`: the HTTP server under concurrent clients against the same requests one at a
time, and a bounded soak (`aogpt.bench.serve.clients`; docs/serve.md)."""

from __future__ import annotations

import argparse
from typing import Any

from aogpt.cli.bench_common import LENGTH, REPEATS, THREADS, progress_bar, report, run_flags, setup
from aogpt.cli.common import finite_float, int_arg, path_arg

DEFAULTS = {"requests": 64, "clients": 16, "max_tokens": 64, "repeats": 3}
MIXED = {"clients": 32, "duration": 600.0}  # the mixed soak's defaults (--quick: 8 clients for 20 s)
MAX_CLIENTS = 256


def add_serve(sub: Any) -> None:
    """`aogpt bench serve`."""
    s = sub.add_parser("serve", help="the HTTP server: N concurrent clients against one request at a time",
                       description="Start `aogpt serve` on the loopback interface, send the same requests (each its "
                       "own seed, a random order) one at a time and from N concurrent clients, and decode them "
                       "in-process with generate() one at a time and N at a time, round after round: tokens/s, wall "
                       "and CPU time, p50/p99 latency and the share of outputs identical to generate(), with the "
                       "goals (N concurrent at least 4x one at a time, within 1.25x of generate() N at a time); "
                       "optionally a bounded soak that counts lost, duplicated and wrong answers. Writes "
                       "DIR/serve.md and .json.")
    s.add_argument("--checkpoint", metavar="RUN", type=path_arg, required=True, help="run or ckpt-* directory to serve")
    s.add_argument("--clients", type=int_arg(ge=1, le=MAX_CLIENTS), default=None,
                   help=f"concurrent clients, 1..{MAX_CLIENTS} (default {DEFAULTS['clients']})")
    s.add_argument("--requests", type=int_arg(ge=1, le=100_000), default=None,
                   help=f"requests per round, 1..100000 (default {DEFAULTS['requests']})")
    s.add_argument("--max-tokens", type=LENGTH, default=None,
                   help=f"tokens per request (default {DEFAULTS['max_tokens']}; at most the model's context)")
    s.add_argument("--repeats", type=REPEATS, default=None,
                   help=f"rounds, each contender once per round (default {DEFAULTS['repeats']})")
    s.add_argument("--duration", type=finite_float(ge=0, le=86_400), default=None, metavar="S",
                   help="then a soak: the clients send requests in a loop for S seconds (default 0: none; with "
                   f"--workload mixed, the soak's length, default {MIXED['duration']:.0f})")
    s.add_argument("--workload", choices=("uniform", "mixed"), default="uniform",
                   help="uniform (default): the same unconditional requests one at a time and from N clients; "
                   "mixed: only a soak of six request kinds with seeds, streams, streams cut by their client and "
                   f"malformed requests (default {MIXED['clients']} clients), then SIGTERM under that load: "
                   "answered/refused/unanswered, latency, /health latency, engine stalls, memory (DIR/serve-soak.md)")
    s.add_argument("--threads", type=THREADS, default=None, metavar="N",
                   help="torch threads, for the server and the in-process rows (default: torch's, 1 on a busy "
                   "machine)")
    run_flags(s, checkpoints=False, device=False)
    s.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    import torch

    from aogpt.bench.serve.clients import QUICK, bench_serve, to_markdown

    setup(args)
    if args.workload == "mixed":
        from aogpt.bench.serve.soak import to_markdown as soak_markdown

        clients = args.clients or (8 if args.quick else MIXED["clients"])
        duration = args.duration if args.duration is not None else 20.0 if args.quick else MIXED["duration"]
        bar, update = progress_bar(100, args, "bench serve (mixed soak)")
        try:
            result = bench_serve(args.checkpoint, clients, 0, 0, 0, duration, torch.get_num_threads(), args.seed,
                                 args.out, update, workload="mixed")
        finally:
            bar.close()
        return report(args, "bench serve", result, soak_markdown(result))
    pick = {k: getattr(args, k) if getattr(args, k) is not None else (QUICK if args.quick else DEFAULTS)[k]
            for k in DEFAULTS}
    duration = args.duration or 0.0
    bar, update = progress_bar(4 * pick["repeats"] + (duration > 0), args, "bench serve")
    try:
        result = bench_serve(args.checkpoint, pick["clients"], pick["requests"], pick["max_tokens"], pick["repeats"],
                             duration, torch.get_num_threads(), args.seed, args.out, update)
    finally:
        bar.close()
    return report(args, "bench serve", result, to_markdown(result))


BENCHMARKS = {"serve": add_serve}
"""Each benchmark of this room and what registers it under `aogpt bench` (cli/bench.py calls them)."""
