"""`--preset auto`: the quickstart's recipe with the model sized to the compute the time budget holds here.

A 10-minute budget holds several times less compute on an AVX2-only CPU (fp32, no bf16 units) than
on a CPU with bf16 units or AMX, and one model size cannot be right for both: the compute-optimal
parameter count grows about as the square root of the compute (Hoffmann et al. 2022). So before the
first step, `choose_size` measures the machine as the run will use it (device, precision, threads):
each candidate width's training step is timed (a few eager steps on random tokens, seconds in all)
beside the matrix-product rate at the model's shapes; from the step times it predicts the steps each
candidate gets in the budget, and keeps the widest candidate that still sees at least
`MIN_TOKENS_PER_PARAMETER` training tokens per parameter. That threshold is the rule the study in
docs/cpu.md established (three widths on two compute levels, two seeds each, 10-minute budgets,
judged on held-out bits per byte in a random order and left to right).

The order curriculum is scaled to the predicted steps (left to right for 2.5% of them, the Mallows
ramp until 15%, as the quickstart preset's 100 / 600 steps of about 4,000); the step times predicted
are those of the compiled step where `aogpt.compiling` compiles this run (where it pays in the budget).
`--preset quickstart` keeps the fixed width-192 model for those who want one size everywhere.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from aogpt import capability, compiling
from aogpt.config import ModelConfig, TrainConfig, model_config
from aogpt.memory import parameter_count
from aogpt.precision import name_of
from aogpt.train.step import autocast_dtype

AUTO_PRESET = "auto"
BASE_PRESET = "quickstart"  # the recipe `auto` sizes: its model fields are the defaults, its train fields kept
CANDIDATES: tuple[tuple[int, int], ...] = ((64, 2), (96, 2), (128, 2), (192, 3), (256, 4))  # (width, heads)
MIN_TOKENS_PER_PARAMETER = 6.0  # the study's rule (docs/cpu.md)
PROBE_STEPS = 3  # timed eager steps per candidate (after 2 untimed)
L2R_SHARE, RAMP_SHARE = 0.025, 0.15  # the curriculum's stages as shares of the run
OVERHEAD_SHARE = 0.05  # validation and checkpoints in a time-budgeted run


@dataclass(frozen=True)
class SizeChoice:
    """What `choose_size` decided and why: the fields it sets, and a line for the plan."""

    n_embd: int
    n_head: int
    curriculum: str
    why: str
    measured: dict[str, Any] = field(default_factory=dict)

    def model_fields(self) -> dict[str, Any]:
        return {"n_embd": self.n_embd, "n_head": self.n_head}


def curriculum_for(steps: int) -> str:
    """The quickstart's order curriculum at a run of `steps` steps: left to right, then the Mallows ramp
    from nearly left to right (dispersion 4) to nearly uniform (0.05), then the preset's mixture."""
    l2r = max(1, round(L2R_SHARE * steps))
    return f"l2r@{l2r},mallows:4..0.05@{max(l2r + 1, round(RAMP_SHARE * steps))}"


def time_steps(mcfg: ModelConfig, tcfg: TrainConfig, steps: int = PROBE_STEPS) -> float:
    """Median seconds of an eager training step of this model and recipe on random tokens."""
    from aogpt.train.sources import RandomTokens
    from aogpt.train.trainer import Trainer

    probe = dataclasses.replace(tcfg, compile="off", max_steps=10**6, max_minutes=0.0, eval_interval=10**6,
                                ckpt_interval=10**6, curriculum="", extra={}, init_from="")
    trainer = Trainer(mcfg, probe, RandomTokens(mcfg.vocab_size), None, show_progress=False)
    for _ in range(2):
        trainer.train_step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        trainer.train_step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def choose_size(variant: str, model_over: dict[str, Any], tcfg: TrainConfig, *, vocab_size: int,
                device: torch.device, timer: Callable[[ModelConfig, TrainConfig], float] = time_steps) -> SizeChoice:
    """Time every candidate here and keep the widest with enough tokens per parameter (module docstring);
    `timer` is replaceable for tests."""
    precision = name_of(autocast_dtype(tcfg, device))
    compiled, _ = compiling.decide_training(tcfg.compile, device, max_minutes=tcfg.max_minutes, precision=precision)
    share = compiling.COMPILED_STEP_SHARE.get(precision, 1.0) if compiled else 1.0
    budget = tcfg.max_minutes * 60.0
    usable = budget * (1 - OVERHEAD_SHARE) - (compiling.COLD_COMPILE_SECONDS if compiled else 0.0)
    rows = []
    for width, heads in CANDIDATES:
        mcfg = model_config(variant, BASE_PRESET, **{**model_over, "n_embd": width, "n_head": heads,
                                                     "vocab_size": vocab_size})
        step = timer(mcfg, tcfg) * share
        steps = max(1, int(usable / step))
        params = parameter_count(mcfg)
        rows.append({"width": width, "heads": heads, "step_seconds": step, "steps": steps, "params": params,
                     "tokens_per_parameter": steps * tcfg.batch_size * mcfg.block_size / params})
    fitting = [r for r in rows if r["tokens_per_parameter"] >= MIN_TOKENS_PER_PARAMETER]
    best = fitting[-1] if fitting else rows[0]
    threads = torch.get_num_threads()
    where = f"{capability.cpu_class()} CPU, {precision}, {threads} thread{'s' if threads != 1 else ''}"
    others = "; ".join(f"width {r['width']}: {r['steps']:,} ({r['tokens_per_parameter']:.1f})" for r in rows
                       if r is not best)
    why = (f"size: width {best['width']}, {best['heads']} heads, {best['params'] / 1e6:.1f} M parameters (auto: "
           f"about {best['steps']:,} steps fit {tcfg.max_minutes:g} minutes at {best['step_seconds'] * 1e3:.0f} ms a "
           f"step{' compiled' if compiled else ''} on this {where}: {best['tokens_per_parameter']:.1f} tokens per "
           f"parameter, the widest with at least {MIN_TOKENS_PER_PARAMETER:g} (docs/cpu.md); others: {others})")
    return SizeChoice(best["width"], best["heads"], curriculum_for(best["steps"]), why,
                      {"candidates": rows, "cpu": capability.cpu_class(), "threads": threads, "precision": precision,
                       "compiled": compiled})


__all__ = ["AUTO_PRESET", "BASE_PRESET", "CANDIDATES", "MIN_TOKENS_PER_PARAMETER", "SizeChoice", "choose_size",
           "curriculum_for", "time_steps"]
