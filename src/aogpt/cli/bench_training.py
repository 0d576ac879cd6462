"""`aogpt bench adaptive`, `aogpt bench recipe` and `aogpt bench adapt`: the benchmarks that train their own
models (puzzle solving with adaptive orders; the recipe sweep behind the quickstart preset; adapting a trained
GPT against AO-GPT from scratch)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from aogpt.cli.bench_common import progress_bar, report, run_flags, setup
from aogpt.cli.common import config_arg, emit_json, finite_float, int_arg, path_arg
from aogpt.config import ModelConfig
from aogpt.errors import AOGPTError
from aogpt.generation.settings import DecodePlan
from aogpt.sampling import SamplingConfig


def add_training_benchmarks(sub: Any) -> None:
    """Register `adaptive`, `recipe` and `adapt` under `aogpt bench`."""
    a = sub.add_parser("adaptive", help="puzzle solve rates with random, left-to-right and adaptive orders",
                       description="Prepare a synthetic task, train AO-GPT (uniform orders) and the encoder-only MDM "
                       "on it (a few CPU minutes each, or pass --checkpoint), solve fresh minimal puzzles with "
                       "random, left-to-right and the adaptive orders confidence, margin and entropy over several "
                       "seeds (95% Wilson intervals), and measure how much log p(x) differs across orders, also on "
                       "text; writes DIR/adaptive.md, .json and .png. Trained runs are kept in --work and reused.")
    a.add_argument("--task", default=None, help="synthetic task: walk (default), sudoku4 or sudoku6")
    a.add_argument("--puzzles", type=int_arg(ge=1, le=10**6), default=None, help="puzzles per seed (default 200)")
    a.add_argument("--seeds", type=int_arg(ge=1, le=1000), default=None,
                   help="puzzle sets, each with its own seed (default 3)")
    a.add_argument("--orders", default=None, metavar="O,O,...",
                   help="random, l2r, confidence, margin, entropy (default: all)")
    a.add_argument("--temperature", type=config_arg(SamplingConfig, "temperature"), default=None,
                   help="sample the tokens at this temperature (default: greedy, the most likely token)")
    a.add_argument("--candidates", type=config_arg(DecodePlan, "candidates"), default=None, metavar="C",
                   help="adaptive orders score C random remaining positions per step (default: all)")
    a.add_argument("--threshold", type=config_arg(DecodePlan, "threshold"), default=None, metavar="P",
                   help="adaptive orders also reveal every position whose top probability is at least P")
    a.add_argument("--train-steps", type=int_arg(ge=1, le=10**7), default=None, metavar="N",
                   help="training steps of each model on the task (default 2500)")
    a.add_argument("--layers", type=config_arg(ModelConfig, "n_layer"), default=None,
                   help="blocks of the trained models (default 3)")
    a.add_argument("--width", type=config_arg(ModelConfig, "n_embd"), default=None, help="their width (default 128)")
    a.add_argument("--heads", type=config_arg(ModelConfig, "n_head"), default=None,
                   help="their attention heads (default 4)")
    a.add_argument("--no-text", action="store_true", help="skip the text model of the log-likelihood spread")
    a.add_argument("--plain-start", action="store_true",
                   help="train AO-GPT on uniform orders from the first step, without the any-order start "
                   "(a curriculum from left to right; the default since it learns these tasks far sooner)")
    a.add_argument("--text-steps", type=int_arg(ge=1, le=10**7), default=None, metavar="N",
                   help="training steps of the small Shakespeare AO-GPT (default 600)")
    a.add_argument("--text-checkpoint", type=path_arg, default=None, metavar="RUN",
                   help="measure the spread on this text model instead (with --text-data)")
    a.add_argument("--text-data", type=path_arg, default=None, metavar="DIR",
                   help="prepared text for --text-checkpoint")
    a.add_argument("--spread-orders", type=int_arg(ge=1, le=10**5), default=None, metavar="K",
                   help="orders per sequence (default 16)")
    a.add_argument("--spread-sequences", type=int_arg(ge=1, le=10**6), default=None, metavar="M",
                   help="sequences whose spread is measured (default 64)")
    a.add_argument("--work", type=path_arg, default=None, metavar="DIR",
                   help="where data and trained runs are kept (default runs/bench-adaptive)")
    run_flags(a)
    a.set_defaults(func=run_adaptive)

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
                   help="fine-tuning recipes (aogpt.bench.adapt.CANDIDATES; default: the one the adapt preset is, "
                   "aogpt.bench.adapt.MEASURED)")
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


def run_adapt(args: argparse.Namespace) -> int:
    import torch

    from aogpt.bench import adapt as bd
    from aogpt.bench.adapt_report import to_markdown

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


def run_adaptive(args: argparse.Namespace) -> int:
    from aogpt.bench import adaptive as ba
    from aogpt.bench.common import parse_checkpoints

    d = ba.QUICK if args.quick else ba.DEFAULTS

    def pick(value: Any, key: str) -> Any:
        return d[key] if value is None else value

    orders = [o.strip() for o in args.orders.split(",") if o.strip()] if args.orders else list(ba.ORDERS)
    ba.check_orders(orders)  # input errors before anything runs
    puzzles, seeds = pick(args.puzzles, "puzzles"), pick(args.seeds, "seeds")
    checkpoints = parse_checkpoints(args.checkpoint, ba.MODELS)
    setup(args)
    bar, update = progress_bar(len(ba.MODELS) * len(orders) * max(1, puzzles) * max(1, seeds), args, "bench adaptive")
    try:
        result = ba.bench_adaptive(
            task=pick(args.task, "task"), train_steps=pick(args.train_steps, "train_steps"),
            solutions=d["solutions"], puzzles=puzzles,
            seeds=seeds, layers=pick(args.layers, "layers"), width=pick(args.width, "width"),
            heads=pick(args.heads, "heads"), batch=d["batch"], lr=d["lr"], orders=orders,
            temperature=args.temperature, candidates=args.candidates, threshold=args.threshold,
            checkpoints=checkpoints, text=not args.no_text, text_steps=pick(args.text_steps, "text_steps"),
            text_block=d["text_block"], text_checkpoint=args.text_checkpoint, text_data=args.text_data,
            spread_sequences=pick(args.spread_sequences, "spread_sequences"),
            spread_orders=pick(args.spread_orders, "spread_orders"), device=args.device, seed=args.seed,
            work=args.work, out=args.out, show_progress=not args.no_progress, progress=update,
            plain_start=args.plain_start)
    finally:
        bar.close()
    from aogpt.bench.adaptive_report import to_markdown

    return report(args, "bench adaptive", result, to_markdown(result))


def run_recipe(args: argparse.Namespace) -> int:
    import torch

    from aogpt.bench import recipe as br

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
