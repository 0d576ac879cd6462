"""`aogpt bench gpu`: check and measure every GPU path in one run planned for 8 minutes (`aogpt.bench.gpu.run`;
docs/gpu.md). Exit status 0 when every check passed, 1 when one failed or a part broke, 2 on bad input."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from aogpt.cli.bench_common import run_flags, setup
from aogpt.cli.common import emit_json
from aogpt.errors import AOGPTError

HELP = "measure and check every GPU path (Figure 5, training throughput, correctness, DDP/FSDP2), planned for 8 minutes"


def add_gpu(sub: Any) -> None:
    """`aogpt bench gpu`."""
    g = sub.add_parser("gpu", help=HELP, description=(
        "On the first CUDA device, in this order: the paper's Figure 5 at GPT-2 small's size (n = 1024, batch 32; "
        "our GPT and AO-GPT with their decode steps captured as CUDA graphs), training throughput (compiled, "
        "bf16, fused AdamW: tokens/s, MFU, peak memory against the dry-run estimate), correctness checks "
        "(attention kernels, KV cache = recomputation in fp32 and bf16, a chi-square test of the sampler's law, "
        "likelihood and a training step against the CPU, a checkpoint written on the GPU loaded on the CPU), "
        "and DDP / FSDP2 under torchrun against one process. Each part is isolated and has a time share it cannot "
        "overrun; DIR/gpu.md, gpu.json and gpu-figure5.png are rewritten after every part. Exit status 0 when "
        "every check passed, 1 otherwise. See docs/gpu.md."))
    g.add_argument("--dry-run", action="store_true",
                   help="print the plan (sizes, steps, each part's estimated time at H100 rates) and exit: 0 when "
                   "it fits 8 minutes, 1 when not; runs nothing, writes nothing")
    g.add_argument("--parts", default=None, metavar="P,P,...",
                   help="run only these parts: figure5, training, correctness, distributed (default: all)")
    run_flags(g, checkpoints=False)
    g.set_defaults(func=run_gpu)


def _parts(spec: str | None) -> list[str] | None:
    from aogpt.bench.gpu.plan import PARTS

    if spec is None:
        return None
    names = [p.strip() for p in spec.split(",") if p.strip()]
    bad = [p for p in names if p not in PARTS]
    if bad or not names:
        raise AOGPTError(f"unknown part(s) {', '.join(bad) or '(none given)'}", f"choose from: {', '.join(PARTS)}")
    return names


def run_gpu(args: argparse.Namespace) -> int:
    import torch

    from aogpt.bench.gpu.plan import FULL, QUICK, estimate
    from aogpt.bench.gpu.report import plan_markdown

    only = _parts(args.parts)
    plan = QUICK if args.quick else FULL
    if args.dry_run:
        est = estimate(plan, torch.cuda.device_count() if torch.cuda.is_available() else 1)
        print(plan_markdown(plan, est))
        if args.json:
            emit_json({"command": "bench gpu --dry-run", "quick": plan.quick, "fits": est["fits"],
                       "total_seconds": est["total_seconds"], "limit_seconds": est["limit_seconds"],
                       "parts": {p: v["seconds"] for p, v in est["parts"].items()}})
        return 0 if est["fits"] else 1
    from aogpt.device import resolve_device

    device = resolve_device(args.device)
    if device.type != "cuda" and not args.quick:
        raise AOGPTError(f"the full plan needs a CUDA device, and this run has {device}",
                         "run it on a machine with a GPU, or pass --quick for the tiny plan on the CPU")
    setup(args)
    from aogpt.bench.gpu.run import Run, default_parts
    from aogpt.io import directory_lock

    parts = {p: f for p, f in default_parts().items() if only is None or p in only}
    say, close = _reporter(len(parts), args)
    if getattr(args, "note", None):
        say("detail", args.note)
    previous = signal.signal(signal.SIGTERM, _stopped)  # a time limit's SIGTERM: clean up, keep the report
    try:
        with directory_lock(args.out, "aogpt bench gpu", inside=True):
            run = Run(plan, device, seed=args.seed, out=args.out, parts=parts, say=say)
            summary = run.execute()
    finally:
        signal.signal(signal.SIGTERM, previous)
        close()
    from aogpt.bench.gpu.report import to_markdown

    print(to_markdown(summary))
    if summary["files"]:
        print("\nwrote " + ", ".join(summary["files"].values()))
    if args.json:
        emit_json({"command": "bench gpu", "passed": summary["passed"], "quick": summary["quick"],
                   "checks": summary["checks"], "parts": {n: p["status"] for n, p in summary["parts"].items()},
                   "seconds": summary["seconds"], "files": summary["files"]})
    return 0 if summary["passed"] else 1


def _stopped(signum: int, frame: Any) -> None:
    """SIGTERM (a time limit): leave through the `finally` blocks (torchrun's ranks are ended, the lock
    released); the report on disk holds every part finished, the one running marked so."""
    print(f"stopped by signal {signum}: the report holds the parts finished so far", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


def _reporter(total: int, args: argparse.Namespace) -> tuple[Any, Any]:
    """(say(kind, line), close()): one progress line per finished part (aogpt.progress: a bar on a
    terminal, else a heartbeat line at every part), the start of each part and the steps within it."""
    from aogpt.progress import Heartbeat, progress

    if args.no_progress:
        bar = progress(total=total, disable=True)
        return (lambda kind, line: None), bar.close
    if sys.stderr.isatty():
        bar = progress(total=total, desc="bench gpu", unit="part")
        write = bar.write
    else:
        bar = Heartbeat(total, "bench gpu", unit="part", interval=0.0, file=sys.stderr)

        def write(line: str) -> None:
            print(line, file=sys.stderr, flush=True)

    def say(kind: str, line: str) -> None:
        if kind == "end":
            bar.set_postfix_str(line)
            bar.update(1)
        else:
            write(("  " if kind == "detail" else "") + line)

    def close() -> None:
        if isinstance(bar, Heartbeat):
            bar.closed = True  # every part already printed its line; no repeat of the last
        else:
            bar.close()

    return say, close


BENCHMARKS = {"gpu": add_gpu}
"""Each benchmark of this room and what registers it under `aogpt bench` (cli/bench.py calls them)."""
