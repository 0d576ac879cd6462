"""`aogpt bench speculative`: exact self-speculative decoding against one token per step.

On a trained AO-GPT (speculation gains only where the model is predictable: random weights accept
little), for each n and batch size, side by side in this process and interleaved round by round:

- ``one-token``: AO-GPT revealing one position per forward (random order, KV cache): the exact
  sequential sampler speculation must equal in law;
- ``spec-K`` for every K asked (a number, or ``auto``): drafting K positions per forward and
  verifying them exactly;
- ``gpt``: our left-to-right GPT with its KV cache (one token per forward), when a GPT checkpoint of
  the same size is given.

It reports wall and CPU time, forward passes, tokens per forward pass (per sequence) and the
acceptance rate of each draft position, plus the quality check: the mean negative log-likelihood
per token of `samples` sequences from each sampler, scored left to right by an evaluator (the GPT
if given, else the AO-GPT itself), with its standard error and a Welch test against one-token
sampling (the two laws are equal, so the difference must be noise). Sampling in float64.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import scipy.stats
import torch

from aogpt.bench.common import (
    Size,
    build_model,
    fmt_ratio,
    fmt_seconds,
    interleaved_timings,
    markdown_table,
    timed_cpu,
    write_outputs,
)
from aogpt.bench.environment import describe_environment, environment, finish_environment
from aogpt.errors import AOGPTError
from aogpt.families import family_of
from aogpt.plots import save_png
from aogpt.precision import name_of


def _ks(text: list[str]) -> list[int | str]:
    out: list[int | str] = []
    for k in text:
        if k != "auto" and (not str(k).isdigit() or int(k) < 1):
            raise AOGPTError(f"bad draft length {k!r}", "give K >= 1 or auto, e.g. --k 2,4,8,auto")
        out.append(k if k == "auto" else int(k))
    return list(dict.fromkeys(out))


def sample_nll(evaluator: torch.nn.Module, tokens: torch.Tensor) -> list[float]:
    """Per-sample mean NLL (nats per token) under `evaluator` read left to right."""
    with torch.inference_mode():
        return evaluator(tokens.to(next(evaluator.parameters()).device))[1].double().mean(1).tolist()


def bench_speculative(aogpt: Any, *, gpt: Any = None, ns: list[int] = (128, 256), batches: list[int] = (1, 8),
                      ks: list[int | str] = (2, 4, 8, "auto"), repeats: int = 3, samples: int = 16, seed: int = 0,
                      temperature: float = 1.0, top_p: float = 1.0, out: Path | None = None,
                      progress: Callable[[int, str], None] | None = None) -> dict[str, Any]:
    """Time and check speculation on a trained AO-GPT (`aogpt.load` result or model); see the module doc."""
    from aogpt.generation.generate import generate

    model = getattr(aogpt, "model", aogpt)
    gpt_model = getattr(gpt, "model", gpt)
    family_of(model)  # not an aogpt model: a clear error now; a family that cannot speculate fails below
    ks = _ks([str(k) for k in ks])
    if repeats < 1 or samples < 2 or not ns or not batches:
        raise AOGPTError("repeats >= 1, samples >= 2 and some n and batch sizes are needed", "fix the flags")
    for n in ns:
        if not 1 <= n <= model.config.block_size or (gpt_model is not None and n > gpt_model.config.block_size):
            raise AOGPTError(f"n = {n} does not fit the models' context", "use a smaller --n")
    if gpt_model is not None and gpt_model.config.vocab_size != model.config.vocab_size:
        raise AOGPTError("the GPT and the AO-GPT have different vocabularies", "use checkpoints of one tokenizer")
    timing_gpt, gpt_weights = gpt_model, "trained"
    if timing_gpt is None:  # its time does not depend on its weights (always n one-slot steps): random ones
        c = model.config
        timing_gpt = build_model("gpt", Size(c.n_layer, c.n_embd, c.n_head, c.vocab_size), c.block_size,
                                 next(model.parameters()).device, seed)
        gpt_weights = "random weights, same size"
    env = environment(next(model.parameters()).device, name_of(next(model.parameters()).dtype))
    common = dict(temperature=temperature, top_p=top_p, seed=seed)
    last: dict[Any, Any] = {}

    def call(name: str, n: int, B: int) -> Callable[[], None]:
        if name == "gpt":
            kw = dict(policy="count", order="l2r")
        elif name == "one-token":
            kw = dict(policy="count")
        else:
            kw = dict(speculative=ks[[f"spec-{k}" for k in ks].index(name)])
        target = timing_gpt if name == "gpt" else model

        def run() -> None:
            last[(name, n, B)] = generate(target, num_samples=B, length=n, batch_size=B, **kw, **common)

        return run

    names = ["one-token", *[f"spec-{k}" for k in ks], "gpt"]
    for name in names:  # warm-up, untimed
        timed_cpu(call(name, min(ns), 1), torch.device("cpu"))
    calls = {(name, n, B): call(name, n, B) for n in ns for B in batches for name in names}
    done = [0]

    def tick(key: Any) -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], f"{key[0]} n={key[1]} batch={key[2]}")

    timings = interleaved_timings(calls, torch.device("cpu"), repeats, progress=tick)
    rows = []
    for (name, n, B), wall in timings.wall.items():
        t = last[(name, n, B)].timing
        rows.append({"sampler": name, "n": n, "batch": B, "wall": wall, "cpu": timings.cpu[(name, n, B)],
                     "forwards": int(t["forwards"]), "tokens_per_forward": t.get("tokens_per_forward", 1.0),
                     "acceptance_by_position": t.get("acceptance_by_position", {})})
    for r in rows:
        base = timings.wall[("one-token", r["n"], r["batch"])]
        r["speedup_vs_one_token"] = base / r["wall"]
        g = timings.wall.get(("gpt", r["n"], r["batch"]))
        r["time_vs_gpt"] = r["wall"] / g if g else None
    quality = _quality(model, gpt_model, ks, max(ns), samples, common)
    result = {"benchmark": "speculative", "ns": list(ns), "batches": list(batches), "ks": ks, "repeats": repeats,
              "samples": samples, "temperature": temperature, "top_p": top_p, "seed": seed, "rows": rows,
              "gpt_weights": gpt_weights,
              "quality": quality, "environment": finish_environment(env),
              "size": {k: getattr(model.config, k) for k in ("n_layer", "n_embd", "n_head", "vocab_size")}}
    if out is not None:
        result["files"] = write_outputs(out, "speculative", to_markdown(result), result, plot=plot)
    return result


def _quality(model: Any, gpt: Any, ks: list[int | str], n: int, samples: int, common: dict[str, Any]
             ) -> dict[str, Any]:
    """Mean NLL per token of one-token and speculative samples under one evaluator, and a Welch test."""
    from aogpt.generation.generate import generate

    evaluator = gpt if gpt is not None else model
    kw = {**common, "seed": common["seed"] + 1000}  # fresh draws, not the timed ones
    base = sample_nll(evaluator, generate(model, num_samples=samples, length=n, policy="count", **kw).tokens)
    out = {"evaluator": "gpt (left to right)" if gpt is not None else "the AO-GPT itself (left to right)", "n": n,
           "one-token": _summary(base)}
    for i, k in enumerate(ks, start=1):  # each sampler its own seed: independent samples, as Welch's test assumes
        kw["seed"] = common["seed"] + 1000 + i
        nll = sample_nll(evaluator, generate(model, num_samples=samples, length=n, speculative=k, **kw).tokens)
        out[f"spec-{k}"] = {**_summary(nll), "welch_p": float(scipy.stats.ttest_ind(nll, base, equal_var=False).pvalue)}
    return out


def _summary(values: list[float]) -> dict[str, float]:
    return {"mean_nll": statistics.fmean(values), "se": statistics.stdev(values) / math.sqrt(len(values))}


def to_markdown(result: dict[str, Any]) -> str:
    size = result["size"]
    table = [[r["sampler"], str(r["n"]), str(r["batch"]), f"{fmt_seconds(r['wall'])} / {fmt_seconds(r['cpu'])}",
              str(r["forwards"]), f"{r['tokens_per_forward']:.2f}", fmt_ratio(r["speedup_vs_one_token"]),
              fmt_ratio(r["time_vs_gpt"]),
              ", ".join(f"{j}: {a:.2f}" for j, a in r["acceptance_by_position"].items()) or "-"]
             for r in sorted(result["rows"], key=lambda r: (r["n"], r["batch"], r["sampler"]))]
    q = result["quality"]
    quality = [[name, f"{v['mean_nll']:.4f} ± {v['se']:.4f}", f"{v['welch_p']:.2f}" if "welch_p" in v else "-"]
               for name, v in q.items() if isinstance(v, dict)]
    return "\n".join([
        "# Exact self-speculative decoding",
        "",
        f"AO-GPT ({size['n_layer']} layers, width {size['n_embd']}, vocabulary {size['vocab_size']}), sampling at "
        f"temperature {result['temperature']:g}, top-p {result['top_p']:g}, float64; median of {result['repeats']} "
        "interleaved runs (wall / CPU). Speed-up: one-token time ÷ this sampler's; tokens per forward pass per "
        "sequence; acceptance rate by draft position (position 0 is always accepted). gpt: our left-to-right GPT "
        f"with its KV cache ({result.get('gpt_weights', 'trained')}).",
        describe_environment(result["environment"]),
        "",
        markdown_table(["sampler", "n", "batch", "time", "forwards", "tokens / forward", "speed-up vs one token",
                        "time ÷ gpt", "acceptance by position"], table),
        "",
        f"Quality check: mean NLL per token of {result['samples']} samples of n = {q['n']} under {q['evaluator']} "
        "(± standard error); Welch p-value against one-token samples (same law: expect p spread over (0, 1)).",
        "",
        markdown_table(["sampler", "mean NLL", "Welch p vs one token"], quality),
    ])


def plot(result: dict[str, Any], out_png: Path) -> Path | None:
    """Tokens per forward pass against the draft length K, one line per (n, batch)."""
    fixed = [k for k in result["ks"] if k != "auto"]

    def draw(ax: Any) -> None:
        for n in result["ns"]:
            for B in result["batches"]:
                pts = [(k, r["tokens_per_forward"]) for k in fixed for r in result["rows"]
                       if r["sampler"] == f"spec-{k}" and r["n"] == n and r["batch"] == B]
                if pts:
                    ax.plot(*zip(*sorted(pts), strict=True), "o-", label=f"n = {n}, batch {B}")
        ax.plot(fixed, fixed, ":", color="0.6", label="every draft accepted")
        ax.set_xlabel("draft length K")
        ax.set_ylabel("tokens per forward pass")
        ax.set_title("Exact self-speculative decoding", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)

    return save_png(draw, out_png, figsize=(6.0, 4.0))
