"""`aogpt bench generate|density|train|eval|prepare`: the paper's speed comparisons, and the cost of
evaluation and of data preparation, on your hardware. Behaviour and decisions: docs/benchmarks.md."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from aogpt.cli.common import add_common, emit_json, progress
from aogpt.errors import AOGPTError

HELP = ("speed benchmarks: generation time vs steps (paper Fig. 5), exact-likelihood cost, training steps, "
        "evaluation, data preparation; and the recipe sweep (what learns most for a fixed compute)")
EPILOG = "Random weights by default (timing does not depend on them); see docs/benchmarks.md."


def _size_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model size (equal for every contender; default 4 layers / 256 / 4 heads / 8192)")
    g.add_argument("--layers", type=int, default=None, metavar="L", help="transformer blocks")
    g.add_argument("--width", type=int, default=None, metavar="D", help="embedding width")
    g.add_argument("--heads", type=int, default=None, metavar="H", help="attention heads")
    g.add_argument("--vocab", type=int, default=None, metavar="V", help="vocabulary size")


def _run_flags(p: argparse.ArgumentParser, checkpoints: bool = True, device: bool = True) -> None:
    p.add_argument("--quick", action="store_true", help="a tiny smoke configuration that runs in seconds")
    if device:
        p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
        p.add_argument("--threads", type=int, default=None, metavar="N",
                       help="CPU threads for torch (default: torch's)")
    p.add_argument("--out", type=Path, default=Path("bench-results"), metavar="DIR",
                   help="where the markdown table and JSON (and PNG) go (default bench-results)")
    if checkpoints:
        p.add_argument("--checkpoint", action="append", default=[], metavar="VARIANT=PATH",
                       help="time trained weights instead of random ones (repeatable; sizes must match)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_common(p)


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help=HELP, description=HELP + ". " + EPILOG)
    sub = p.add_subparsers(dest="bench", metavar="BENCHMARK", parser_class=type(p))
    p.set_defaults(func=_missing)

    g = sub.add_parser("generate", help="generation time against steps T: AO-GPT, encoder MDM, AR gpt",
                       description="Time AO-GPT (KV cache + Lemma 4.1, and the count schedule), AO-GPT without cache, "
                       "the encoder-only MDM with and without no-op skipping, our left-to-right GPT and transformers' "
                       "GPT-2, at equal size, batch and n, side by side, over T; writes DIR/generate.md, .json and "
                       ".png (paper Figure 5). " + EPILOG)
    g.add_argument("--n", type=int, default=None, help="sequence length (default 256; try 1024 on a GPU)")
    g.add_argument("--batch", type=int, default=None, help="sequences per batch (default 8)")
    g.add_argument("--steps", default=None, metavar="T,T,...", help="generation steps (default 16,32,64,128,256)")
    g.add_argument("--methods", default=None, metavar="M,M,...",
                   help="aogpt, aogpt-count, aogpt-nocache, encoder, encoder-noskip, encoder-est (T x one timed "
                   "pass: for long n), gpt, hf-gpt2 (transformers GPT-2; default: all but encoder-est)")
    g.add_argument("--top-p", type=float, default=1.0,
                   help="nucleus sampling threshold for every contender (default 1)")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for every contender")
    g.add_argument("--repeats", type=int, default=None, help="runs per measurement, median reported (default 3)")
    g.add_argument("--long-run", type=float, default=20.0, metavar="S",
                   help="measurements whose first run takes longer than S seconds are not repeated (default 20)")
    _size_flags(g)
    _run_flags(g)
    g.set_defaults(func=run_generate)

    d = sub.add_parser("density", help="cost of one exact likelihood: decoder 1 pass vs encoder n passes",
                       description="Time the exact NLL of a sequence under one order: AO-GPT and gpt in one causal "
                       "pass, the encoder-only MDM in n passes; writes DIR/density.md and .json. " + EPILOG)
    d.add_argument("--n", type=int, default=None, help="sequence length (default 256)")
    d.add_argument("--batch", type=int, default=None, help="sequences scored together (default 1)")
    d.add_argument("--repeats", type=int, default=None, help="runs per measurement, median reported (default 3)")
    d.add_argument("--long-run", type=float, default=20.0, metavar="S", help="do not repeat runs longer than S s")
    _size_flags(d)
    _run_flags(d)
    d.set_defaults(func=run_density)

    t = sub.add_parser("train", help="training-step throughput of gpt, sigma, aogpt and encoder-mdm",
                       description="Time the real training step (forward, backward, AdamW, EMA) of every variant at "
                       "equal size, with ratios to gpt and the paper code's reference figures; writes "
                       "DIR/train.md and .json.")
    t.add_argument("--block", type=int, default=None, help="tokens per sequence (default 256)")
    t.add_argument("--batch", type=int, default=None, help="sequences per step (default 8)")
    t.add_argument("--variants", default=None, metavar="V,V,...", help="default gpt,sigma,aogpt,encoder-mdm")
    t.add_argument("--steps", type=int, default=None, help="timed steps per variant, median reported (default 5)")
    t.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 2)")
    _size_flags(t)
    _run_flags(t, checkpoints=False)
    t.set_defaults(func=run_train)

    e = sub.add_parser("eval", help="evaluation tokens/s against training, and the cost of an ensemble member",
                       description="Time, on one AO-GPT and one batch, a training step (forward, backward, AdamW), "
                       "evaluation left to right and under a random order, and random-order evaluation of a few "
                       "sequences with and without an ensemble of M members; wall and CPU time, repeats "
                       "interleaved; writes DIR/eval.md and .json. " + EPILOG)
    e.add_argument("--n", type=int, default=None, help="sequence length (default 128)")
    e.add_argument("--batch", type=int, default=None, help="sequences per batch (default 16)")
    e.add_argument("--members", type=int, default=None, metavar="M",
                   help="ensemble size for the per-member cost, at least 2 (default 4)")
    e.add_argument("--repeats", type=int, default=None, help="runs per measurement, median reported (default 5)")
    e.add_argument("--long-run", type=float, default=20.0, metavar="S", help="do not repeat runs longer than S s")
    _size_flags(e)
    _run_flags(e, checkpoints=False)
    e.set_defaults(func=run_eval)

    r = sub.add_parser("prepare", help="time `aogpt prepare`, or tokenizer worker processes against threads",
                       description="Time cold runs of `aogpt prepare CORPUS --tokenizer SPEC` in this process "
                       "(wall and CPU time, one run's stages), or with --workers-bench in-process tokenization "
                       "against worker processes on a synthetic corpus; writes DIR/prepare.md and .json "
                       "(DIR/prepare-workers.* with --workers-bench).")
    r.add_argument("--corpus", default=None, help="what `aogpt prepare --corpus` takes (default shakespeare)")
    r.add_argument("--tokenizer", default="gpt2", metavar="SPEC", help="gpt2, bytes or bpe:N (default gpt2)")
    r.add_argument("--max-docs", type=int, default=None, metavar="N", help="documents at most (quick: 4)")
    r.add_argument("--repeats", type=int, default=None, help="runs per measurement, median reported (default 5; "
                   "3 with --workers-bench)")
    r.add_argument("--threads", type=int, default=None, metavar="N",
                   help="gpt2's tokenizer threads (default: one per CPU, at most 8)")
    w = r.add_argument_group("--workers-bench: in-process tokenization against worker processes")
    w.add_argument("--workers-bench", action="store_true", help="time this instead of prepare of a corpus")
    w.add_argument("--workers", type=int, default=None, metavar="N", help="worker processes (default 2)")
    w.add_argument("--synthetic-mb", type=float, default=None, metavar="MB",
                   help="megabytes of synthetic text (default 40; quick 0.5)")
    _run_flags(r, checkpoints=False, device=False)
    r.set_defaults(func=run_prepare)

    s = sub.add_parser("recipe", help="which small training recipe learns most on Shakespeare for a fixed compute",
                       description="Train AO-GPT candidates (the cpu-small preset with fields changed) for a fixed "
                       "number of steps or CPU seconds each, one after another, and score them on the held-out plays "
                       "in bits per byte; writes DIR/recipe.md and .json after every candidate. CPU time, not wall "
                       "time, so a shared machine does not decide the result; one thread unless --threads.")
    s.add_argument("--candidates", default=None, metavar="NAME,...",
                   help="registered candidates (default: all of the recorded sweep)")
    s.add_argument("--candidate", action="append", default=[], metavar="NAME:key=value,...",
                   help="an ad-hoc candidate, e.g. wide:n_embd=256,lr=3e-3 (repeatable; a registered NAME is "
                   "its base)")
    budget = s.add_mutually_exclusive_group()
    budget.add_argument("--steps", type=int, default=None, help="training steps per candidate")
    budget.add_argument("--cpu-seconds", type=float, default=None, metavar="S",
                        help="CPU seconds of training per candidate (steps sized by a short probe)")
    s.add_argument("--eval-bytes", type=int, default=None, metavar="B",
                   help="score on the first B bytes of the held-out text (default: all of it)")
    s.add_argument("--minutes", type=float, default=10.0, help="time budget for 'steps in budget' (default 10)")
    s.add_argument("--speedup", type=float, default=None, metavar="X",
                   help="what the quiet machine's threads gain over one (from --calibrate) for 'steps in budget'")
    s.add_argument("--calibrate", type=int, default=None, metavar="N",
                   help="instead of the sweep: time one step with 1 and N threads, interleaved (quiet machine only)")
    s.add_argument("--data-root", type=Path, default=Path("data"), metavar="DIR",
                   help="where the prepared Shakespeare folders are (made if missing; default data)")
    s.add_argument("--threads", type=int, default=1, metavar="N", help="CPU threads for torch (default 1)")
    _run_flags(s, checkpoints=False, device=False)
    s.set_defaults(func=run_recipe)


def _missing(args: argparse.Namespace) -> int:
    raise AOGPTError("no benchmark named",
                     "use `aogpt bench generate`, `density`, `train`, `eval` or `prepare` (`aogpt bench --help`)")


def _pick(value: Any, quick: dict[str, Any], key: str, default: Any, is_quick: bool) -> Any:
    if value is not None:
        return value
    return quick[key] if is_quick and key in quick else default


def _size(args: argparse.Namespace, quick: Any) -> Any:
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


def _setup(args: argparse.Namespace) -> None:
    """Threads: as asked, else 1 when the machine is busier than it has CPUs (torch's threads would
    then wait on each other and timings swing by an order of magnitude)."""
    import os
    import sys

    import torch

    if args.threads is not None:
        if args.threads < 1:
            raise AOGPTError(f"--threads must be >= 1, got {args.threads}", "e.g. --threads 2")
        torch.set_num_threads(args.threads)
    elif hasattr(os, "getloadavg") and os.getloadavg()[0] > (os.cpu_count() or 1):
        torch.set_num_threads(1)
        print(f"the machine is busy (load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs): timing with 1 "
              "thread (--threads N to choose)", file=sys.stderr)


def _report(args: argparse.Namespace, command: str, result: dict[str, Any], markdown: str) -> int:
    print(markdown)
    files = result.get("files", {})
    if files:
        print("\nwrote " + ", ".join(files.values()))
    if args.json:
        emit_json({"command": command, **{k: v for k, v in result.items() if k != "runs"}})
    return 0


def _bar(total: int, args: argparse.Namespace, desc: str):
    bar = progress(total=total, desc=desc, disable=args.no_progress)

    def update(done: int, label: str) -> None:
        bar.set_postfix_str(label)
        bar.update(done - bar.n)

    return bar, update


def run_generate(args: argparse.Namespace) -> int:
    from aogpt.bench import generate as bg
    from aogpt.bench.common import parse_checkpoints, parse_int_list

    _setup(args)
    q = bg.QUICK
    steps = parse_int_list(args.steps, "steps") if args.steps else list(q["steps"] if args.quick else bg.DEFAULT_STEPS)
    methods = bg.check_methods([m.strip() for m in args.methods.split(",")]) if args.methods \
        else list(bg.DEFAULT_METHODS)
    n = _pick(args.n, q, "n", 256, args.quick)
    repeats = _pick(args.repeats, q, "repeats", 3, args.quick)
    total = repeats * sum(len(steps) if bg.METHODS[m].every_t else 1 for m in methods)
    bar, update = _bar(total, args, "bench generate")
    try:
        result = bg.bench_generate(
            n=n, batch=_pick(args.batch, q, "batch", 8, args.quick), steps=steps, size=_size(args, q["size"]),
            methods=methods, repeats=repeats, long_run=args.long_run, top_p=args.top_p, temperature=args.temperature,
            device=args.device, seed=args.seed,
            checkpoints=parse_checkpoints(args.checkpoint, ("aogpt", "gpt", "encoder-mdm")), out=args.out,
            progress=update)
    finally:
        bar.close()
    from aogpt.bench.generate_report import to_markdown

    return _report(args, "bench generate", result, to_markdown(result))


def run_density(args: argparse.Namespace) -> int:
    from aogpt.bench import density as bd
    from aogpt.bench.common import parse_checkpoints

    _setup(args)
    q = bd.QUICK
    repeats = _pick(args.repeats, q, "repeats", 3, args.quick)
    bar, update = _bar(repeats * len(bd.VARIANTS), args, "bench density")
    try:
        result = bd.bench_density(
            n=_pick(args.n, q, "n", 256, args.quick), batch=_pick(args.batch, q, "batch", 1, args.quick),
            size=_size(args, q["size"]), repeats=repeats,
            long_run=args.long_run, device=args.device, seed=args.seed,
            checkpoints=parse_checkpoints(args.checkpoint, bd.VARIANTS), out=args.out, progress=update)
    finally:
        bar.close()
    return _report(args, "bench density", result, bd.to_markdown(result))


def run_train(args: argparse.Namespace) -> int:
    from aogpt.bench import train_step as bt

    _setup(args)
    q = bt.QUICK
    variants = [v.strip() for v in args.variants.split(",")] if args.variants else list(bt.VARIANTS)
    steps = _pick(args.steps, q, "steps", 5, args.quick)
    bar, update = _bar(steps, args, "bench train")
    try:
        result = bt.bench_train(
            block=_pick(args.block, q, "block", 256, args.quick), batch=_pick(args.batch, q, "batch", 8, args.quick),
            size=_size(args, q["size"]), variants=variants, steps=steps,
            warmup=_pick(args.warmup, q, "warmup", 2, args.quick), device=args.device, seed=args.seed,
            out=args.out, progress=update)
    finally:
        bar.close()
    return _report(args, "bench train", result, bt.to_markdown(result))


def run_eval(args: argparse.Namespace) -> int:
    from aogpt.bench import eval as be

    _setup(args)
    q, d = be.QUICK, be.DEFAULTS
    repeats = _pick(args.repeats, q, "repeats", d["repeats"], args.quick)
    batch = _pick(args.batch, q, "batch", d["batch"], args.quick)
    bar, update = _bar(repeats * len(be.CONTENDERS), args, "bench eval")
    try:
        result = be.bench_eval(
            n=_pick(args.n, q, "n", d["n"], args.quick), batch=batch, size=_size(args, q["size"]),
            members=_pick(args.members, q, "members", d["members"], args.quick),
            ensemble_sequences=max(1, min(batch, _pick(None, q, "ensemble_sequences", d["ensemble_sequences"],
                                                       args.quick))),
            repeats=repeats, long_run=args.long_run, device=args.device, seed=args.seed, out=args.out,
            progress=update)
    finally:
        bar.close()
    return _report(args, "bench eval", result, be.to_markdown(result))


def run_prepare(args: argparse.Namespace) -> int:
    from aogpt.bench import prepare as bp

    q, d = bp.QUICK, bp.DEFAULTS
    if args.workers_bench:
        given = [f for f, v in (("--corpus", args.corpus), ("--max-docs", args.max_docs), ("--threads", args.threads))
                 if v is not None]
        if given:
            raise AOGPTError(f"{', '.join(given)}: not used by --workers-bench (a synthetic corpus, each mode with "
                             "its own threads)", "drop them, or drop --workers-bench to time prepare of a corpus")
        from aogpt.data.tokenizer import normalize_spec

        repeats = _pick(args.repeats, q, "repeats", 3, args.quick)
        modes = 3 if normalize_spec(args.tokenizer) == "gpt2" else 2
        bar, update = _bar(repeats * modes, args, "bench prepare --workers-bench")
        try:
            result = bp.bench_workers(
                tokenizer=args.tokenizer, workers=_pick(args.workers, q, "workers", d["workers"], args.quick),
                repeats=repeats, seed=args.seed, out=args.out,
                synthetic_mb=_pick(args.synthetic_mb, q, "synthetic_mb", d["synthetic_mb"], args.quick),
                progress=update)
        finally:
            bar.close()
        return _report(args, "bench prepare", result, bp.workers_markdown(result))
    given = [f for f, v in (("--workers", args.workers), ("--synthetic-mb", args.synthetic_mb)) if v is not None]
    if given:
        raise AOGPTError(f"{', '.join(given)}: only for --workers-bench", "add --workers-bench, or drop them")
    repeats = _pick(args.repeats, q, "repeats", d["repeats"], args.quick)
    bar, update = _bar(repeats, args, "bench prepare")
    try:
        result = bp.bench_prepare(
            corpus=args.corpus or "shakespeare", tokenizer=args.tokenizer, repeats=repeats,
            max_docs=_pick(args.max_docs, q, "max_docs", None, args.quick), threads=args.threads, seed=args.seed,
            out=args.out, progress=update)
    finally:
        bar.close()
    return _report(args, "bench prepare", result, bp.to_markdown(result))


def run_recipe(args: argparse.Namespace) -> int:
    import sys

    import torch

    from aogpt.bench import recipe as br

    if args.threads < 1:
        raise AOGPTError(f"--threads must be >= 1, got {args.threads}", "e.g. --threads 1")
    torch.set_num_threads(args.threads)
    names = [n.strip() for n in args.candidates.split(",") if n.strip()] if args.candidates else []
    if args.quick:
        names, args.candidate = [], [br.QUICK_CANDIDATE]
    elif not names and not args.candidate:
        names = list(br.CANDIDATES)
    candidates = [br.parse_candidate(n) for n in names] + [br.parse_candidate(c) for c in args.candidate]
    if args.calibrate is not None:
        if args.calibrate < 2:
            raise AOGPTError(f"--calibrate needs at least 2 threads, got {args.calibrate}", "e.g. --calibrate 2")
        rows = [br.thread_speedup(c, args.data_root, args.calibrate, seed=args.seed) for c in candidates]
        for r in rows:
            print(f"{r['name']}: {r['speedup']:.2f}x with {r['threads']} threads ({r['seconds_per_step']}, load "
                  f"average {r['load_average']})")
        if args.json:
            emit_json({"command": "bench recipe", "calibrate": rows})
        return 0
    steps, cpu_budget = args.steps, args.cpu_seconds
    if args.quick and steps is None and cpu_budget is None:
        steps = br.QUICK_STEPS
    if steps is None and cpu_budget is None:
        raise AOGPTError("no budget per candidate", "pass --steps N or --cpu-seconds S")
    if (steps is not None and steps < 1) or (cpu_budget is not None and cpu_budget <= 0):
        raise AOGPTError("the budget per candidate must be positive", "e.g. --steps 300 or --cpu-seconds 180")

    def say(line: str) -> None:
        if not args.no_progress:
            print(line, file=sys.stderr, flush=True)

    result = br.sweep(candidates, args.data_root, steps=steps, cpu_budget=cpu_budget,
                      eval_bytes=br.QUICK_EVAL_BYTES if args.quick and args.eval_bytes is None else args.eval_bytes,
                      minutes=args.minutes, speedup=args.speedup, seed=args.seed, out=args.out, progress=say)
    return _report(args, "bench recipe", result, br.to_markdown(result))
