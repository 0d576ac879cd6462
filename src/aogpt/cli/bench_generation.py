"""The generation room of `aogpt bench` (`aogpt.bench.generation`): `generate` (generation time against
steps, the paper's Figure 5), `density` (the cost of one exact likelihood), `speculative` (exact
self-speculative decoding), `adaptive` (puzzle solving with adaptive orders), `attention` (the exact
attention kernels side by side) and `gap-length` (the length of a gap the model chooses, against the
true one and a fixed guess). Behaviour and decisions: docs/benchmarks.md."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from aogpt.cli.bench_common import (
    BATCH,
    EPILOG,
    LENGTH,
    LONG_RUN,
    REPEATS,
    pick,
    progress_bar,
    report,
    run_flags,
    setup,
    size_flags,
    size_of,
    usable_precisions,
)
from aogpt.cli.common import config_arg, finite_float, int_arg, path_arg
from aogpt.config import ModelConfig
from aogpt.errors import AOGPTError
from aogpt.generation.settings import DecodePlan
from aogpt.sampling import SamplingConfig


def add_generate(sub: Any) -> None:
    """`aogpt bench generate`."""
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
                   "pass: for long n), gpt, hf-gpt2 (transformers GPT-2), aogpt-reference, gpt-reference "
                   "(the reference decode path, torch's default kernels, for the speed-up; default: aogpt, "
                   "aogpt-count, aogpt-nocache, encoder, encoder-noskip, gpt, hf-gpt2)")
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


def add_density(sub: Any) -> None:
    """`aogpt bench density`."""
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


def add_speculative(sub: Any) -> None:
    """`aogpt bench speculative`."""
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


def add_adaptive(sub: Any) -> None:
    """`aogpt bench adaptive`."""
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


def add_attention(sub: Any) -> None:
    """`aogpt bench attention`."""
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


def run_generate(args: argparse.Namespace) -> int:
    from aogpt.bench.common import parse_checkpoints
    from aogpt.bench.generation import generate as bg

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
    repeats = pick(args.repeats, q, "repeats", 3, args.quick)
    dtypes = usable_precisions(args)
    total = repeats * len(dtypes) * sum(len(steps[n]) if bg.METHODS[m].every_t else 1 for n in lengths for m in methods)
    bar, update = progress_bar(total, args, "bench generate")
    try:
        result = bg.bench_lengths(
            lengths, specs, batch=pick(args.batch, q, "batch", 8, args.quick), size=size_of(args, q["size"]),
            methods=methods, repeats=repeats, long_run=args.long_run, top_p=args.top_p, temperature=args.temperature,
            device=args.device, seed=args.seed,
            checkpoints=parse_checkpoints(args.checkpoint, ("aogpt", "gpt", "encoder-mdm")), dtypes=dtypes,
            out=args.out, progress=update, encoder_limit=args.encoder_limit,
            memory_buffer=q["memory_buffer"] if args.quick else None)
    finally:
        bar.close()
    from aogpt.bench.generation.generate_report import to_markdown

    return report(args, "bench generate", result, to_markdown(result))


def run_speculative(args: argparse.Namespace) -> int:
    from aogpt.bench.common import parse_checkpoints, parse_int_list
    from aogpt.bench.generation.speculative import bench_speculative, to_markdown
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
    from aogpt.bench.common import parse_checkpoints
    from aogpt.bench.generation import density as bd

    setup(args)
    q = bd.QUICK
    repeats = pick(args.repeats, q, "repeats", 3, args.quick)
    bar, update = progress_bar(repeats * len(bd.VARIANTS), args, "bench density")
    try:
        result = bd.bench_density(
            n=pick(args.n, q, "n", 256, args.quick), batch=pick(args.batch, q, "batch", 1, args.quick),
            size=size_of(args, q["size"]), repeats=repeats,
            long_run=args.long_run, device=args.device, seed=args.seed,
            checkpoints=parse_checkpoints(args.checkpoint, bd.VARIANTS), out=args.out, progress=update)
    finally:
        bar.close()
    return report(args, "bench density", result, bd.to_markdown(result))


def run_adaptive(args: argparse.Namespace) -> int:
    from aogpt.bench.common import parse_checkpoints
    from aogpt.bench.generation import adaptive as ba

    d = ba.QUICK if args.quick else ba.DEFAULTS

    def given_or(value: Any, key: str) -> Any:
        return d[key] if value is None else value

    orders = [o.strip() for o in args.orders.split(",") if o.strip()] if args.orders else list(ba.ORDERS)
    ba.check_orders(orders)  # input errors before anything runs
    puzzles, seeds = given_or(args.puzzles, "puzzles"), given_or(args.seeds, "seeds")
    checkpoints = parse_checkpoints(args.checkpoint, ba.MODELS)
    setup(args)
    bar, update = progress_bar(len(ba.MODELS) * len(orders) * max(1, puzzles) * max(1, seeds), args, "bench adaptive")
    try:
        result = ba.bench_adaptive(
            task=given_or(args.task, "task"), train_steps=given_or(args.train_steps, "train_steps"),
            solutions=d["solutions"], puzzles=puzzles,
            seeds=seeds, layers=given_or(args.layers, "layers"), width=given_or(args.width, "width"),
            heads=given_or(args.heads, "heads"), batch=d["batch"], lr=d["lr"], orders=orders,
            temperature=args.temperature, candidates=args.candidates, threshold=args.threshold,
            checkpoints=checkpoints, text=not args.no_text, text_steps=given_or(args.text_steps, "text_steps"),
            text_block=d["text_block"], text_checkpoint=args.text_checkpoint, text_data=args.text_data,
            spread_sequences=given_or(args.spread_sequences, "spread_sequences"),
            spread_orders=given_or(args.spread_orders, "spread_orders"), device=args.device, seed=args.seed,
            work=args.work, out=args.out, show_progress=not args.no_progress, progress=update,
            plain_start=args.plain_start)
    finally:
        bar.close()
    from aogpt.bench.generation.adaptive_report import to_markdown

    return report(args, "bench adaptive", result, to_markdown(result))


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


def add_gated(sub: Any) -> None:
    """`aogpt bench gated`."""
    gt = sub.add_parser("gated", help="generation with a gated pathway against its source and an AO-GPT",
                        description="A GPT, the same GPT adapted to AO-GPT with a gated pathway (aogpt adapt "
                        "--pathway gated) and with a shared one: the gated model's step left to right against the "
                        "GPT's, and in a random order against the shared AO-GPT's, one token per step, side by side in "
                        "this process (random weights of the quickstart model's shape); writes DIR/gated.md and "
                        ".json. " + EPILOG)
    gt.add_argument("--n", type=int_arg(ge=2, le=4096), default=128, help="sequence length (default 128)")
    gt.add_argument("--batch", type=BATCH, default=8, help="sequences per batch (default 8)")
    gt.add_argument("--rank", type=_rank, default=0, metavar="R|full",
                    help="the gated pathway's delta rank (default full)")
    gt.add_argument("--width", type=int_arg(ge=16, le=8192), default=192, help="model width (default 192)")
    gt.add_argument("--repeats", type=REPEATS, default=5, help="interleaved rounds, medians reported (default 5)")
    gt.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="weights' precision (default fp32)")
    run_flags(gt, checkpoints=False, device=False)
    gt.add_argument("--threads", type=int_arg(ge=1, le=4096), default=1, metavar="N",
                    help="CPU threads for torch (default 1)")
    gt.set_defaults(func=run_gated)


def _rank(text: str) -> int:
    from aogpt.cli.adapt import _rank as rank

    return rank(text)


def run_gated(args: argparse.Namespace) -> int:
    from aogpt.bench.common import write_outputs
    from aogpt.bench.generation.gated import CONTENDERS, bench_gated, to_markdown

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



def add_gap_length(sub: Any) -> None:
    """`aogpt bench gap-length`."""
    g = sub.add_parser("gap-length", help="the gap length an any-order model chooses, against the true one and a "
                       "fixed guess", description="Cut held-out spans of whole words out of a prepared data "
                       "directory's validation split, give the model the text on both sides without the length, and "
                       "compare the length it chooses from its exact likelihoods (importance sampling with its own "
                       "fills, 1, 4 and 16 per length) with the true one and with a fixed guess (the median length on "
                       "the training split): exact, within 1 and 2 tokens, and the bits per byte of the filled text. "
                       "Writes DIR/gap-length.md and .json.")
    g.add_argument("--checkpoint", metavar="RUN", type=path_arg, required=True,
                   help="an any-order decoder's run or ckpt-* directory")
    g.add_argument("--data", metavar="DIR", type=path_arg, required=True,
                   help="the prepared data directory the model was trained on (its val split is held out)")
    g.add_argument("--spans", type=int_arg(ge=1, le=100_000), default=None,
                   help=f"spans per seed (default {GAP_DEFAULTS['spans']})")
    g.add_argument("--seeds", type=int_arg(ge=1, le=100), default=None,
                   help=f"seeds, each its own spans and draws (default {GAP_DEFAULTS['seeds']})")
    g.add_argument("--weights", choices=("ema", "raw"), default="ema", help="EMA (default) or raw weights")
    run_flags(g, checkpoints=False, device=False)
    g.add_argument("--threads", type=int_arg(ge=1, le=4096), default=None, metavar="N",
                   help="CPU threads for torch (default: torch's, 1 on a busy machine)")
    g.set_defaults(func=run_gap_length)


def run_gap_length(args: argparse.Namespace) -> int:
    from aogpt.bench.generation.gap_length import QUICK, bench_gap_length, to_markdown
    from aogpt.checkpoint import load
    from aogpt.data import PreparedData
    from aogpt.generation.length import check_model

    setup(args)
    data = PreparedData(args.data)
    loaded = load(args.checkpoint, weights=args.weights)
    check_model(loaded.model)
    spans = args.spans or (QUICK["spans"] if args.quick else GAP_DEFAULTS["spans"])
    seeds = args.seeds or (QUICK["seeds"] if args.quick else GAP_DEFAULTS["seeds"])
    extra = {k: v for k, v in QUICK.items() if k not in ("spans", "seeds")} if args.quick else {}
    bar, update = progress_bar(spans * seeds, args, "bench gap-length")
    try:
        result = bench_gap_length(loaded.model, loaded.tokenizer, data.split("val"), data.split("train"),
                                  spans=spans, seeds=seeds, seed=args.seed, out=args.out, progress=update,
                                  meta={"checkpoint": str(loaded.path), "step": loaded.step, "data": str(args.data),
                                        "weights": args.weights}, **extra)
    finally:
        bar.close()
    return report(args, "bench gap-length", {k: v for k, v in result.items() if k != "per_span"}, to_markdown(result))


GAP_DEFAULTS = {"spans": 64, "seeds": 3}

BENCHMARKS = {"generate": add_generate, "density": add_density, "speculative": add_speculative,
              "adaptive": add_adaptive, "attention": add_attention, "gated": add_gated,
              "gap-length": add_gap_length}
"""Each benchmark of this room and what registers it under `aogpt bench` (cli/bench.py calls them)."""
