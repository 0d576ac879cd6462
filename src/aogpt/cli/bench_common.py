"""What the `aogpt bench` subcommands share: checked number types, the size and run flags (and the
size they give), the output folder and thread choice, the progress bar, and the report printed at the
end. Each room's benchmarks are registered in its own file (cli/bench_generation.py, bench_training.py,
bench_serve.py, bench_gpu.py); cli/bench.py only builds `aogpt bench` and calls them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from aogpt.cli.common import add_common, config_arg, emit_json, finite_float, int_arg, path_arg, progress
from aogpt.config import ModelConfig
from aogpt.errors import AOGPTError

LENGTH = config_arg(ModelConfig, "block_size")  # tokens per sequence: a model context
REPEATS = int_arg(ge=1, le=1000)  # runs per measurement (or timed steps)
BATCH = int_arg(ge=1, le=2**20)
THREADS = int_arg(ge=1, le=4096)
LONG_RUN = finite_float(gt=0, le=1e6)  # seconds
EPILOG = "Random weights by default (timing does not depend on them); see docs/benchmarks.md."


def size_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model size (equal for every contender; default 4 layers / 256 / 4 heads / 8192)")
    g.add_argument("--layers", type=config_arg(ModelConfig, "n_layer"), default=None, metavar="L",
                   help="transformer blocks")
    g.add_argument("--width", type=config_arg(ModelConfig, "n_embd"), default=None, metavar="D", help="embedding width")
    g.add_argument("--heads", type=config_arg(ModelConfig, "n_head"), default=None, metavar="H", help="attention heads")
    g.add_argument("--vocab", type=config_arg(ModelConfig, "vocab_size"), default=None, metavar="V",
                   help="vocabulary size")


def pick(value: Any, quick: dict[str, Any], key: str, default: Any, is_quick: bool) -> Any:
    """A flag's value as given, else the quick configuration's (with --quick), else the default."""
    if value is not None:
        return value
    return quick[key] if is_quick and key in quick else default


def size_of(args: argparse.Namespace, quick: Any) -> Any:
    """Size flags over the quick or default size; None (no flags, not quick): the checkpoints' size."""
    from aogpt.bench.common import DEFAULT_SIZE, Size

    flags = (args.layers, args.width, args.heads, args.vocab)
    if all(f is None for f in flags):
        return quick if args.quick else None
    base = quick if args.quick else DEFAULT_SIZE
    values = [f if f is not None else b
              for f, b in zip(flags, (base.n_layer, base.n_embd, base.n_head, base.vocab_size), strict=True)]
    if min(values) < 1 or values[1] % values[2]:
        raise AOGPTError(f"bad model size (layers, width, heads, vocab) = {tuple(values)}",
                         "use positive values and a width divisible by --heads")
    return Size(*values)


def run_flags(p: argparse.ArgumentParser, checkpoints: bool = True, device: bool = True) -> None:
    p.add_argument("--quick", action="store_true", help="a tiny smoke configuration that runs in seconds")
    if device:
        p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
        p.add_argument("--threads", type=THREADS, default=None, metavar="N",
                       help="CPU threads for torch (default: torch's)")
    p.add_argument("--out", type=path_arg, default=Path("bench-results"), metavar="DIR",
                   help="where the markdown table and JSON (and PNG) go (default bench-results)")
    if checkpoints:
        p.add_argument("--checkpoint", action="append", default=[], metavar="VARIANT=PATH",
                       help="time trained weights instead of random ones (repeatable; sizes must match)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_common(p)


def setup(args: argparse.Namespace) -> None:
    """The output folder made (so an unwritable --out fails now, not after the timings); threads: as
    asked, else 1 when the machine is busier than it has CPUs (torch's threads would then wait on
    each other and timings swing by an order of magnitude)."""
    import os

    import torch

    from aogpt.io import ensure_writable_dir

    ensure_writable_dir(args.out)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    elif hasattr(os, "getloadavg") and os.getloadavg()[0] > (os.cpu_count() or 1):
        torch.set_num_threads(1)
        args.note = (f"the machine is busy (load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs): timing "
                     "with 1 thread (--threads N to choose)")  # told once the timing starts (`progress_bar`)


def usable_precisions(args: argparse.Namespace) -> list[str]:
    """`--dtype P,P,...` in the short names of `aogpt.precision`, less those this CPU cannot compute
    in (each said in one line, before any timing; all of them missing is refused)."""
    from aogpt.device import resolve_device
    from aogpt.precision import parse_list, usable_only

    names, skipped = usable_only(parse_list(args.dtype), resolve_device(args.device))
    for note in skipped:
        print(f"note: {note}", file=sys.stderr)
    return names


def report(args: argparse.Namespace, command: str, result: dict[str, Any], markdown: str) -> int:
    print(markdown)
    files = result.get("files", {})
    if files:
        print("\nwrote " + ", ".join(files.values()))
    if args.json:
        emit_json({"command": command, **{k: v for k, v in result.items() if k != "runs"}})
    return 0


def progress_bar(total: int, args: argparse.Namespace, desc: str):
    """A progress bar and its update(done, label); a note from `setup` is printed at the first
    update, after the benchmark has checked its input (so an input error prints alone)."""
    bar = progress(total=total, desc=desc, disable=args.no_progress)

    def update(done: int, label: str) -> None:
        note = getattr(args, "note", None)
        if note:
            bar.write(note, file=sys.stderr)
            args.note = None
        bar.set_postfix_str(label)
        bar.update(done - bar.n)

    return bar, update
