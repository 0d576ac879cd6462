"""The training room of `aogpt bench` (`aogpt.bench.training`): `train` (training-step throughput of every
variant), `eval` (evaluation against training, and an ensemble member's cost), `prepare` (the cost of
`aogpt prepare`), `recipe` (which small training recipe learns most for a fixed compute) and `adapt`
(adapting a trained GPT against AO-GPT from scratch). Behaviour and decisions: docs/benchmarks.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from aogpt.cli.bench_common import (
    BATCH,
    EPILOG,
    LENGTH,
    LONG_RUN,
    REPEATS,
    THREADS,
    pick,
    progress_bar,
    report,
    run_flags,
    setup,
    size_flags,
    size_of,
    usable_precisions,
)
from aogpt.cli.common import emit_json, finite_float, int_arg, path_arg, positive_int
from aogpt.cli.prepare import MAX_WORKERS
from aogpt.errors import AOGPTError


def add_train(sub: Any) -> None:
    """`aogpt bench train`."""
    t = sub.add_parser("train", help="training-step throughput of gpt, sigma, aogpt and encoder-mdm",
                       description="Time the real training step (forward, backward, AdamW, EMA) of every variant at "
                       "equal size, interleaved, with ratios to gpt; writes DIR/train.md and .json.")
    t.add_argument("--block", type=LENGTH, default=None, help="tokens per sequence (default 256)")
    t.add_argument("--batch", type=BATCH, default=None, help="sequences per step (default 8)")
    t.add_argument("--variants", default=None, metavar="V,V,...", help="default gpt,sigma,aogpt,encoder-mdm")
    t.add_argument("--steps", type=REPEATS, default=None, help="timed steps per variant, median reported (default 5)")
    t.add_argument("--warmup", type=int_arg(ge=0, le=1000), default=None, help="untimed steps first (default 2)")
    t.add_argument("--dtype", default="auto", metavar="P,P,...",
                   help="precisions timed side by side: auto, fp32 (float32), bf16 (bfloat16), fp16 (float16) "
                   "(default auto: bf16 where the hardware has bf16 units; one this CPU cannot compute in is "
                   "skipped with a note)")
    t.add_argument("--preset", default=None, help="time this preset's model and training recipe (e.g. quickstart; "
                   "vocabulary from --vocab, default 512 with a preset)")
    t.add_argument("--profile", action="store_true",
                   help="also profile one step of each contender: share of time by operator kind")
    t.add_argument("--paths", default="eager", metavar="P,P,...",
                   help="how each step is run, timed side by side: eager (default: aogpt's kernels), compiled "
                   "(torch.compile; its compile time is reported), reference (the plain path: SDPA, slots in "
                   "reading order)")
    t.add_argument("--no-limit", action="store_true",
                   help="skip measuring the machine's matrix-product rate (and the steps' share at it)")
    size_flags(t)
    run_flags(t, checkpoints=False)
    t.set_defaults(func=run_train)


def add_eval(sub: Any) -> None:
    """`aogpt bench eval`."""
    e = sub.add_parser("eval", help="evaluation tokens/s against training, and the cost of an ensemble member",
                       description="Time, on one AO-GPT and one batch, a training step (forward, backward, AdamW), "
                       "evaluation left to right and under a random order, and random-order evaluation of a few "
                       "sequences with and without an ensemble of M members; wall and CPU time, repeats "
                       "interleaved; writes DIR/eval.md and .json. " + EPILOG)
    e.add_argument("--n", type=LENGTH, default=None, help="sequence length (default 128)")
    e.add_argument("--batch", type=BATCH, default=None, help="sequences per batch (default 16)")
    e.add_argument("--members", type=int_arg(ge=2, le=1024), default=None, metavar="M",
                   help="ensemble size for the per-member cost, at least 2 (default 4)")
    e.add_argument("--repeats", type=REPEATS, default=None, help="runs per measurement, median reported (default 5)")
    e.add_argument("--long-run", type=LONG_RUN, default=20.0, metavar="S", help="do not repeat runs longer than S s")
    size_flags(e)
    run_flags(e, checkpoints=False)
    e.set_defaults(func=run_eval)


def add_prepare(sub: Any) -> None:
    """`aogpt bench prepare`."""
    r = sub.add_parser("prepare", help="time `aogpt prepare`, or tokenizer worker processes against threads",
                       description="Time cold runs of `aogpt prepare CORPUS --tokenizer SPEC` in this process "
                       "(wall and CPU time, one run's stages), or with --workers-bench in-process tokenization "
                       "against worker processes on a synthetic corpus; writes DIR/prepare.md and .json "
                       "(DIR/prepare-workers.* with --workers-bench).")
    r.add_argument("--corpus", default=None, help="what `aogpt prepare --corpus` takes (default shakespeare)")
    r.add_argument("--tokenizer", default="gpt2", metavar="SPEC", help="gpt2, bytes or bpe:N (default gpt2)")
    r.add_argument("--max-docs", type=positive_int, default=None, metavar="N", help="documents at most (quick: 4)")
    r.add_argument("--repeats", type=REPEATS, default=None, help="runs per measurement, median reported (default 5; "
                   "3 with --workers-bench)")
    r.add_argument("--threads", type=THREADS, default=None, metavar="N",
                   help="gpt2's tokenizer threads (default: one per CPU, at most 8)")
    w = r.add_argument_group("--workers-bench: in-process tokenization against worker processes")
    w.add_argument("--workers-bench", action="store_true", help="time this instead of prepare of a corpus")
    w.add_argument("--workers", type=int_arg(ge=1, le=MAX_WORKERS), default=None, metavar="N",
                   help="worker processes (default 2)")
    w.add_argument("--synthetic-mb", type=finite_float(gt=0, le=1000), default=None, metavar="MB",
                   help="megabytes of synthetic text (default 40; quick 0.5)")
    run_flags(r, checkpoints=False, device=False)
    r.set_defaults(func=run_prepare)


def add_recipe(sub: Any) -> None:
    """`aogpt bench recipe`."""
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
    budget.add_argument("--steps", type=int_arg(ge=1, le=10**7), default=None, help="training steps per candidate")
    budget.add_argument("--cpu-seconds", type=finite_float(gt=0, le=10**7), default=None, metavar="S",
                        help="CPU seconds of training per candidate (steps sized by a short probe)")
    s.add_argument("--eval-bytes", type=int_arg(ge=1, le=10**12), default=None, metavar="B",
                   help="score on the first B bytes of the held-out text (default: all of it)")
    s.add_argument("--minutes", type=finite_float(gt=0, le=10**6), default=10.0,
                   help="time budget for 'steps in budget' (default 10)")
    s.add_argument("--speedup", type=finite_float(gt=0, le=10**4), default=None, metavar="X",
                   help="what the quiet machine's threads gain over one (from --calibrate) for 'steps in budget'")
    s.add_argument("--calibrate", type=int_arg(ge=2, le=4096), default=None, metavar="N",
                   help="instead of the sweep: time one step with 1 and N threads, interleaved (quiet machine only)")
    s.add_argument("--data-root", type=path_arg, default=Path("data"), metavar="DIR",
                   help="where the prepared Shakespeare folders are (made if missing; default data)")
    s.add_argument("--threads", type=int_arg(ge=1, le=4096), default=1, metavar="N",
                   help="CPU threads for torch (default 1; per run with --jobs)")
    s.add_argument("--seeds", type=int_arg(ge=1, le=1000), default=1, metavar="N",
                   help="runs per candidate, seeds --seed, --seed + 1, ...; figures get 95%% intervals (default 1)")
    s.add_argument("--jobs", type=int_arg(ge=1, le=256), default=1, metavar="N",
                   help="runs at a time, each in its own process (default 1)")
    s.add_argument("--curve-every", type=int_arg(ge=0, le=10**7), default=0, metavar="K",
                   help="also score the EMA weights every K steps: validation curves and DIR/recipe.png (default 0: "
                   "only at the end)")
    s.add_argument("--diagnose", action="store_true",
                   help="with --curve-every: also measure the target pathway there (adaLN modulation, gradients, "
                   "attention on the target's neighbours)")
    run_flags(s, checkpoints=False, device=False)
    s.set_defaults(func=run_recipe)


def add_adapt(sub: Any) -> None:
    """`aogpt bench adapt`."""
    t = sub.add_parser("adapt", help="fine-tuning recipes for an adapted GPT against AO-GPT from scratch",
                       description="Per seed, on Shakespeare (bpe:512) at the quickstart size (or --width): our GPT "
                       "trained S steps, adapted (aogpt adapt) and fine-tuned F steps with each candidate recipe, "
                       "against AO-GPT from scratch for F steps and for S + F steps (and, with --only l2r, the GPT "
                       "trained F more steps left to right); scored left to right and in a random order in bits per "
                       "byte. The defaults are the reduced study (about 10 minutes of one quiet core): the full one "
                       "is --steps 2000 --finetune 500,1000,2000 --seeds 3. Every finished path is kept in --work and "
                       "reused, a path under way is checkpointed and resumed; writes DIR/adapt.md, .json and .png "
                       "after every seed. One thread unless --threads.")
    t.add_argument("--steps", type=int_arg(ge=1, le=10**7), default=1000, metavar="S",
                   help="the source GPT's training steps (default 1000)")
    t.add_argument("--finetune", type=int_list, default=(1000,), metavar="F[,F...]",
                   help="fine-tuning steps, one study per value (default 1000)")
    t.add_argument("--candidates", type=name_list, default=None, metavar="NAME[,NAME...]",
                   help="fine-tuning recipes (aogpt.bench.training.adapt.CANDIDATES; default: the one the adapt "
                   "preset is, aogpt.bench.training.adapt.MEASURED)")
    t.add_argument("--only", type=name_list, default=None, metavar="PATH[,PATH...]",
                   help="train only these paths (source, scratch, scratch-sf, l2r, candidates); the others are read "
                   "from --work where kept (default: all but l2r)")
    t.add_argument("--seeds", type=int_arg(ge=1, le=1000), default=1, metavar="N", help="seeds (default 1)")
    t.add_argument("--width", type=int_arg(ge=64, le=4096), default=192, metavar="D",
                   help="the models' width, one head per 64 (default 192, the quickstart's)")
    t.add_argument("--eval-bytes", type=int_arg(ge=1, le=10**12), default=30_000, metavar="B",
                   help="score on the first B bytes of the held-out text (default 30000)")
    t.add_argument("--curve-every", type=int_arg(ge=0, le=10**7), default=250, metavar="K",
                   help="score the EMA weights every K steps for the curves (default 250; 0: at the end only)")
    t.add_argument("--save-every", type=int_arg(ge=0, le=10**7), default=250, metavar="K",
                   help="checkpoint a path under way every K steps, to resume it (default 250; 0: never)")
    t.add_argument("--data-root", type=path_arg, default=Path("data"), metavar="DIR",
                   help="where the prepared Shakespeare folders are (made if missing; default data)")
    t.add_argument("--work", type=path_arg, default=Path("runs/bench-adapt"), metavar="DIR",
                   help="where the trained paths are kept and reused (default runs/bench-adapt; one per width)")
    t.add_argument("--threads", type=int_arg(ge=1, le=4096), default=1, metavar="N",
                   help="CPU threads for torch (default 1; per process with --jobs)")
    t.add_argument("--jobs", type=int_arg(ge=1, le=256), default=1, metavar="N",
                   help="paths trained at a time, each in its own process (default 1)")
    run_flags(t, checkpoints=False, device=False)
    t.set_defaults(func=run_adapt)


def int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None
    if not values or any(not 1 <= v <= 10**7 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every value must lie in 1..10000000")
    return values


def name_list(text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    if not values:
        raise argparse.ArgumentTypeError("give at least one name")
    return values


def run_train(args: argparse.Namespace) -> int:
    from aogpt.bench.training import train_step as bt

    setup(args)
    q = bt.QUICK
    variants = [v.strip() for v in args.variants.split(",")] if args.variants else list(bt.VARIANTS)
    steps = pick(args.steps, q, "steps", 5, args.quick)
    block, batch, size = pick(args.block, q, "block", 256, args.quick), pick(args.batch, q, "batch", 8, args.quick), \
        size_of(args, q["size"])
    if args.preset is not None and not args.quick:  # the preset's shape unless a flag says otherwise
        from aogpt.bench.common import Size
        from aogpt.config import get_preset

        pm, pt = get_preset(args.preset)["model"], get_preset(args.preset)["train"]
        block, batch = args.block or pm["block_size"], args.batch or pt["batch_size"]
        size = Size(args.layers or pm["n_layer"], args.width or pm["n_embd"], args.heads or pm["n_head"],
                    args.vocab or 512)
    bar, update = progress_bar(steps, args, "bench train")
    try:
        result = bt.bench_train(
            block=block, batch=batch, size=size, variants=variants, steps=steps,
            warmup=pick(args.warmup, q, "warmup", 2, args.quick), device=args.device, seed=args.seed,
            dtypes=usable_precisions(args), preset=args.preset, profile=args.profile,
            paths=[p.strip() for p in args.paths.split(",")], limit=not args.no_limit, out=args.out,
            progress=update)
    finally:
        bar.close()
    return report(args, "bench train", result, bt.to_markdown(result))


def run_eval(args: argparse.Namespace) -> int:
    from aogpt.bench.training import eval as be

    setup(args)
    q, d = be.QUICK, be.DEFAULTS
    repeats = pick(args.repeats, q, "repeats", d["repeats"], args.quick)
    batch = pick(args.batch, q, "batch", d["batch"], args.quick)
    bar, update = progress_bar(repeats * len(be.CONTENDERS), args, "bench eval")
    try:
        result = be.bench_eval(
            n=pick(args.n, q, "n", d["n"], args.quick), batch=batch, size=size_of(args, q["size"]),
            members=pick(args.members, q, "members", d["members"], args.quick),
            ensemble_sequences=max(1, min(batch, pick(None, q, "ensemble_sequences", d["ensemble_sequences"],
                                                       args.quick))),
            repeats=repeats, long_run=args.long_run, device=args.device, seed=args.seed, out=args.out,
            progress=update)
    finally:
        bar.close()
    return report(args, "bench eval", result, be.to_markdown(result))


def run_prepare(args: argparse.Namespace) -> int:
    from aogpt.bench.training import prepare as bp
    from aogpt.io import ensure_writable_dir

    ensure_writable_dir(args.out)
    q, d = bp.QUICK, bp.DEFAULTS
    if args.workers_bench:
        given = [f for f, v in (("--corpus", args.corpus), ("--max-docs", args.max_docs), ("--threads", args.threads))
                 if v is not None]
        if given:
            raise AOGPTError(f"{', '.join(given)}: not used by --workers-bench (a synthetic corpus, each mode with "
                             "its own threads)", "drop them, or drop --workers-bench to time prepare of a corpus")
        from aogpt.data.tokenizer import normalize_spec

        repeats = pick(args.repeats, q, "repeats", 3, args.quick)
        modes = 3 if normalize_spec(args.tokenizer) == "gpt2" else 2
        bar, update = progress_bar(repeats * modes, args, "bench prepare --workers-bench")
        try:
            result = bp.bench_workers(
                tokenizer=args.tokenizer, workers=pick(args.workers, q, "workers", d["workers"], args.quick),
                repeats=repeats, seed=args.seed, out=args.out,
                synthetic_mb=pick(args.synthetic_mb, q, "synthetic_mb", d["synthetic_mb"], args.quick),
                progress=update)
        finally:
            bar.close()
        return report(args, "bench prepare", result, bp.workers_markdown(result))
    given = [f for f, v in (("--workers", args.workers), ("--synthetic-mb", args.synthetic_mb)) if v is not None]
    if given:
        raise AOGPTError(f"{', '.join(given)}: only for --workers-bench", "add --workers-bench, or drop them")
    repeats = pick(args.repeats, q, "repeats", d["repeats"], args.quick)
    bar, update = progress_bar(repeats, args, "bench prepare")
    try:
        result = bp.bench_prepare(
            corpus=args.corpus or "shakespeare", tokenizer=args.tokenizer, repeats=repeats,
            max_docs=pick(args.max_docs, q, "max_docs", None, args.quick), threads=args.threads, seed=args.seed,
            out=args.out, progress=update)
    finally:
        bar.close()
    return report(args, "bench prepare", result, bp.to_markdown(result))


def run_recipe(args: argparse.Namespace) -> int:
    import torch

    from aogpt.bench.training import recipe as br

    torch.set_num_threads(args.threads)
    names = [n.strip() for n in args.candidates.split(",") if n.strip()] if args.candidates else []
    if args.quick:
        names, args.candidate = [], [br.QUICK_CANDIDATE]
    elif not names and not args.candidate:
        names = list(br.CANDIDATES)
    candidates = [br.parse_candidate(n) for n in names] + [br.parse_candidate(c) for c in args.candidate]
    if args.calibrate is not None:
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

    def say(line: str) -> None:
        if not args.no_progress:
            print(line, file=sys.stderr, flush=True)

    result = br.sweep(candidates, args.data_root, steps=steps, cpu_budget=cpu_budget,
                      eval_bytes=br.QUICK_EVAL_BYTES if args.quick and args.eval_bytes is None else args.eval_bytes,
                      minutes=args.minutes, speedup=args.speedup, seed=args.seed, seeds=args.seeds, jobs=args.jobs,
                      curve_every=args.curve_every, diagnose=args.diagnose, out=args.out, progress=say)
    return report(args, "bench recipe", result, br.to_markdown(result))


def run_adapt(args: argparse.Namespace) -> int:
    import torch

    from aogpt.bench.training import adapt as bd
    from aogpt.bench.training.adapt_report import to_markdown

    torch.set_num_threads(args.threads)
    steps, finetune, seeds, eval_bytes, curve = args.steps, args.finetune, args.seeds, args.eval_bytes, args.curve_every
    width = args.width
    if args.quick:
        steps, finetune, seeds, eval_bytes, curve, width = 3, (2,), 1, 2000, 0, 64

    def say(line: str) -> None:
        if not args.no_progress:
            print(line, file=sys.stderr, flush=True)

    work = args.work / "quick" if args.quick else args.work
    only = tuple(args.only or (p for p in bd.PATHS if p != "l2r"))
    result = bd.run(args.data_root, work, steps=steps, finetune=tuple(finetune),
                    candidates=tuple(args.candidates or (bd.MEASURED,)), seeds=seeds, seed=args.seed, only=only,
                    eval_bytes=eval_bytes, curve_every=curve, width=width, save_every=args.save_every, out=args.out,
                    progress=say, jobs=args.jobs)
    return report(args, "bench adapt", result, to_markdown(result))


BENCHMARKS = {"train": add_train, "eval": add_eval, "prepare": add_prepare, "recipe": add_recipe, "adapt": add_adapt}
"""Each benchmark of this room and what registers it under `aogpt bench` (cli/bench.py calls them)."""
