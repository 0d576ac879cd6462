"""`aogpt bench gated`: what a gated pathway (`aogpt.pathway`) costs in generation, side by side.

Four contenders of one size (the quickstart model's shape by default, random weights: the cost of a
step does not depend on their values), timed in one process, interleaved round by round (so a change
in the machine's load hits all alike), each through `aogpt.generate` as users call it:

- ``source``: a left-to-right GPT, its KV cache, n steps of one token (the source of the adaptation);
- ``gated-l2r``: that GPT adapted to AO-GPT with a gated pathway of delta rank `rank` (its pathway
  perturbed away from zero), generating left to right the same way: every slot is a source slot;
- ``aogpt``: that GPT adapted to AO-GPT with a shared pathway (an AO-GPT of the same size and
  backbone), generating in a random order;
- ``gated-random``: the gated model in a random order: every slot after the first is a pathway slot.

The random-order contenders run one token per step too (``policy count``, T = n), so every contender
makes n forwards of one query row per sequence and the ratios are per step. Medians of wall and CPU
time over the rounds; the goals (docs/adapt.md): gated-l2r / source <= 1.05, gated-random / aogpt
<= 1.15. On a busy machine the medians of the two contenders drift apart with the load; each round's
ratio of CPU times (the two ran one after the other) does not, so the report also gives their mean
with its 95% interval over the rounds and reads the goal off it (`aogpt.stats.verdict_within`: met
when the whole interval is below the goal, missed when above, else inconclusive).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from aogpt.bench.common import interleaved_timings
from aogpt.bench.environment import describe_environment, environment, finish_environment
from aogpt.stats import NOT_REPRODUCED, REPRODUCED, Measurement, mean_interval, verdict_within

GOALS = {"gated-l2r": ("source", 1.05), "gated-random": ("aogpt", 1.15)}
VERDICTS = {REPRODUCED: "met", NOT_REPRODUCED: "missed"}  # else inconclusive
CONTENDERS = ("source", "gated-l2r", "aogpt", "gated-random")


def models(width: int = 192, layers: int = 4, vocab: int = 512, block: int = 128, rank: int = 0,
           seed: int = 0, dtype: torch.dtype = torch.float32) -> dict[str, torch.nn.Module]:
    """The source GPT (heads of 64, as the quickstart's) and its two adaptations (shared and gated), random
    weights, in `dtype`."""
    heads = max(1, width // 64)
    from aogpt.adaptation.ours import BACKBONE_FIELDS
    from aogpt.adaptation.source import Source
    from aogpt.adaptation.target import build
    from aogpt.config import model_config
    from aogpt.model import Transformer

    torch.manual_seed(seed)
    gpt = Transformer(model_config("gpt", n_layer=layers, n_head=heads, n_embd=width, block_size=block,
                                   vocab_size=vocab))
    cfg = gpt.config
    state = {k: v for k, v in gpt.state_dict().items() if k != "lm_head.weight"}
    src = Source("gpt run", {k: getattr(cfg, k) for k in BACKBONE_FIELDS}, state, None, "")
    shared = build(src, "aogpt", seed=seed)
    gated = build(src, "aogpt", pathway="gated", rank=rank, seed=seed)
    with torch.no_grad():  # a trained pathway is not zero: perturb every one of its weights
        g = torch.Generator().manual_seed(seed)
        for m in (shared, gated):
            for name, p in m.named_parameters():
                if "adaLN" in name or "delta" in name:
                    p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return {k: m.to(dtype).eval() for k, m in (("source", gpt), ("aogpt", shared), ("gated", gated))}


def bench_gated(*, n: int = 128, batch: int = 8, repeats: int = 5, rank: int = 0, width: int = 192, seed: int = 0,
                dtype: str = "fp32", progress: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """Milliseconds per step of every contender (module docstring) and the ratios the goals read."""
    from aogpt.generation.generate import generate

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    ms = models(width=width, block=max(n, 16), rank=rank, seed=seed, dtype=torch_dtype)
    runs = {"source": (ms["source"], "l2r"), "gated-l2r": (ms["gated"], "l2r"), "aogpt": (ms["aogpt"], "random"),
            "gated-random": (ms["gated"], "random")}

    def call(model: torch.nn.Module, order: str) -> Callable[[], Any]:
        return lambda: generate(model, num_samples=batch, length=n, order=order, policy="count", steps=n, seed=seed,
                                batch_size=batch)

    calls = {k: call(*v) for k, v in runs.items()}
    for fn in calls.values():  # warm up: the decode path's kernels are measured and built on first use
        fn()
    env = environment("cpu", dtype)
    started = time.perf_counter()
    t = interleaved_timings(calls, torch.device("cpu"), repeats, progress=progress)
    rows = [{"contender": k, "wall_ms_per_step": 1000 * t.wall[k] / n, "cpu_ms_per_step": 1000 * t.cpu[k] / n,
             "wall_ms_runs": [1000 * w / n for w in t.wall_runs[k]],
             "cpu_ms_runs": [1000 * c / n for c in t.cpu_runs[k]]} for k in CONTENDERS]
    by = {r["contender"]: r for r in rows}
    ratios = {k: {"against": ref, "goal": goal, "wall": by[k]["wall_ms_per_step"] / by[ref]["wall_ms_per_step"],
                  "cpu": by[k]["cpu_ms_per_step"] / by[ref]["cpu_ms_per_step"]} for k, (ref, goal) in GOALS.items()}
    for k, r in ratios.items():
        r["met_cpu"] = r["cpu"] <= r["goal"]
        rounds = [a / b for a, b in zip(t.cpu_runs[k], t.cpu_runs[r["against"]], strict=True)]
        paired = mean_interval(Measurement.of(rounds, "rounds"))
        r["cpu_rounds"], r["cpu_paired"] = rounds, paired.to_dict()
        r["verdict"] = VERDICTS.get(verdict_within(paired, r["goal"]), "inconclusive")
    return {"benchmark": "gated", "n": n, "batch": batch, "repeats": repeats, "rank": rank, "width": width,
            "dtype": dtype, "threads": torch.get_num_threads(), "rows": rows, "ratios": ratios,
            "decode_path": {k: _decode_path(v[0]) for k, v in runs.items()},
            "seconds": time.perf_counter() - started, "environment": finish_environment(env)}


def _decode_path(model: torch.nn.Module) -> str:
    """The decode path `generate` runs the model on: ``fast`` (the model's forward with the measured
    kernels swapped in), ``fast, gated`` (the same with two kernels per delta layer,
    `aogpt.decode.gated`) or ``reference`` (the model itself)."""
    from aogpt.decode.gated import GatedKernel
    from aogpt.inference import for_inference

    runner = for_inference(model)
    if runner is model:
        return "reference"
    return "fast, gated" if any(isinstance(m, GatedKernel) for m in runner.modules()) else "fast"


def to_markdown(result: dict[str, Any]) -> str:
    lines = ["# Generation with a gated pathway: its step against the source's and an AO-GPT's", "",
             f"Batch {result['batch']}, n = {result['n']}, one token per step (T = n), width {result['width']}, "
             f"delta rank {result['rank'] or 'full'}; median of {result['repeats']} interleaved rounds. "
             + describe_environment(result["environment"]), "",
             "| contender | decode path | ms per step (wall) | ms per step (CPU) |", "|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['contender']} | {result['decode_path'][r['contender']]} | {r['wall_ms_per_step']:.3f} | "
                     f"{r['cpu_ms_per_step']:.3f} |")
    lines += ["", "| ratio | goal | wall | CPU | met (CPU) | CPU, each round's ratio: mean [95% interval] | goal |",
              "|---|---|---|---|---|---|---|"]
    for k, r in result["ratios"].items():
        p = r["cpu_paired"]
        interval = f"{p['value']:.3f} [{p['low']:.3f}, {p['high']:.3f}]" if p["low"] is not None else \
            f"{p['value']:.3f} (one round)"
        lines.append(f"| {k} / {r['against']} | <= {r['goal']} | {r['wall']:.3f} | {r['cpu']:.3f} | "
                     f"{'yes' if r['met_cpu'] else 'no'} | {interval} | {r['verdict']} |")
    return "\n".join(lines) + "\n"


__all__ = ["CONTENDERS", "GOALS", "bench_gated", "models", "to_markdown"]
