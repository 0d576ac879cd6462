"""`aogpt bench`: the parser, and each room's benchmarks registered under it. The benchmarks themselves
live in one CLI file per room (the index: `aogpt.bench`'s docstring):

- cli/bench_generation.py: generate, density, speculative, adaptive, attention;
- cli/bench_training.py: train, eval, prepare, recipe, adapt;
- cli/bench_serve.py: serve;
- cli/bench_gpu.py: gpu;
- cli/bench_common.py: the flags and helpers they share.

A new benchmark goes in its room's file and `BENCHMARKS` table; nothing here changes (it is listed
after those of `ORDER`). Behaviour and decisions: docs/benchmarks.md."""

from __future__ import annotations

import argparse
from typing import Any

from aogpt.cli import bench_generation, bench_gpu, bench_serve, bench_training
from aogpt.cli.bench_common import EPILOG
from aogpt.errors import AOGPTError

HELP = ("speed benchmarks: generation time vs steps (paper Fig. 5), exact-likelihood cost, training steps, "
        "evaluation, data preparation, puzzle solving with adaptive orders; and the recipe sweep (what learns most "
        "for a fixed compute)")
ROOMS = (bench_generation, bench_training, bench_serve, bench_gpu)
# the order `aogpt bench --help` lists them in; a benchmark not named here comes after, in its room's order
ORDER = ("generate", "density", "speculative", "gated", "train", "eval", "prepare", "adaptive", "recipe", "adapt",
         "attention", "serve", "gpu")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help=HELP, description=HELP + ". " + EPILOG)
    sub = p.add_subparsers(dest="bench", metavar="BENCHMARK", parser_class=type(p))
    p.set_defaults(func=_missing)
    adders = {name: add for room in ROOMS for name, add in room.BENCHMARKS.items()}
    for name in sorted(adders, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER)):
        adders[name](sub)


def _missing(args: argparse.Namespace) -> int:
    raise AOGPTError("no benchmark named",
                     "use `aogpt bench generate`, `speculative`, `density`, `train`, `eval`, `prepare`, `adaptive`, "
                     "`recipe`, `serve` or `gpu` "
                     "(`aogpt bench --help`)")
