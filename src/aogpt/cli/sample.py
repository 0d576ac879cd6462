"""`aogpt sample`: unconditional samples, prompts and infilling from a checkpoint, with the KV-cache
generator (`aogpt.generate`). Behaviour and decisions: docs/generation.md."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch

from aogpt.cli.common import add_common, config_arg, emit_json, int_arg, path_arg, progress
from aogpt.config import ModelConfig
from aogpt.device import resolve_device
from aogpt.errors import AOGPTError
from aogpt.generation.settings import DECODE_PATHS, MAX_DRAFT, DecodePlan, GenerationSettings, SamplingConfig
from aogpt.orders import is_adaptive, make_order_sampler
from aogpt.precision import WEIGHTS, check_usable, name_of, precision_arg, to_dtype, usable_note

MAX_SAMPLES = 100_000  # more would run for days on a CPU; run again with another --seed for more
HELP = "sample text from a checkpoint: unconditional, continuing a prompt, or filling [MASK:k] blanks"


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("sample", help=HELP, description=HELP + " (see docs/generation.md)")
    p.add_argument("--checkpoint", metavar="RUN", required=True,
                   help="run directory (its newest checkpoint) or a ckpt-* directory")
    p.add_argument("--num-samples", "-n", type=int_arg(ge=1, le=MAX_SAMPLES), default=1,
                   help=f"how many samples, 1..{MAX_SAMPLES:_} (default 1)")
    p.add_argument("--length", type=config_arg(ModelConfig, "block_size"), default=None,
                   help="tokens per sample, prompt or template included (default: the model's context; "
                   "with --infill: the template's length, more appends blanks at the end)")
    p.add_argument("--steps", type=config_arg(DecodePlan, "steps"), default=None,
                   help="generation steps T, 1..length (default: one per generated token)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--prompt", default=None, help="text to continue (a prefix, kept as is)")
    g.add_argument("--infill", metavar="TEMPLATE", default=None,
                   help="text with blanks: [MASK] is one token, [MASK:k] k tokens; the rest is never changed. Or a "
                   "passage with hidden words [[like this]]: prints the fill beside the original and the hidden "
                   "words' exact bits per byte")
    g.add_argument("--known", metavar="POS=ID,...", default=None,
                   help="explicit known tokens as position=token-id pairs (needs --length); the rest is generated")
    p.add_argument("--infill-method", metavar="METHOD", default=None,
                   help="how blanks are filled, one token per step: l2r (left to right inside each gap; the default "
                   "when --order is not given), random, confidence, margin, entropy, or best-of:D[:ORDER] (D "
                   "drafts, the most likely kept)")
    p.add_argument("--policy", choices=("bernoulli", "count"), default=None,
                   help="bernoulli: Lemma 4.1, each masked position revealed with prob. (t-s)/t (default for "
                   "any-order models); count: a fixed number per step (the reference code's rule; gpt)")
    p.add_argument("--schedule", choices=("linear", "cosine"), default="linear", help="time grid (default linear)")
    p.add_argument("--speculative", metavar="K|auto", default=None, type=_speculative,
                   help="exact self-speculative decoding: draft K positions per forward pass and verify them, so "
                   "samples follow the model's one-token-at-a-time law (auto: adapt K to the acceptance); "
                   "replaces --steps/--policy")
    p.add_argument("--order", default=None,
                   help="unmasking order: random (default; = uniform), l2r, another order spec (blockwise:4, "
                   "fixed-random:SEED, mixture:P, mallows:THETA, window:W, ...), a comma-separated permutation of "
                   "positions, or chosen by the model while decoding: confidence, margin, entropy (most sure "
                   "positions first)")
    p.add_argument("--candidates", type=config_arg(DecodePlan, "candidates"), default=None, metavar="C",
                   help="adaptive orders: score a random subset of C remaining positions per step (default: all)")
    p.add_argument("--threshold", type=config_arg(DecodePlan, "threshold"), default=None, metavar="P",
                   help="adaptive orders: also reveal every position whose top probability is at least P "
                   "(at least one per step)")
    p.add_argument("--temperature", type=config_arg(SamplingConfig, "temperature"), default=1.0,
                   help="softmax temperature, > 0 (default 1.0)")
    p.add_argument("--top-p", type=config_arg(SamplingConfig, "top_p"), default=1.0,
                   help="nucleus threshold in (0, 1] (default 1.0: off)")
    p.add_argument("--top-k", type=config_arg(SamplingConfig, "top_k"), default=0,
                   help="keep the k most likely tokens (default 0: off)")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    p.add_argument("--float32-sampling", action="store_true",
                   help="draw tokens in float32 (default float64: float32 lowers the effective temperature)")
    p.add_argument("--batch-size", type=config_arg(GenerationSettings, "batch_size"), default=32,
                   help="sequences decoded together (default 32)")
    p.add_argument("--until-eot", action="store_true",
                   help="end each sample's text at its first end-of-text token (in position order: in a random "
                   "order, tokens after it may have been drawn before it; they are dropped from the text) instead "
                   "of showing the whole --length")
    p.add_argument("--weights", choices=("ema", "raw"), default="ema", help="EMA (default) or raw weights")
    p.add_argument("--show", type=int_arg(ge=0, le=MAX_SAMPLES), default=None, metavar="N",
                   help="print only the first N samples (default: all; --json still holds all)")
    p.add_argument("--word-check", metavar="DATA", type=path_arg, default=None,
                   help="also print the share of the samples' words (3+ letters) that occur in the training text "
                   "of this prepared data directory: a plain check that samples are made of real words")
    p.add_argument("--no-cache", action="store_true",
                   help="recompute every slot at every step instead of using the KV cache (slow; for comparison)")
    p.add_argument("--decode-path", choices=DECODE_PATHS, default="fast",
                   help="how a decode step is computed: fast (kernels measured on this CPU, the default) or "
                   "reference (the model's own layers with torch's default kernels, for comparison); the same samples "
                   "either way")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--dtype", type=precision_arg(WEIGHTS), default="auto", metavar="P",
                   help="the model's weights for the forward passes: auto (whichever of fp32 and bf16 generates "
                   "faster with this model on this machine, timed once; fp32 where the CPU has no bf16 units), "
                   "fp32 (float32), bf16 (bfloat16), fp16 (float16), fp64 (float64); draws stay in float64")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_common(p)
    p.set_defaults(func=run)


def _int_list(text: str, what: str, fix: str) -> list[int]:
    try:
        values = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise AOGPTError(f"cannot read {what} {text!r}", fix) from None
    if any(v >= 2**31 for v in values):
        raise AOGPTError(f"the {what} {text[:40]!r} holds a number beyond any context", fix)
    return values


def _speculative(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_DRAFT:
        raise argparse.ArgumentTypeError(f"expected a draft length K in 1..{MAX_DRAFT} or 'auto', got {text!r}")
    return value


def _order(spec: str | None) -> Any:
    """An order spec (checked here, so a typo fails before the model loads) or explicit positions."""
    if spec is None:
        return None
    if spec.replace(",", "").replace(" ", "").isdigit():
        return torch.tensor(_int_list(spec, "order", "list positions as 0,2,1,..."))
    if is_adaptive(spec):
        return spec
    make_order_sampler(spec)
    return spec


def _known(spec: str, length: int | None) -> dict[int, int]:
    if length is None:
        raise AOGPTError("--known needs the output --length", "add --length N")
    out: dict[int, int] = {}
    for part in spec.replace(" ", "").split(","):
        pos, sep, tok = part.partition("=")
        if not (sep and pos.isdecimal() and tok.isdecimal() and len(pos) < 12 and len(tok) < 12):
            raise AOGPTError(f"cannot read known token {part[:40]!r}", "write POS=ID pairs, e.g. --known 0=12,5=7")
        out[int(pos)] = int(tok)
    return out


def _training_words(data_dir: Any) -> frozenset[str]:
    """The words of a prepared data directory's training text (read before the model loads, so a wrong
    path fails first)."""
    from aogpt.data import PreparedData
    from aogpt.measures import vocabulary

    data = PreparedData(data_dir)
    return vocabulary(data.tokenizer.decode(data.split("train").tolist()))


def _describe(s: dict[str, Any], weights: str) -> str:
    parts = [f"{s['variant']}", f"{s['num_samples']} sample(s) x {s['length']} tokens"]
    if s["known_tokens"]:
        parts.append(f"{s['known_tokens']} given")
    order = f"order {s['order']}"
    if s.get("candidates") is not None:
        order += f" ({s['candidates']} candidates per step)"
    if s.get("threshold") is not None:
        order += f" (threshold {s['threshold']:g})"
    how = (f"speculative decoding (draft {s['speculative']}), {s['steps']} forward passes" if s.get("speculative")
           else f"{s['steps']} steps ({s['policy']}, {s['schedule']})")
    parts += [how, order,
              "greedy" if s["greedy"] else f"temperature {s['temperature']:g}, top-p {s['top_p']:g}, "
              f"top-k {s['top_k']}", f"seed {s['seed']}", f"{weights} weights",
              "KV cache" if s["use_cache"] else "no cache"]
    if s.get("decode_path") == "reference":
        parts.append("the reference decode path (torch's default kernels)")
    return "settings: " + ", ".join(parts)


class _LazyBar:
    """A progress bar that appears with the first generated tokens, so input errors print alone."""

    def __init__(self, disable: bool):
        self.disable, self.bar = disable, None

    def __call__(self, tokens: int) -> None:
        if self.bar is None:
            self.bar = progress(desc="sampling", unit="tok", disable=self.disable)
        self.bar.update(tokens)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _passage(args: argparse.Namespace, tokenizer: Any) -> Any:
    """A --infill passage with [[hidden words]] (None for an ordinary template)."""
    from aogpt.generation.infill import HIDDEN, parse_passage

    if args.infill is None or not HIDDEN.search(args.infill):
        return None
    if "[MASK" in args.infill:
        raise AOGPTError("the passage mixes [[hidden words]] and [MASK] blanks", "use one kind of blank")
    return parse_passage(args.infill, tokenizer)


def _infill_method(args: argparse.Namespace, template: Any) -> str | None:
    """The infilling method (`aogpt.generation.infill`): given, or the default when the order is not."""
    if args.infill_method is not None:
        if template is None:
            raise AOGPTError("--infill-method fills blanks, but there are none", "add --infill TEMPLATE")
        if args.order is not None or args.speculative is not None:
            raise AOGPTError("--infill-method sets the order", "drop --order/--speculative, or --infill-method")
        from aogpt.generation.infill import parse_method

        parse_method(args.infill_method)  # refused before the model loads
        return args.infill_method
    if template is None or args.order is not None or args.speculative is not None or args.steps is not None \
            or args.policy == "bernoulli":
        return None
    from aogpt.generation.infill import DEFAULT_METHOD

    return DEFAULT_METHOD


def _fills_middle(args: argparse.Namespace, model: Any) -> bool:
    """Whether a fill-in-the-middle model fills the blanks (its own way: no other method or order)."""
    from aogpt.data.fim import sentinels_of

    if sentinels_of(model) is None:
        return False
    if args.infill_method is not None or args.order is not None or args.speculative is not None:
        raise AOGPTError("a fill-in-the-middle model fills each gap left to right after the text on both sides",
                         "drop --infill-method, --order and --speculative")
    return True


def _without_order(settings: GenerationSettings) -> GenerationSettings:
    import dataclasses

    return dataclasses.replace(settings, plan=dataclasses.replace(settings.plan, order=None))


def _show_passage(loaded: Any, passage: Any, res: Any, shown: list[str]) -> dict[str, Any]:
    """Template, fills, original, and the hidden words' exact bits per byte (given the rest)."""
    import math

    from aogpt.families import family_of
    from aogpt.generation.infill import fill_nll

    tok = loaded.tokenizer
    lengths = tok.byte_lengths()
    hidden_bytes = int(sum(int(lengths[t]) for t, h in zip(passage.tokens, passage.hidden, strict=True) if h))
    fam = family_of(loaded.model)
    bpb = math.nan
    how = "given the rest of the passage, read left to right inside each gap"
    if res.settings.get("infill_method") == "fim":
        from aogpt.generation.fim import fim_fill_nll

        bpb = float(fim_fill_nll(loaded.model, passage.tokens[None], ~passage.hidden)[0]) / hidden_bytes / math.log(2)
        how = "each gap and its end given the text before it and the given text after it"
    elif fam.causal and fam.one_pass_nll:  # an encoder-only MDM has no exact likelihood of the span
        nll = float(fill_nll(loaded.model, passage.tokens[None], ~passage.hidden)[0])
        bpb = nll / hidden_bytes / math.log(2)
    print(f"template:\n{passage.template}")
    for i, text in enumerate(shown):
        print(f"fill {i + 1} of {len(res.tokens)}:\n{text}")
    print(f"original:\n{passage.text}")
    exact = (f"the model gives the original {bpb:.3f} bits/byte (exact, {how})") if math.isfinite(bpb) \
        else "no exact likelihood for this model"
    print(f"hidden words: {int(passage.hidden.sum())} tokens, {hidden_bytes} bytes; {exact}")
    return {"passage": {"template": passage.template, "original": passage.text, "hidden_tokens":
                        int(passage.hidden.sum()), "hidden_bytes": hidden_bytes, "original_bpb": bpb}}


def settings_from_args(args: argparse.Namespace) -> GenerationSettings:
    """The flags as one `GenerationSettings` (the object the Python API and the benchmarks use)."""
    sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, greedy=args.greedy,
                              dtype=torch.float32 if args.float32_sampling else torch.float64)
    plan = DecodePlan(steps=args.steps, policy=args.policy, schedule=args.schedule, order=_order(args.order),
                      speculative=args.speculative, candidates=args.candidates, threshold=args.threshold)
    return GenerationSettings(sampling, plan, batch_size=args.batch_size, use_cache=not args.no_cache,
                              decode_path=args.decode_path).validate()


def run(args: argparse.Namespace) -> int:
    from aogpt.checkpoint import load
    from aogpt.generation.generate import generate, infill, text_end

    settings = settings_from_args(args)
    if args.until_eot and (args.infill is not None or args.known is not None):
        raise AOGPTError("--until-eot ends a continuation where its text ends, but blanks have fixed places",
                         "drop --until-eot, or use --prompt")
    device = resolve_device(args.device)
    known_words = _training_words(args.word_check) if args.word_check is not None else None
    dtype = torch.float32 if args.dtype == "auto" else to_dtype(args.dtype)
    check_usable(dtype, device)  # an explicit precision this CPU cannot compute in: one line, before any work
    loaded = load(args.checkpoint, weights=args.weights, device=device, dtype=dtype)
    why = f"{name_of(dtype)} (asked for{usable_note(dtype, device)})"
    if args.dtype == "auto":  # the faster precision for this model and batch, measured once per process
        from aogpt.generation.precision import fastest_precision

        dtype, why = fastest_precision(loaded.model, min(args.num_samples, settings.batch_size))
        loaded.model.to(dtype)
    if loaded.tokenizer is None:
        raise AOGPTError(f"checkpoint {loaded.path} has no tokenizer to decode samples", "re-save it with one")
    kwargs: dict[str, Any] = dict(settings=settings, num_samples=args.num_samples, seed=args.seed,
                                  tokenizer=loaded.tokenizer)
    template = args.infill if args.infill is not None else _known(args.known, args.length) if args.known else None
    passage = _passage(args, loaded.tokenizer)
    fim = template is not None and _fills_middle(args, loaded.model)
    method = "fim" if fim else _infill_method(args, template)
    if method is not None and args.infill_method is None and not fim:
        from aogpt.families import family_of

        method = method if family_of(loaded.model).any_order else None  # a GPT fills left to right only
    if passage is not None:
        template = passage.slots
    n_out = args.length or loaded.config.block_size
    bar = _LazyBar(args.no_progress)
    kwargs["progress"] = bar
    try:
        if fim:
            from aogpt.generation.fim import fim_fill

            res = fim_fill(loaded.model, template, length=args.length, **kwargs)
        elif method is not None:
            from aogpt.generation.infill import fill

            del kwargs["settings"]
            res = fill(loaded.model, template, method=method, length=args.length, settings=_without_order(settings),
                       **kwargs)
        elif template is not None:
            res = infill(loaded.model, template, length=args.length, **kwargs)
        else:
            res = generate(loaded.model, prompt=args.prompt or None, length=n_out, **kwargs)
    finally:
        bar.close()
    print(f"{_describe(res.settings, args.weights)}; forward passes in {why}", file=sys.stderr)
    t = res.timing
    print(f"generated {int(res.step_counts.sum())} tokens in {t['seconds']:.2f} s "
          f"({t['tokens_per_second']:.0f} tokens/s, {t['forwards']} forward passes)", file=sys.stderr)
    if "tokens_per_forward" in t:
        rates = ", ".join(f"{j}: {a:.2f}" for j, a in t["acceptance_by_position"].items()) or "none verified"
        print(f"speculative decoding: {t['tokens_per_forward']:.2f} tokens per forward pass per sequence; "
              f"acceptance by draft position {rates}", file=sys.stderr)
    if method is not None:
        print(f"infilling: {res.settings['order']}" + (" (the default for --infill: docs/generation.md; "
              "--infill-method or --order picks another)" if args.infill_method is None and not fim else ""),
              file=sys.stderr)
    texts = res.texts or []
    ends = None
    if args.until_eot:  # the text ends at the first end-of-text token after the prompt
        start = len(loaded.tokenizer.encode(args.prompt)) if args.prompt else 0
        ends = [text_end(row.numpy(), start, getattr(loaded.tokenizer, "eot_id", None)) for row in res.tokens]
        texts = [loaded.tokenizer.decode(row[:end]) if end is not None else text
                 for row, end, text in zip(res.tokens, ends, texts, strict=True)]
        cut = sum(e is not None for e in ends)
        print(f"until end of text: {cut} of {len(ends)} sample(s) ended before --length", file=sys.stderr)
    shown = texts if args.show is None else texts[:args.show]
    extra: dict[str, Any] = {}
    if passage is not None:
        extra = _show_passage(loaded, passage, res, shown)
    else:
        for i, text in enumerate(shown):
            if len(texts) > 1:
                print(f"--- sample {i + 1} of {len(texts)} ---")
            print(text)
    share = None
    if known_words is not None:
        from aogpt.measures import WordShare, word_share

        if template is not None:  # an infill: only the words that touch a filled token
            from aogpt.generation.infill import filled_words

            found = [w for row in res.tokens for w in filled_words(loaded.tokenizer, row, res.known)]
            share = WordShare(sum(w in known_words for w in found), len(found))
            which = "the filled words" + ("" if len(texts) == 1 else f" of all {len(texts)} samples")
        else:
            share = word_share(texts, known_words)
            which = "the sample" if len(texts) == 1 else f"all {len(texts)} samples"
        print(f"words in {which}: {share.describe()}")
    if args.json:
        emit_json({"command": "sample", "checkpoint": str(loaded.path), "step": loaded.step,
                   "weights": args.weights,
                   "precision": name_of(dtype), "precision_why": why, "samples": texts,
                   **({"text_ends": ends} if ends is not None else {}),
                   "tokens": res.tokens.tolist(),
                   "timing": res.timing, "settings": res.settings, **extra,
                   **({"word_share": share.share, "words": share.total} if share is not None else {})})
    return 0
