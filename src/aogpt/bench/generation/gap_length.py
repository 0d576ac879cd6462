"""How well the model finds the length of a gap (`aogpt.generation.length`), against a fixed guess.

Held-out spans: from the prepared data's validation split, spans of whole words (a span starts and
ends where a token begins with white space), drawn as: a start among word starts, a target length
uniform in 1..`TARGET`, the span running to the first word start at or past it (at most `LONGEST`
tokens), with `CONTEXT` tokens of prefix and of suffix around it, the whole window inside one
document. Each seed draws its own spans (`draw_seed(seed, "gap-length-spans")`).

For every span the model gets the prefix and the suffix and no length, and for each candidate
k = 1..`MAX_GAP` the importance-sampling estimate of p_k from D proposal fills (D = 1, 4 (the
default) and 16: the first D of the same 16 draws, each draw its own stream, so the rows are what
`choose_length(draws=D)` returns). The baseline guesses one length for every span: the median true
length of spans drawn the same way from the *training* split. A third row uses the true length
(what an oracle gets). Per method:

- how often the length is exact, within 1 and within 2 tokens, and the mean absolute error;
- the infill's bits per byte: the gap filled at that length (left to right inside the gap, given both
  sides: aogpt's default infilling), then the exact bits of the filled gap *and the suffix* given the
  prefix, read left to right, per byte of that text. A wrong length shows as a suffix that no longer
  follows; the true span's own bits per byte are the reference row.

Means over spans with 95% Student-t intervals (`aogpt.stats`), and the estimate's gain over the
fixed guess paired over the same spans.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aogpt.bench.common import markdown_table, write_outputs
from aogpt.bench.environment import describe_environment, environment, finish_environment
from aogpt.errors import AOGPTError
from aogpt.generation.generate import generate
from aogpt.generation.length import MAX_GAP, ids_layout, log_marginal
from aogpt.generation.likelihood import chain_logprobs
from aogpt.seeds import draw_seed
from aogpt.stats import Measurement, difference, mean_interval

CONTEXT = 32  # tokens of prefix and of suffix
TARGET = 12  # target span lengths 1..TARGET (then run on to a word start)
LONGEST = 16  # longest true span kept
DRAWS = (1, 4, 16)  # proposal fills per candidate, rows of the table (prefixes of the same 16 draws)
QUALITY_WINDOWS = 64  # held-out windows the model's bits per byte are measured on
QUICK = {"spans": 4, "seeds": 1, "max_gap": 6, "draws": (1, 4), "context": 8, "target": 3, "longest": 5}


def word_starts(tokenizer: Any) -> np.ndarray:
    """(V,) bool: the token's text begins with white space (a word starts there)."""
    out = np.zeros(tokenizer.vocab_size, dtype=bool)
    for i in range(tokenizer.vocab_size):
        piece = tokenizer.decode([i])
        out[i] = bool(piece) and piece[0].isspace()
    return out


def draw_spans(tokens: np.ndarray, starts: np.ndarray, eot: int | None, count: int, seed: int, *,
               context: int = CONTEXT, target: int = TARGET, longest: int = LONGEST) -> list[tuple[int, int]]:
    """`count` spans (start, end) of whole words with `context` tokens on each side in one document."""
    rng = np.random.Generator(np.random.PCG64(seed))
    begins = np.flatnonzero(starts[tokens])
    out: list[tuple[int, int]] = []
    eots = np.concatenate([[0], np.cumsum(tokens == eot)]) if eot is not None else None
    for _ in range(count * 1000):
        if len(out) == count:
            return out
        s = int(rng.choice(begins))
        want = int(rng.integers(1, target + 1))
        later = begins[begins >= s + want]
        if not len(later) or later[0] - s > longest or s < context or later[0] + context > len(tokens):
            continue
        e = int(later[0])
        if eots is not None and eots[e + context] - eots[s - context] > 0:
            continue
        out.append((s, e))
    raise AOGPTError(f"found only {len(out)} spans of whole words in the held-out text, {count} asked",
                     "ask for fewer spans, or use a larger held-out split")


def held_out_quality(model: Any, tokenizer: Any, val: np.ndarray, seed: int, windows: int = QUALITY_WINDOWS
                     ) -> dict[str, Any]:
    """The model's bits per byte on the first `windows` context-long windows of the held-out split,
    left to right (exact) and in one random order per window: the scale the table is measured at."""
    from aogpt.evaluation.evaluate import evaluate

    n = model.config.block_size
    count = min(windows, len(val) // n)
    data = torch.from_numpy(np.asarray(val[:count * n], dtype=np.int64)).view(count, n)
    lengths = np.asarray(tokenizer.byte_lengths())
    out = {"windows": count, "tokens": count * n}
    for order in ("l2r", "random"):
        out[order] = evaluate(model, data, order=order, seed=seed, byte_lengths=lengths).bpb
    return out


def _bits_per_byte(model: Any, rows: torch.Tensor, first: int, byte_len: np.ndarray) -> np.ndarray:
    """Exact bits per byte of tokens first.. of each row given the tokens before (left to right)."""
    logp = chain_logprobs(model, rows, torch.arange(rows.shape[1]).expand_as(rows)).logprobs[:, first:]
    nbytes = byte_len[rows[:, first:].numpy()].sum(1)
    return (-logp.sum(1).numpy() / math.log(2)) / np.maximum(nbytes, 1)


def _fill(model: Any, before: list[int], after: list[int], k: int, seed: int, tokenizer: Any) -> torch.Tensor:
    cond = ids_layout(before, after, model.config)(k)
    return generate(model, condition=cond, seed=seed, order="l2r", policy="count", tokenizer=tokenizer).tokens


def bench_gap_length(model: Any, tokenizer: Any, val: np.ndarray, train: np.ndarray, *, spans: int, seeds: int,
                     seed: int, max_gap: int = MAX_GAP, draws: tuple[int, ...] = DRAWS, out: Path | None = None,
                     progress: Callable[[int, str], None] | None = None, meta: dict[str, Any] | None = None,
                     context: int = CONTEXT, target: int = TARGET, longest: int = LONGEST) -> dict[str, Any]:
    """The measurement of the module docstring (`meta`: what to record beside it, e.g. the checkpoint);
    writes DIR/gap-length.md and .json."""
    if 2 * context + max(max_gap, longest) > model.config.block_size:
        raise AOGPTError(f"{context} tokens on each side and gaps of up to {max(max_gap, longest)} tokens do not fit "
                         f"the model's context of {model.config.block_size}", "use a model with a longer context")
    model.eval()
    env = environment(next(model.parameters()).device, "fp32")  # the checkpoint's weights as loaded, no autocast
    starts = word_starts(tokenizer)
    eot = getattr(tokenizer, "eot_id", None)
    byte_len = np.asarray(tokenizer.byte_lengths(), dtype=np.int64)
    byte_len = np.concatenate([byte_len, np.zeros(max(0, model.config.vocab_size - len(byte_len)), np.int64)])
    shape = {"context": context, "target": target, "longest": longest}
    train_spans = draw_spans(train, starts, eot, 2000, draw_seed(seed, "gap-length-baseline"), **shape)
    guess = int(np.median([e - s for s, e in train_spans]))
    quality = held_out_quality(model, tokenizer, val, seed, 2 if spans * seeds <= QUICK["spans"] else QUALITY_WINDOWS)
    ks = list(range(1, max_gap + 1))
    rows: dict[str, list[float]] = {}
    per_span: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    done = 0
    for rep in range(seeds):
        for s, e in draw_spans(val, starts, eot, spans, draw_seed(seed + rep, "gap-length-spans"), **shape):
            before = val[s - context:s].tolist()
            after = val[e:e + context].tolist()
            true = e - s
            span_seed = draw_seed(seed + rep, "gap-length", s)
            layout = ids_layout(before, after, model.config)
            weights = torch.stack([log_marginal(model, layout(k), max(draws), draw_seed(span_seed, "gap-length", k))[1]
                                   for k in ks])  # (K, D): log p / q of each draw
            chosen = {d: ks[int(torch.argmax(torch.logsumexp(weights[:, :d], 1)))] for d in draws}
            picks = {f"estimate, D={d}": k for d, k in chosen.items()}
            picks.update({f"fixed guess ({guess} tokens)": guess, "true length": true})
            bpb = {}
            for name, k in picks.items():
                filled = _fill(model, before, after, k, draw_seed(span_seed, "fill"), tokenizer)
                bpb[name] = float(_bits_per_byte(model, filled, context, byte_len)[0])
            original = torch.tensor([val[s - context:e + context].tolist()])
            bpb["the true span"] = float(_bits_per_byte(model, original, context, byte_len)[0])
            record = {"seed": seed + rep, "start": s, "true": true, "picks": picks, "bits_per_byte": bpb}
            per_span.append(record)
            for name, k in picks.items():
                rows.setdefault(f"{name}|error", []).append(abs(k - true))
            for name, value in bpb.items():
                rows.setdefault(f"{name}|bpb", []).append(value)
            done += 1
            if progress is not None:
                progress(done, f"seed {rep + 1}/{seeds}, span {len(per_span)}")
    units = [f"{r['seed']}:{r['start']}" for r in per_span]

    def est(values: list[float]) -> dict[str, Any]:
        return mean_interval(Measurement.of(values, "spans", units)).to_dict()

    methods = [f"estimate, D={d}" for d in draws] + [f"fixed guess ({guess} tokens)", "true length"]
    ids = [f"estimate-d{d}" for d in draws] + ["fixed-guess", "true-length"]
    table = []
    for name, slug in zip(methods, ids, strict=True):
        err = np.asarray(rows[f"{name}|error"])
        table.append({"id": slug, "method": name, "exact": est((err == 0).tolist()),
                      "within_1": est((err <= 1).tolist()), "within_2": est((err <= 2).tolist()),
                      "mean_abs_error": est(err.tolist()),
                      "bits_per_byte": est(rows[f"{name}|bpb"]),
                      "per_seed_within_2": [float(np.mean([abs(r["picks"][name] - r["true"]) <= 2 for r in per_span
                                                           if r["seed"] == seed + i])) for i in range(seeds)]})
    table.append({"id": "true-span", "method": "the true span", "bits_per_byte": est(rows["the true span|bpb"])})
    default = f"estimate, D={4 if 4 in draws else draws[-1]}"
    baseline = f"fixed guess ({guess} tokens)"

    def hits(name: str) -> Measurement:
        return Measurement.of([float(abs(r["picks"][name] - r["true"]) <= 2) for r in per_span], "spans", units)

    gain = {"within_2": difference(hits(default), hits(baseline)).to_dict(),
            "bits_per_byte": difference(Measurement.of(rows[f"{baseline}|bpb"], "spans", units),
                                        Measurement.of(rows[f"{default}|bpb"], "spans", units)).to_dict()}
    true_lengths = [r["true"] for r in per_span]
    result = {"benchmark": "gap-length", "spans": len(per_span), "seeds": seeds, "seed": seed,
              "context": context, "candidates": [1, max_gap], "draws": list(draws), "fixed_guess": guess,
              "true_length": {"min": min(true_lengths), "median": float(np.median(true_lengths)),
                              "max": max(true_lengths)},
              "rows": table, "gain_over_fixed_guess": {"method": default, **gain},
              "seconds": time.perf_counter() - t0, "environment": finish_environment(env),
              "model": {"variant": model.config.variant, "layers": model.config.n_layer, "width": model.config.n_embd,
                        "context": model.config.block_size, "params": sum(p.numel() for p in model.parameters()),
                        "held_out_bits_per_byte": quality},
              **(meta or {}), "per_span": per_span}
    result["files"] = write_outputs(out, "gap-length", to_markdown(result), result) if out is not None else {}
    return result


def to_markdown(r: dict[str, Any], source: str | None = None) -> str:
    """The report; with `source` (the results file's path in the repository) every measured number
    carries its figure marker (`aogpt.figures`), ready to be quoted in a document."""

    def num(value: float, key: str, fmt: str) -> str:
        text = format(value, fmt)
        return f"{text}<!-- fig: {source}#{key} -->" if source else text

    def cell(row: dict[str, Any], what: str, percent: bool) -> str:
        e, base = row[what], f"rows.id={row['id']}.{what}"
        if percent:
            low, high = num(e['low'] * 100, base + '.low *100', '.1f'), num(e['high'] * 100, base + '.high *100', '.1f')
            return f"{num(e['value'] * 100, base + '.value *100', '.1f')} % [{low}, {high}]"
        return (f"{num(e['value'], base + '.value', '.3f')} [{num(e['low'], base + '.low', '.3f')}, "
                f"{num(e['high'], base + '.high', '.3f')}]")

    m = r["model"]
    head = [f"# Gap length chosen by the model ({r['spans']} held-out spans, {r['seeds']} seed(s))", "",
            f"Model: {m['variant']}, {m['layers']} layers, width {m['width']}, context {m['context']}, "
            f"{m['params']:,} parameters, {m['held_out_bits_per_byte']['l2r']:.3f} bits/byte left to right and "
            f"{m['held_out_bits_per_byte']['random']:.3f} in a random order on held-out text. Spans of whole words, "
            f"{r['true_length']['min']}..{r['true_length']['max']} "
            f"tokens (median {r['true_length']['median']:g}), {r['context']} tokens of prefix and suffix; candidates "
            f"{r['candidates'][0]}..{r['candidates'][1]}; fixed guess {r['fixed_guess']} tokens (the median on the "
            "training split). Means over spans, 95% intervals.", ""]
    rows = []
    for row in r["rows"]:
        if "exact" not in row:
            rows.append([row["method"], "-", "-", "-", "-", cell(row, "bits_per_byte", False)])
            continue
        rows.append([row["method"], cell(row, "exact", True), cell(row, "within_1", True), cell(row, "within_2", True),
                     cell(row, "mean_abs_error", False), cell(row, "bits_per_byte", False)])
    table = markdown_table(["method", "exact", "within 1", "within 2", "mean abs. error (tokens)",
                            "infill bits/byte (gap + suffix)"], rows)
    g = r["gain_over_fixed_guess"]
    w, b = g["within_2"], g["bits_per_byte"]
    key = "gain_over_fixed_guess"
    tail = ["", f"{g['method']} against the fixed guess, paired over the spans: within 2 tokens "
            f"{num(w['value'] * 100, key + '.within_2.value *100', '+.1f')} points "
            f"[{num(w['low'] * 100, key + '.within_2.low *100', '+.1f')}, "
            f"{num(w['high'] * 100, key + '.within_2.high *100', '+.1f')}]; bits per byte lower by "
            f"{num(b['value'], key + '.bits_per_byte.value', '.3f')} "
            f"[{num(b['low'], key + '.bits_per_byte.low', '.3f')}, "
            f"{num(b['high'], key + '.bits_per_byte.high', '.3f')}].",
            f"{r['seconds']:.0f} s. " + describe_environment(r["environment"])]
    return "\n".join(head + [table] + tail)
