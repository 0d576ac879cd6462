"""`aogpt bench generate|density|train|eval|prepare`: the paper's speed comparisons, and the cost of
evaluation and of data preparation, on your hardware. Behaviour and decisions: docs/benchmarks.md."""

from __future__ import annotations

import argparse
from typing import Any

from aogpt.cli.bench_common import (
    BATCH,
    LENGTH,
    LONG_RUN,
    REPEATS,
    THREADS,
    progress_bar,
    report,
    run_flags,
    setup,
    size_flags,
    usable_precisions,
)
from aogpt.cli.bench_gpu import add_gpu_benchmark
from aogpt.cli.bench_kernels import add_kernel_benchmarks
from aogpt.cli.bench_serve import add_serve_benchmark
from aogpt.cli.bench_training import add_training_benchmarks
from aogpt.cli.common import config_arg, finite_float, int_arg, positive_int
from aogpt.cli.prepare import MAX_WORKERS
from aogpt.errors import AOGPTError
from aogpt.sampling import SamplingConfig

HELP = ("speed benchmarks: generation time vs steps (paper Fig. 5), exact-likelihood cost, training steps, "
        "evaluation, data preparation, puzzle solving with adaptive orders; and the recipe sweep (what learns most "
        "for a fixed compute)")
EPILOG = "Random weights by default (timing does not depend on them); see docs/benchmarks.md."


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help=HELP, description=HELP + ". " + EPILOG)
    sub = p.add_subparsers(dest="bench", metavar="BENCHMARK", parser_class=type(p))
    p.set_defaults(func=_missing)

    g = sub.add_parser("generate", help="generation time against steps T: AO-GPT, encoder MDM, AR gpt",
                       description="Time AO-GPT (KV cache + Lemma 4.1, and the count schedule), AO-GPT without cache, "
                       "the encoder-only MDM with and without no-op skipping, our left-to-right GPT and transformers' "
                       "GPT-2, at equal size, batch and n, side by side, over T; writes DIR/generate.md, .json and "
                       ".png (paper Figure 5). " + EPILOG)
    g.add_argument("--n", default=None, metavar="N,N,...",
                   help="sequence length(s) (default 256; try 1024 on a GPU); several: each timed in turn, one report")
    g.add_argument("--batch", type=BATCH, default=None, help="sequences per batch (default 8)")
    g.add_argument("--steps", default=None, metavar="T,T,...",
                   help="generation steps: integers, n or n/K (default 16,32,64,128,256)")
    g.add_argument("--methods", default=None, metavar="M,M,...",
                   help="aogpt, aogpt-count, aogpt-nocache, encoder, encoder-noskip, encoder-est (T x one timed "
                   "pass: for long n), gpt, hf-gpt2 (transformers GPT-2), aogpt-reference, gpt-reference (the "
                   "previous decode path, for the speed-up; default: aogpt, aogpt-count, aogpt-nocache, encoder, "
                   "encoder-noskip, gpt, hf-gpt2)")
    g.add_argument("--top-p", type=config_arg(SamplingConfig, "top_p"), default=1.0,
                   help="nucleus sampling threshold for every contender (default 1)")
    g.add_argument("--temperature", type=config_arg(SamplingConfig, "temperature"), default=1.0,
                   help="sampling temperature for every contender")
    g.add_argument("--repeats", type=REPEATS, default=None, help="runs per measurement, median reported (default 3)")
    g.add_argument("--long-run", type=LONG_RUN, default=20.0, metavar="S",
                   help="measurements whose first run takes longer than S seconds are not repeated (default 20)")
    g.add_argument("--encoder-limit", type=LONG_RUN, default=None, metavar="S",
                   help="run the encoder only where T x one timed pass is under S seconds, else estimate it "
                   "(labelled; default: always run)")
    size_flags(g)
    run_flags(g)
    g.add_argument("--dtype", default="auto", metavar="P,P,...",
                   help="the models' precision, several timed side by side: auto, fp32 (float32), bf16 (bfloat16), "
                   "fp16 (float16) (default auto: bf16 where the hardware has bf16 units; one this CPU cannot "
                   "compute in is skipped with a note)")
    g.set_defaults(func=run_generate)

    d = sub.add_parser("density", help="cost of one exact likelihood: decoder 1 pass vs encoder n passes",
                       description="Time the exact NLL of a sequence under one order: AO-GPT and gpt in one causal "
                       "pass, the encoder-only MDM in n passes; writes DIR/density.md and .json. " + EPILOG)
    d.add_argument("--n", type=LENGTH, default=None, help="sequence length (default 256)")
    d.add_argument("--batch", type=BATCH, default=None, help="sequences scored together (default 1)")
    d.add_argument("--repeats", type=REPEATS, default=None, help="runs per measurement, median reported (default 3)")
    d.add_argument("--long-run", type=LONG_RUN, default=20.0, metavar="S", help="do not repeat runs longer than S s")
    size_flags(d)
    run_flags(d)
    d.set_defaults(func=run_density)

    sp = sub.add_parser("speculative", help="exact self-speculative decoding against one token per step",
                        description="On a trained AO-GPT, time exact self-speculative decoding (draft K positions, "
                        "verify them) against one token per step and our GPT, side by side, with tokens per forward "
                        "pass, acceptance by draft position, and a quality check (the NLL of both samplers' "
                        "samples under one evaluator); writes DIR/speculative.md, .json and .png.")
    sp.add_argument("--checkpoint", action="append", default=[], metavar="VARIANT=PATH", required=True,
                    help="aogpt=RUN (required: a trained AO-GPT) and optionally gpt=RUN of the same size")
    sp.add_argument("--n", default="128,256", metavar="N,N", help="sequence lengths (default 128,256)")
    sp.add_argument("--batch", default="1,8", metavar="B,B", help="batch sizes (default 1,8)")
    sp.add_argument("--k", default="2,4,8,auto", metavar="K,K", help="draft lengths, or auto (default 2,4,8,auto)")
    sp.add_argument("--samples", type=int_arg(ge=2, le=100_000), default=16,
                    help="samples per sampler for the quality check (default 16)")
    sp.add_argument("--repeats", type=int_arg(ge=1, le=1000), default=3,
                    help="runs per measurement, median reported (default 3)")
    sp.add_argument("--temperature", type=finite_float(gt=0), default=1.0, help="sampling temperature (default 1)")
    sp.add_argument("--top-p", type=finite_float(gt=0, le=1), default=1.0, help="nucleus threshold (default 1)")
    run_flags(sp, checkpoints=False)
    sp.set_defaults(func=run_speculative)

    gt = sub.add_parser("gated", help="generation with a gated pathway against its source and an AO-GPT",
                        description="A GPT, the same GPT adapted to AO-GPT with a gated pathway (aogpt adapt "
                        "--pathway gated) and with a shared one: the gated model's step left to right against the "
                        "GPT's, and in a random order against the shared AO-GPT's, one token per step, side by side in "
                        "this process (random weights of the quickstart model's shape); writes DIR/gated.md and "
                        ".json.")
    gt.add_argument("--n", type=int_arg(ge=2, le=4096), default=128, help="sequence length (default 128)")
    gt.add_argument("--batch", type=int_arg(ge=1, le=4096), default=8, help="sequences per batch (default 8)")
    gt.add_argument("--rank", type=_rank, default=0, metavar="R|full",
                    help="the gated pathway's delta rank (default full)")
    gt.add_argument("--width", type=int_arg(ge=16, le=8192), default=192, help="model width (default 192)")
    gt.add_argument("--repeats", type=int_arg(ge=1, le=1000), default=5,
                    help="interleaved rounds, medians reported (default 5)")
    gt.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="weights' precision (default fp32)")
    run_flags(gt, checkpoints=False, device=False)
    gt.add_argument("--threads", type=THREADS, default=1, metavar="N", help="CPU threads for torch (default 1)")
    gt.set_defaults(func=run_gated)

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

    add_training_benchmarks(sub)
    add_kernel_benchmarks(sub)
    add_serve_benchmark(sub)
    add_gpu_benchmark(sub)


def _missing(args: argparse.Namespace) -> int:
    raise AOGPTError("no benchmark named",
                     "use `aogpt bench generate`, `speculative`, `density`, `train`, `eval`, `prepare`, `adaptive`, "
                     "`recipe`, `serve` or `gpu` "
                     "(`aogpt bench --help`)")


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


def run_generate(args: argparse.Namespace) -> int:
    from aogpt.bench import generate as bg
    from aogpt.bench.common import parse_checkpoints

    setup(args)
    q = bg.QUICK
    specs = [t.strip() for t in args.steps.split(",") if t.strip()] if args.steps else \
        [str(t) for t in (q["steps"] if args.quick else bg.DEFAULT_STEPS)]
    methods = bg.check_methods([m.strip() for m in args.methods.split(",")]) if args.methods \
        else list(bg.DEFAULT_METHODS)
    try:
        lengths = [LENGTH(v) for v in args.n.split(",") if v.strip()] if args.n else [q["n"] if args.quick else 256]
    except (argparse.ArgumentTypeError, ValueError) as e:
        raise AOGPTError(f"argument --n: {e}", "give lengths separated by commas, e.g. --n 128,512") from None
    if not lengths:
        raise AOGPTError(f"bad --n {args.n!r}", "give lengths separated by commas, e.g. --n 128,512")
    lengths = sorted(set(lengths))
    steps = {n: bg.resolve_steps(specs, n) for n in lengths}
    repeats = _pick(args.repeats, q, "repeats", 3, args.quick)
    dtypes = usable_precisions(args)
    total = repeats * len(dtypes) * sum(len(steps[n]) if bg.METHODS[m].every_t else 1 for n in lengths for m in methods)
    bar, update = progress_bar(total, args, "bench generate")
    try:
        result = bg.bench_lengths(
            lengths, specs, batch=_pick(args.batch, q, "batch", 8, args.quick), size=_size(args, q["size"]),
            methods=methods, repeats=repeats, long_run=args.long_run, top_p=args.top_p, temperature=args.temperature,
            device=args.device, seed=args.seed,
            checkpoints=parse_checkpoints(args.checkpoint, ("aogpt", "gpt", "encoder-mdm")), dtypes=dtypes,
            out=args.out, progress=update, encoder_limit=args.encoder_limit,
            memory_buffer=q["memory_buffer"] if args.quick else None)
    finally:
        bar.close()
    from aogpt.bench.generate_report import to_markdown

    return report(args, "bench generate", result, to_markdown(result))


def _rank(text: str) -> int:
    from aogpt.cli.adapt import _rank as rank

    return rank(text)


def run_gated(args: argparse.Namespace) -> int:
    from aogpt.bench.common import write_outputs
    from aogpt.bench.gated import CONTENDERS, bench_gated, to_markdown

    setup(args)
    n, batch, repeats, width = (16, 2, 1, 32) if args.quick else (args.n, args.batch, args.repeats, args.width)
    if args.dtype == "bf16":
        import torch

        from aogpt.capability import can_pack

        if not can_pack(torch.bfloat16):
            raise AOGPTError("this CPU has no bf16 matrix units", "time --dtype fp32")
    bar, update = progress_bar(repeats * len(CONTENDERS), args, "bench gated")
    done = [0]

    def tick(key: str) -> None:
        done[0] += 1
        update(done[0], key)

    try:
        result = bench_gated(n=n, batch=batch, repeats=repeats, rank=args.rank, width=width, seed=args.seed,
                             dtype=args.dtype, progress=tick)
    finally:
        bar.close()
    result["files"] = write_outputs(args.out, "gated", to_markdown(result), result)
    return report(args, "bench gated", result, to_markdown(result))


def run_speculative(args: argparse.Namespace) -> int:
    from aogpt.bench.common import parse_checkpoints, parse_int_list
    from aogpt.bench.speculative import bench_speculative, to_markdown
    from aogpt.checkpoint import load

    setup(args)
    paths = parse_checkpoints(args.checkpoint, ("aogpt", "sigma", "gpt"))
    drafting = [v for v in ("aogpt", "sigma") if v in paths]
    if not drafting:
        raise AOGPTError("a trained any-order model is needed", "pass --checkpoint aogpt=RUN")
    ns, batches = parse_int_list(args.n, "n"), parse_int_list(args.batch, "batch")
    ks = [k.strip() for k in args.k.split(",") if k.strip()]
    from aogpt.device import resolve_device

    device = resolve_device(args.device)
    model = load(paths[drafting[0]], device=device)
    gpt = load(paths["gpt"], device=device) if "gpt" in paths else None
    bar, update = progress_bar(args.repeats * len(ns) * len(batches) * (len(ks) + 1 + (gpt is not None)), args,
                       "bench speculative")
    try:
        result = bench_speculative(model, gpt=gpt, ns=ns, batches=batches, ks=ks, repeats=args.repeats,
                                   samples=args.samples, seed=args.seed, temperature=args.temperature,
                                   top_p=args.top_p, out=args.out, progress=update)
    finally:
        bar.close()
    return report(args, "bench speculative", result, to_markdown(result))


def run_density(args: argparse.Namespace) -> int:
    from aogpt.bench import density as bd
    from aogpt.bench.common import parse_checkpoints

    setup(args)
    q = bd.QUICK
    repeats = _pick(args.repeats, q, "repeats", 3, args.quick)
    bar, update = progress_bar(repeats * len(bd.VARIANTS), args, "bench density")
    try:
        result = bd.bench_density(
            n=_pick(args.n, q, "n", 256, args.quick), batch=_pick(args.batch, q, "batch", 1, args.quick),
            size=_size(args, q["size"]), repeats=repeats,
            long_run=args.long_run, device=args.device, seed=args.seed,
            checkpoints=parse_checkpoints(args.checkpoint, bd.VARIANTS), out=args.out, progress=update)
    finally:
        bar.close()
    return report(args, "bench density", result, bd.to_markdown(result))


def run_train(args: argparse.Namespace) -> int:
    from aogpt.bench import train_step as bt

    setup(args)
    q = bt.QUICK
    variants = [v.strip() for v in args.variants.split(",")] if args.variants else list(bt.VARIANTS)
    steps = _pick(args.steps, q, "steps", 5, args.quick)
    block, batch, size = _pick(args.block, q, "block", 256, args.quick), _pick(args.batch, q, "batch", 8, args.quick), \
        _size(args, q["size"])
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
            warmup=_pick(args.warmup, q, "warmup", 2, args.quick), device=args.device, seed=args.seed,
            dtypes=usable_precisions(args), preset=args.preset, profile=args.profile,
            paths=[p.strip() for p in args.paths.split(",")], limit=not args.no_limit, out=args.out,
            progress=update)
    finally:
        bar.close()
    return report(args, "bench train", result, bt.to_markdown(result))


def run_eval(args: argparse.Namespace) -> int:
    from aogpt.bench import eval as be

    setup(args)
    q, d = be.QUICK, be.DEFAULTS
    repeats = _pick(args.repeats, q, "repeats", d["repeats"], args.quick)
    batch = _pick(args.batch, q, "batch", d["batch"], args.quick)
    bar, update = progress_bar(repeats * len(be.CONTENDERS), args, "bench eval")
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
    return report(args, "bench eval", result, be.to_markdown(result))


def run_prepare(args: argparse.Namespace) -> int:
    from aogpt.bench import prepare as bp
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

        repeats = _pick(args.repeats, q, "repeats", 3, args.quick)
        modes = 3 if normalize_spec(args.tokenizer) == "gpt2" else 2
        bar, update = progress_bar(repeats * modes, args, "bench prepare --workers-bench")
        try:
            result = bp.bench_workers(
                tokenizer=args.tokenizer, workers=_pick(args.workers, q, "workers", d["workers"], args.quick),
                repeats=repeats, seed=args.seed, out=args.out,
                synthetic_mb=_pick(args.synthetic_mb, q, "synthetic_mb", d["synthetic_mb"], args.quick),
                progress=update)
        finally:
            bar.close()
        return report(args, "bench prepare", result, bp.workers_markdown(result))
    given = [f for f, v in (("--workers", args.workers), ("--synthetic-mb", args.synthetic_mb)) if v is not None]
    if given:
        raise AOGPTError(f"{', '.join(given)}: only for --workers-bench", "add --workers-bench, or drop them")
    repeats = _pick(args.repeats, q, "repeats", d["repeats"], args.quick)
    bar, update = progress_bar(repeats, args, "bench prepare")
    try:
        result = bp.bench_prepare(
            corpus=args.corpus or "shakespeare", tokenizer=args.tokenizer, repeats=repeats,
            max_docs=_pick(args.max_docs, q, "max_docs", None, args.quick), threads=args.threads, seed=args.seed,
            out=args.out, progress=update)
    finally:
        bar.close()
    return report(args, "bench prepare", result, bp.to_markdown(result))
