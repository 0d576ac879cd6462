"""`aogpt eval`: likelihoods (left to right, any-order bound, ensembles), zero-shot suites, generation
perplexity. Behaviour and decisions: docs/evaluation.md."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aogpt.cli.common import add_common, config_arg, emit_json, int_arg, path_arg, positive_int, progress
from aogpt.cli.sample import MAX_SAMPLES
from aogpt.config import ModelConfig
from aogpt.device import resolve_device
from aogpt.errors import AOGPTError
from aogpt.generation.settings import DecodePlan
from aogpt.orders import ADAPTIVE
from aogpt.precision import WEIGHTS, name_of, precision_arg, weights_precision
from aogpt.sampling import SamplingConfig

LENGTH = config_arg(ModelConfig, "block_size")  # tokens per block or sample: a model context
HELP = "evaluate a checkpoint: NLL/perplexity (l2r, any-order bound, ensembles), zero-shot suites, gen. perplexity"


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("eval", help=HELP, description=HELP + " (see docs/evaluation.md)")
    p.add_argument("--checkpoint", metavar="RUN", help="run directory (its newest checkpoint) or a ckpt-* directory")
    p.add_argument("--data", metavar="SPEC", action="append", default=[],
                   help="prepared data directory (its val split), a suite (lambada, wikitext2, ptb, wikitext103, "
                   "lm1b), shakespeare, wiki-excerpt, or a .txt/.jsonl file or folder (scored whole); repeatable")
    p.add_argument("--suite", metavar="NAMES", default=None,
                   help="comma-separated evaluation sets; 'paper' = the five zero-shot suites, 'offline' = "
                   "shakespeare,wiki-excerpt. Several sets print a markdown table")
    p.add_argument("--data-dir", metavar="DIR", type=path_arg, default=None,
                   help="read the suites from local files here instead of the Hugging Face hub")
    p.add_argument("--order", default="l2r",
                   help="l2r (exact AR likelihood), random (any-order bound, K draws) or an order spec "
                   "(mixture, fixed-random:SEED, blockwise:K, mallows:THETA, window:W); comma-separated for several "
                   "(default l2r)")
    p.add_argument("--num-orders", "-K", type=int_arg(ge=1, le=10_000), default=4, metavar="K",
                   help="independent draws of random orders, for the mean and its error bar (default 4)")
    p.add_argument("--ensemble", "-M", type=int_arg(ge=1, le=1024), default=1, metavar="M",
                   help="context-order ensemble size, base order included (default 1: none)")
    p.add_argument("--ensemble-positions", type=LENGTH, default=None, metavar="S",
                   help="ensemble only S random steps per sequence (unbiased estimator; faster)")
    p.add_argument("--weights", choices=("ema", "raw"), default="ema", help="EMA (default) or raw weights")
    p.add_argument("--batch-size", type=int_arg(ge=1, le=2**20), default=8, help="sequences per forward (default 8)")
    p.add_argument("--max-batches", type=positive_int, default=None, help="stop after this many batches per data set")
    p.add_argument("--block-len", type=LENGTH, default=None,
                   help="tokens per evaluated block (default: min(1024, the model's context)); longer than "
                   "the context is refused")
    p.add_argument("--wrap", action="store_true", help="MDLM's wrapped packing: EOS + (block_len-2) tokens + EOS")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--dtype", type=precision_arg(WEIGHTS), default="fp32", metavar="P",
                   help="the model's weights for evaluation: fp32 (float32, the default), fp64 (float64), bf16 "
                   "(bfloat16), fp16 (float16), or auto (bf16 where the hardware has bf16 units, as training's "
                   "default)")
    f = p.add_argument_group("infilling (docs/evaluation.md, \"Infilling\")")
    f.add_argument("--infill", action="store_true",
                   help="score held-out spans exactly given the text on both sides (and given the prefix only), "
                   "in bits per byte of the span; --data must be a prepared data directory or a text file")
    f.add_argument("--span-lengths", metavar="L,L,...", type=_lengths, default=None,
                   help="span lengths in tokens (default 8,32,64)")
    f.add_argument("--cuts", type=int_arg(ge=1, le=100_000), default=None, metavar="N",
                   help="spans per length, drawn with --seed (default 64)")
    f.add_argument("--infill-context", type=int_arg(ge=0, le=100_000), default=None, metavar="C",
                   help="tokens of prefix and of suffix around each span (default 32)")
    f.add_argument("--infill-order", choices=ADAPTIVE, default="confidence",
                   help="the adaptive span order, chosen step by step and scored exactly (default confidence); the "
                   "model's own order is it or left to right, whichever is likelier on 16 other spans")
    f.add_argument("--compare", metavar="RUN", action="append", default=[], type=path_arg,
                   help="also score this checkpoint on the same spans (a left-to-right GPT: the prefix only); "
                   "repeatable")
    g = p.add_argument_group("generation perplexity")
    g.add_argument("--genppl", metavar="FILE", type=path_arg, default=None,
                   help="score samples from FILE (.jsonl, .json or one per line)")
    g.add_argument("--genppl-samples", metavar="N", type=int_arg(ge=1, le=MAX_SAMPLES), default=None,
                   help="generate N samples from --checkpoint and score them")
    g.add_argument("--evaluator", metavar="CKPT|hf:NAME", default=None,
                   help="the scoring LM: one of our checkpoints (read left to right) or hf:gpt2-large")
    g.add_argument("--gen-steps", type=config_arg(DecodePlan, "steps"), default=None,
                   help="generation steps (default: one per token)")
    g.add_argument("--gen-length", type=LENGTH, default=None, help="sample length (default: the model's context)")
    g.add_argument("--temperature", type=config_arg(SamplingConfig, "temperature"), default=1.0,
                   help="sampling temperature (default 1.0)")
    g.add_argument("--top-p", type=config_arg(SamplingConfig, "top_p"), default=1.0,
                   help="nucleus sampling threshold (default 1.0)")
    add_common(p)
    p.set_defaults(func=run)


def _lengths(text: str) -> tuple[int, ...]:
    """--span-lengths: comma-separated positive integers."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1 or max(values) > 100_000:
        raise argparse.ArgumentTypeError(f"must be comma-separated token counts in 1..100000, got {text!r}")
    return values


def _same_tokenizer(loaded: Any, prepared: Any) -> None:
    """Refuse data made with another tokenizer: the spec, and for a trained BPE its file, must match."""
    ours = loaded.meta.get("tokenizer")
    theirs = prepared.meta.get("tokenizer")
    fix = f"prepare the data with the model's tokenizer: aogpt prepare --tokenizer {ours}"
    if ours and theirs != ours:
        raise AOGPTError(f"{prepared.directory} was prepared with tokenizer {theirs}, the model uses {ours}", fix)
    if ours and ours.startswith("bpe:"):
        mine, data = loaded.path / "tokenizer" / "tokenizer.json", prepared.directory / "tokenizer.json"
        if mine.is_file() and data.is_file() and mine.read_bytes() != data.read_bytes():
            raise AOGPTError(f"{prepared.directory} was prepared with a different {ours} tokenizer than the model's "
                             "(trained on other text)", "evaluate on data prepared with the model's own tokenizer.json")


def _dataset(spec: str, loaded: Any, args: argparse.Namespace, block_len: int) -> tuple[Any, int | None, dict]:
    """(a function giving the blocks or a batch iterator, number of batches, description) for one
    --data/--suite entry; the function is called once per order."""
    from aogpt.data import zeroshot

    path = Path(spec).expanduser()
    if spec not in zeroshot.SUITES and spec not in zeroshot.STAND_INS and path.is_dir() \
            and (path / "meta.json").is_file():
        from aogpt.data import PreparedData

        prepared = PreparedData(path)
        _same_tokenizer(loaded, prepared)
        total = prepared.num_eval_batches("val", args.batch_size, block_len, args.max_batches)
        def batches() -> Any:
            return prepared.iter_eval_batches("val", args.batch_size, block_len, args.max_batches)

        return batches, total, {"source": str(path), "split": "val", "block_len": block_len,
                                "tokenizer": prepared.meta.get("tokenizer")}
    if loaded.tokenizer is None:
        raise AOGPTError(f"{loaded.path} records no tokenizer, so text cannot be encoded for {spec}",
                         "re-import it with `aogpt convert --tokenizer SPEC`, or use a prepared data directory")
    if spec in zeroshot.SUITES or spec in zeroshot.STAND_INS:
        blocks, info = zeroshot.load_blocks(spec, loaded.tokenizer, block_len, wrap=args.wrap, data_dir=args.data_dir)
    elif path.exists():
        texts = zeroshot.file_examples(path)
        blocks = zeroshot.pack(loaded.tokenizer.encode_batch(texts), block_len, loaded.tokenizer.eot_id, args.wrap)
        info = {"source": str(path), "split": "all", "examples": len(texts), "block_len": block_len, "wrap": args.wrap}
        if blocks.shape[0] == 0:
            raise AOGPTError(f"{path} gives less than one block of {block_len} tokens", "use a smaller --block-len")
    else:
        known = ", ".join((*zeroshot.SUITES, *zeroshot.STAND_INS))
        raise AOGPTError(f"unknown data {spec!r}", f"use a prepared data directory, a text file, or one of: {known}")
    if args.max_batches is not None:
        blocks = blocks[: args.max_batches * args.batch_size]
    return (lambda: blocks), math.ceil(blocks.shape[0] / args.batch_size), info


def _fmt(r: dict) -> str:
    ci = f" (95% CI {r['ppl_ci95'][0]:.2f}-{r['ppl_ci95'][1]:.2f}, se {r['se']:.4f} nats)" if r.get("se") else ""
    ens = f" M={r['ensemble']}" + (f" S={r['ensemble_positions']}" if r.get("ensemble_positions") else "")
    bpb = f"  bits/byte {r['bpb']:.4f}" if r.get("bpb") is not None else ""
    precision = f", scored in {r['precision']}" if r.get("precision") else ""
    return (f"{r['dataset']:<16} order={r['order']} K={r['num_orders']}{ens}: nll {r['nll']:.4f}  "
            f"ppl {r['ppl']:.2f}{ci}{bpb}  tokens {r['tokens']}  ({r['seconds']:.1f} s{precision})")


def table(results: list[dict], label: str) -> str:
    """A markdown table like the paper's Table 2: one row per (order, ensemble), one column per set."""
    from aogpt.data.zeroshot import title

    sets = list(dict.fromkeys(r["dataset"] for r in results))
    rows = list(dict.fromkeys((r["order"], r["ensemble"]) for r in results))
    lines = ["| Model | " + " | ".join(title(s) for s in sets) + " |", "|---" * (len(sets) + 1) + "|"]
    for order, m in rows:
        cells = []
        for s in sets:
            hit = [r for r in results if r["dataset"] == s and r["order"] == order and r["ensemble"] == m]
            cell = ""
            if hit:
                cell = f"{hit[0]['ppl']:.2f}"
                if hit[0].get("ppl_ci95"):  # half-width of the 95% interval
                    lo, hi = hit[0]["ppl_ci95"]
                    cell += f" ± {(hi - lo) / 2:.2f}"
            cells.append(cell)
        name = f"{label} ({order}" + (f", ensemble {m}" if m > 1 else "") + ")"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _likelihoods(loaded: Any, args: argparse.Namespace, sets: list[str]) -> list[dict]:
    from aogpt.evaluation.evaluate import check_request, evaluate
    from aogpt.memory import check_fits, evaluation_bytes

    orders = [o.strip() for o in args.order.split(",") if o.strip()]
    for order in orders:  # refuse bad requests before loading any data
        check_request(loaded.model, order, args.num_orders, args.ensemble, args.ensemble_positions)
    context = loaded.config.block_size
    block_len = args.block_len or min(1024, context)
    if block_len > context:
        raise AOGPTError(f"--block-len {block_len} exceeds the model's context of {context}",
                         f"use --block-len {context} or less (sliding windows are not supported: see docs)")
    device = next(loaded.model.parameters()).device
    check_fits(evaluation_bytes(loaded.config, args.batch_size * max(1, args.ensemble), block_len), device,
               "evaluation", "--batch-size or --block-len")
    results = []
    byte_lengths = loaded.tokenizer.byte_lengths() if loaded.tokenizer is not None else None
    for spec in sets:
        data, total, info = _dataset(spec, loaded, args, block_len)
        for order in orders:
            with progress(total=total, desc=f"eval {spec} {order}") as bar:
                res = evaluate(loaded.model, data(), order=order, num_orders=args.num_orders, ensemble=args.ensemble,
                               ensemble_positions=args.ensemble_positions, batch_size=args.batch_size,
                               max_batches=args.max_batches, seed=args.seed, progress=bar,
                               byte_lengths=byte_lengths)
            row = {"dataset": spec, **res.to_dict(), "data": info, "precision": args.precision}
            print(_fmt(row), flush=True)
            results.append(row)
    return results


def _genppl(loaded: Any, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict:
    from aogpt.evaluation.genppl import generate_texts, make_evaluator, read_samples, score_samples

    if args.evaluator is None:
        raise AOGPTError("generation perplexity needs an evaluator",
                         "pass --evaluator CKPT or --evaluator hf:gpt2-large")
    if args.genppl is not None:
        texts, source = read_samples(args.genppl), str(args.genppl)
    else:
        if loaded is None:
            raise AOGPTError("--genppl-samples generates from --checkpoint, which is missing", "pass --checkpoint RUN")
        texts = generate_texts(loaded, args.genppl_samples, args.seed, steps=args.gen_steps, length=args.gen_length,
                               temperature=args.temperature, top_p=args.top_p, batch_size=args.batch_size)
        source = f"generated by {loaded.path}"
    evaluator = make_evaluator(args.evaluator, device=device, dtype=dtype)
    with progress(desc="genppl") as bar:
        res = score_samples(evaluator, texts, batch_size=args.batch_size, progress=bar)
    out = {**res.to_dict(), "source": source}
    print(f"generation perplexity {res.genppl:.2f} (nll {res.nll:.4f}, {res.tokens} tokens, {res.samples} samples, "
          f"unigram entropy {res.entropy:.3f} nats) by {res.evaluator}", flush=True)
    return out


def _held_out(spec: str, loaded: Any) -> tuple[np.ndarray, dict]:
    """The held-out token stream of a prepared directory (its val split) or a text file."""
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "meta.json").is_file():
        from aogpt.data import PreparedData

        prepared = PreparedData(path)
        _same_tokenizer(loaded, prepared)
        ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in prepared.shards("val")])
        return ids, {"source": str(path), "split": "val", "tokenizer": prepared.meta.get("tokenizer")}
    if path.is_file() and loaded.tokenizer is not None:
        from aogpt.data import zeroshot

        texts = zeroshot.file_examples(path)
        ids = np.concatenate([[*t, loaded.tokenizer.eot_id] for t in loaded.tokenizer.encode_batch(texts)])
        return ids.astype(np.int64), {"source": str(path), "split": "all", "examples": len(texts)}
    raise AOGPTError(f"--infill reads a prepared data directory or a text file, got {spec!r}",
                     "pass --data DIR (from aogpt prepare) or --data FILE.txt")


def _infill(args: argparse.Namespace, sets: list[str], device: torch.device, dtype: torch.dtype) -> int:
    """`aogpt eval --infill`: the same cuts for the checkpoint and every --compare (docs/evaluation.md)."""
    from aogpt.checkpoint import load
    from aogpt.data.fim import SENTINELS, sentinels_of
    from aogpt.evaluation import infill
    from aogpt.evaluation.infill import calibration_cuts, make_cuts, score_cuts, summarize
    from aogpt.families import family_of

    if len(sets) != 1:
        raise AOGPTError(f"--infill scores one data set, got {len(sets)}", "pass exactly one --data")
    if not args.checkpoint:
        raise AOGPTError("no checkpoint given", "pass --checkpoint RUN")
    if args.genppl is not None or args.genppl_samples is not None:
        raise AOGPTError("--infill and generation perplexity both asked", "run them separately")
    args.span_lengths = args.span_lengths or infill.SPAN_LENGTHS  # the library's defaults, imported only here
    args.cuts = args.cuts or infill.NUM_CUTS
    args.infill_context = infill.CONTEXT if args.infill_context is None else args.infill_context
    loaded = load(args.checkpoint, weights=args.weights, device=device, dtype=dtype)
    if not family_of(loaded.model).any_order and sentinels_of(loaded.model) is None:
        raise AOGPTError(f"--checkpoint is a {loaded.config.variant}, which cannot read a suffix",
                         "pass an any-order or fill-in-the-middle model as --checkpoint, the left-to-right one "
                         "as --compare")
    others = [load(c, weights=args.weights, device=device, dtype=dtype) for c in args.compare]
    models: dict[str, Any] = {}
    for m in [loaded, *others]:
        name = m.config.variant + ("-fim" if sentinels_of(m.model) is not None else "")
        label = name if name not in models else f"{name} ({m.path.name})"
        if m is not loaded and m.meta.get("tokenizer") != loaded.meta.get("tokenizer"):
            raise AOGPTError(f"{m.path} uses tokenizer {m.meta.get('tokenizer')}, the checkpoint "
                             f"{loaded.meta.get('tokenizer')}", "compare models of the same tokenizer")
        models[label] = m
    ids, info = _held_out(sets[0], loaded)
    if loaded.tokenizer is None:
        raise AOGPTError(f"{loaded.path} records no tokenizer, so spans have no bytes",
                         "re-import it with `aogpt convert --tokenizer SPEC`")
    lengths = loaded.tokenizer.byte_lengths()
    widest = 2 * args.infill_context + max(args.span_lengths)
    for m in models.values():
        sentinels = SENTINELS if sentinels_of(m.model) is not None else 0  # a FIM row adds its sentinels
        if widest + sentinels > m.config.block_size:
            held = f" + {sentinels} fill-in-the-middle sentinels" if sentinels else ""
            raise AOGPTError(f"windows of {widest + sentinels} tokens ({args.infill_context} + span + "
                             f"{args.infill_context}{held}) exceed the context of {m.path} ({m.config.block_size})",
                             "use shorter --span-lengths or a smaller --infill-context")
    rows: list[dict] = []
    print(f"infill: {args.cuts} spans per length from {info['source']} (seed {args.seed}), "
          f"{args.infill_context} tokens of context each side; bits per byte of the span, 95% CI over spans",
          flush=True)
    for length in args.span_lengths:
        cuts = make_cuts(ids, length, num_cuts=args.cuts, context=args.infill_context, seed=args.seed,
                         eot_id=loaded.tokenizer.eot_id)
        calib = calibration_cuts(ids, cuts, args.seed, loaded.tokenizer.eot_id, min(infill.CALIBRATION_CUTS, args.cuts))
        scores = {}
        for label, m in models.items():
            with progress(total=math.ceil(args.cuts / args.batch_size), desc=f"infill {length} {label}") as bar:
                scores[label] = score_cuts(m.model, cuts, num_orders=args.num_orders, best=args.infill_order,
                                           seed=args.seed, batch_size=args.batch_size, byte_lengths=lengths,
                                           progress=bar, calibration=calib)
        block = summarize(scores)
        print(f"\nspan of {length} tokens:", flush=True)
        for r in block:
            lo, hi = r["bpb_ci95"]
            what = r["what"] + (f" ({r['order']})" if r.get("order") else "")
            what += " [chosen on other spans]" if r["row"] == "both/best" else ""
            se = f"  (se over K={args.num_orders} orders {r['draws_se']:.4f})" if r.get("draws_se") else ""
            se += f"  (the end token: {r['end_bpb']:.3f} of it)" if "end_bpb" in r else ""
            print(f"  {r['model']:<14} {what:<42} {r['bpb']:.3f} [{lo:.3f}, {hi:.3f}]{se}", flush=True)
        for r in block:
            if "gap_vs_both" in r:
                g = r["gap_vs_both"]
                print(f"  gap: {g['what']}: {g['bpb']:+.3f} [{g['ci95'][0]:+.3f}, {g['ci95'][1]:+.3f}] bits/byte",
                      flush=True)
        rows += block
    if args.json:
        emit_json({"command": "eval", "infill": rows, "seed": args.seed, "data": info,
                   "cuts": {"per_length": args.cuts, "context": args.infill_context,
                            "lengths": list(args.span_lengths), "rule": "uniform window starts without an EOT"},
                   "num_orders": args.num_orders, "best_order": args.infill_order,
                   "models": {lab: {"checkpoint": str(m.path), "step": m.step, "variant": m.config.variant}
                              for lab, m in models.items()}, "precision": args.precision})
    sys.stdout.flush()
    return 0


def run(args: argparse.Namespace) -> int:
    from aogpt.data import zeroshot

    device = resolve_device(args.device)
    dtype, _ = weights_precision(args.dtype, device)
    args.precision = name_of(dtype)
    sets = list(args.data) + (zeroshot.names(args.suite) if args.suite else [])
    wants_genppl = args.genppl is not None or args.genppl_samples is not None
    if args.genppl is not None and args.genppl_samples is not None:
        raise AOGPTError("--genppl and --genppl-samples both given", "score a file or generate, not both")
    if args.infill:
        return _infill(args, sets, device, dtype)
    if args.compare:
        raise AOGPTError("--compare is for infilling", "add --infill, or use `aogpt compare` for two runs")
    if not sets and not wants_genppl:
        raise AOGPTError("nothing to evaluate", "pass --data SPEC, --suite NAMES, --genppl FILE or --genppl-samples N")
    loaded = None
    if sets or args.genppl_samples is not None:
        if not args.checkpoint:
            raise AOGPTError("no checkpoint given", "pass --checkpoint RUN")
        from aogpt.checkpoint import load

        loaded = load(args.checkpoint, weights=args.weights, device=device, dtype=dtype)
    summary: dict[str, Any] = {"command": "eval", "seed": args.seed}
    if loaded is not None:
        summary.update(checkpoint=str(loaded.path), step=loaded.step, variant=loaded.config.variant,
                       weights=loaded.weights, precision=args.precision)
    if sets:
        results = _likelihoods(loaded, args, sets)
        summary["results"] = results
        if len(results) == 1:
            summary.update({k: results[0][k] for k in ("nll", "ppl", "bpb", "bytes", "tokens", "se", "ci95",
                                                       "ppl_ci95", "bpb_ci95")})
        else:
            print("\n" + table(results, loaded.config.variant), flush=True)
    if wants_genppl:
        summary["genppl"] = _genppl(loaded, args, device, dtype)
    if args.json:
        emit_json(summary)
    sys.stdout.flush()
    return 0
