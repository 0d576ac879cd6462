"""`aogpt bench recipe`: which small recipe learns most on Shakespeare for a fixed amount of compute --
the sweep that chose the quickstart's preset (its table is in docs/training.md).

A candidate is a base preset with some fields changed: the tokenizer (bytes, bpe:512, bpe:4096),
width and depth, context, learning rate and warm-up, batch, EMA decay, order mixture. It trains for
a fixed number of steps, never against a clock (on a shared machine wall time measures the
neighbours), and its cost is the **CPU time** of its training steps with a fixed number of threads
(process time: time spent waiting for a core is not counted). With ``cpu_seconds`` every candidate
gets the same compute: a short probe measures its CPU seconds per step, and it trains as many steps
as the budget buys, its learning-rate schedule fitted to them.

Then it is scored on the held-out plays (the validation split, or its first ``eval_bytes`` bytes),
in bits per byte, so tokenizers compare: left to right with the EMA and the raw weights, and under
one random order with the EMA weights (`aogpt.evaluate` with the tokens' byte lengths).

Several seeds per candidate (`seeds`) give each figure a 95% interval over seeds, and candidates can
run side by side in separate processes (`jobs`, one thread each), since each is timed in CPU time.
With ``curve_every`` K, the EMA weights are also scored every K steps (the validation curves), and
with ``diagnose`` the target pathway is measured there too (`aogpt.bench.training.diagnostics`): how large its
adaLN modulation is, which gradients reach it, and how sharply attention looks at the target's
neighbours. The unigram level of the scored text (the plateau) is in the result, and a candidate
"leaves the plateau" at the first curve point 0.3 bits per byte below it.

How many steps fit in T minutes of a quiet machine with N cores: T x 60 x speedup / (CPU seconds
per step at one thread), where speedup is what N threads gain over one there (`thread_speedup`
measures it; it is only meaningful on a machine doing nothing else).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aogpt.bench.common import cpu_seconds, markdown_table, write_outputs
from aogpt.bench.environment import describe_environment, environment, finish_environment
from aogpt.bench.training.recipe_report import PLATEAU_MARGIN
from aogpt.config import ModelConfig, TrainConfig, model_config, train_config
from aogpt.errors import AOGPTError

BASE_PRESET = "cpu-small"
DEFAULT_TOKENIZER = "bpe:4096"
PROBE_STEPS = (2, 4)  # untimed, timed steps of the probe that sizes a CPU-seconds budget
EVAL_BATCH = 16
QUICK_CANDIDATE = "quick:tokenizer=bytes,n_layer=1,n_embd=32,n_head=2,target_dim=16,block_size=32,batch_size=4"
QUICK_STEPS = 3
QUICK_EVAL_BYTES = 2000

# The candidates of the recorded sweep (docs/training.md), by name: fields changed from BASE_PRESET
# (model and train fields, and `tokenizer`). `aogpt bench recipe --candidates` also takes ad-hoc
# ones written NAME:key=value,key=value.
CANDIDATES: dict[str, dict[str, Any]] = {
    "old-cpu-small": dict(
        n_layer=4, n_head=3, n_embd=192, block_size=128, batch_size=16, lr=2e-3, min_lr=2e-4, warmup_steps=50,
        ema_decay=0.998,
    ),
    # the same model, a bolder start: a higher peak rate reached sooner, the first steps left to right (out
    # of the unigram plateau), an EMA short enough for a run of a few hundred steps
    "bpe4096-bold": dict(tokenizer="bpe:4096", lr=3e-3, min_lr=3e-4, warmup_steps=20, l2r_first_steps=100,
                         ema_decay=0.99),
    "bpe512-bold": dict(tokenizer="bpe:512", lr=3e-3, min_lr=3e-4, warmup_steps=20, l2r_first_steps=100,
                        ema_decay=0.99),
    "bytes-bold": dict(tokenizer="bytes", lr=3e-3, min_lr=3e-4, warmup_steps=20, l2r_first_steps=100,
                       ema_decay=0.99),
}
# The any-order sweep (docs/training.md, "Leaving the unigram plateau"): the quickstart recipe as it was
# (bpe512-bold) with one remedy changed at a time, then combined. Same model, steps and schedule.
_BOLD = dict(CANDIDATES["bpe512-bold"])
_RAMP = dict(l2r_first_steps=0, curriculum="l2r@100,mallows:4..0.05@300")
_SLOW_RAMP = dict(l2r_first_steps=0, curriculum="l2r@100,mallows:4..0.05@600")
_PATHWAY = dict(init_open_gates=True, target_lr_mult=10.0)
CANDIDATES.update({
    "uniform-start": {**_BOLD, "l2r_first_steps": 0, "order": "uniform"},
    "l2r-start-uniform": {**_BOLD, "order": "uniform"},
    "l2r-share-0.25": {**_BOLD, "order": "mixture:0.25"},
    "open-gates": {**_BOLD, "init_open_gates": True},
    "target-lr-10": {**_BOLD, "target_lr_mult": 10.0},
    "table-std-1": {**_BOLD, "init_target_std": 1.0},
    "modulation-0.02": {**_BOLD, "init_modulation_std": 0.02},
    "batch-32x64": {**_BOLD, "batch_size": 32, "block_size": 64},
    "ramp": {**_BOLD, **_RAMP},
    "ramp-uniform": {**_BOLD, **_RAMP, "order": "uniform"},
    "slow-ramp": {**_BOLD, **_SLOW_RAMP},
    "open-gates+lr10": {**_BOLD, **_PATHWAY},
    "ramp+open-gates": {**_BOLD, **_RAMP, "init_open_gates": True},
    "ramp+lr10": {**_BOLD, **_RAMP, "target_lr_mult": 10.0},
    "ramp+open-gates+lr10": {**_BOLD, **_RAMP, **_PATHWAY},
    "slow-ramp+open-gates+lr10": {**_BOLD, **_SLOW_RAMP, **_PATHWAY},
})


@dataclass
class Candidate:
    """A named recipe: the base preset with `fields` changed (model, train and `tokenizer`)."""

    name: str
    fields: dict[str, Any] = field(default_factory=dict)
    base: str = BASE_PRESET

    @property
    def tokenizer(self) -> str:
        return str(self.fields.get("tokenizer", DEFAULT_TOKENIZER))

    @property
    def variant(self) -> str:
        """AO-GPT unless the candidate says otherwise (a left-to-right `gpt` row is a useful control)."""
        return str(self.fields.get("variant", "aogpt"))

    def configs(self, vocab_size: int, max_steps: int, seed: int) -> tuple[ModelConfig, TrainConfig]:
        model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
        model = {k: v for k, v in self.fields.items() if k in model_fields}
        train = {k: v for k, v in self.fields.items() if k not in model_fields | {"tokenizer", "variant"}}
        train.update(max_steps=max_steps, seed=seed, eval_interval=10**9, ckpt_interval=10**9)
        model.pop("variant", None)
        return (model_config(self.variant, preset=self.base, **model, vocab_size=vocab_size),
                train_config(self.base, self.variant, **train))


def parse_candidate(spec: str) -> Candidate:
    """A registered name, or ``NAME:key=value,...`` (values read as JSON where they parse)."""
    from aogpt.config import parse_cli_value

    name, sep, rest = spec.partition(":")
    if not sep:
        if name not in CANDIDATES:
            raise AOGPTError(f"unknown candidate {name!r}",
                             f"use one of {', '.join(CANDIDATES)} or write NAME:key=value,key=value")
        return Candidate(name, dict(CANDIDATES[name]))
    fields: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise AOGPTError(f"candidate {spec!r}: {item!r} is not key=value", "write e.g. big:n_layer=6,lr=3e-3")
        fields[key.strip()] = parse_cli_value(value.strip())
    base = dict(CANDIDATES.get(name, {}))
    return Candidate(name, {**base, **fields})


def data_for(tokenizer: str, data_root: Path, corpus: str = "shakespeare") -> Any:
    """The prepared corpus for `tokenizer` under `data_root` (prepared on first use: it is offline)."""
    from aogpt.data import PreparedData, prepare
    from aogpt.data.prepared import default_out_dir

    path = Path(data_root) / default_out_dir(corpus, tokenizer).name
    if not (path / "meta.json").is_file():
        prepare(corpus, tokenizer, path, progress=False)
    return PreparedData(path)


def eval_windows(data: Any, block_size: int, eval_bytes: int | None) -> torch.Tensor:
    """The validation split's consecutive windows of `block_size` tokens, all of them, or as many as
    cover the first `eval_bytes` bytes: every candidate is scored on (about) the same text."""
    windows = torch.cat(list(data.iter_eval_batches("val", 64, block_size)))
    if eval_bytes is None:
        return windows
    per_window = data.token_byte_lengths()[windows].sum(1).cumsum(0)
    keep = int((per_window < eval_bytes).sum()) + 1
    return windows[:keep]


def make_trainer(candidate: Candidate, data: Any, max_steps: int, seed: int) -> Any:
    from aogpt.train import Trainer

    mc, tc = candidate.configs(data.padded_vocab_size, max_steps, seed)
    return Trainer(mc, tc, data, None, show_progress=False)


def cpu_seconds_per_step(candidate: Candidate, data: Any, seed: int) -> float:
    """A short probe: CPU seconds of one training step (after warm-up steps)."""
    warmup, timed = PROBE_STEPS
    trainer = make_trainer(candidate, data, 10**6, seed)
    for _ in range(warmup):
        trainer.train_step()
    start = cpu_seconds()
    for _ in range(timed):
        trainer.train_step()
    return (cpu_seconds() - start) / timed


def curve_point(trainer: Any, windows: torch.Tensor, lengths: torch.Tensor, seed: int,
                probe: tuple[torch.Tensor, torch.Tensor] | None) -> dict[str, Any]:
    """The EMA weights' bits per byte on `windows` now (left to right, and under one random order for
    any-order models), and with a `probe` batch (tokens, orders) the target pathway's diagnostics."""
    from aogpt.bench.training import diagnostics
    from aogpt.evaluation.evaluate import evaluate

    point: dict[str, Any] = {"step": trainer.step}
    for label, order in (("l2r", "l2r"), ("any", "random")):
        if order == "random" and not trainer.family.any_order:
            continue
        point[label] = evaluate(trainer.ema.model, windows, order=order, num_orders=1, batch_size=EVAL_BATCH,
                                seed=seed, byte_lengths=lengths).bpb
    if probe is not None and trainer.family.any_order:
        model = trainer.raw
        model.eval()
        try:
            point.update(diagnostics.modulation(model))
            point.update(diagnostics.gradients(model, *probe))
            lifts = diagnostics.neighbour_attention(model, *probe)
            point.update({f"lift/L{i}": v for i, v in enumerate(lifts)}, **{"lift/max": max(lifts)})
        finally:
            model.train()
    return point


def run_candidate(candidate: Candidate, data_root: Path, *, steps: int | None = None,
                  cpu_budget: float | None = None, eval_bytes: int | None = None, seed: int = 1337,
                  curve_every: int = 0, diagnose: bool = False,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train `candidate` for `steps` steps (or as many as `cpu_budget` CPU seconds buy) and score it;
    with `curve_every`, also every that many steps (and its diagnostics with `diagnose`)."""
    from aogpt.bench.training.diagnostics import unigram_bpb
    from aogpt.evaluation.evaluate import evaluate

    if (steps is None) == (cpu_budget is None):
        raise AOGPTError("give the candidates a number of steps or a CPU-seconds budget, not both",
                         "pass --steps N or --cpu-seconds S")
    data = data_for(candidate.tokenizer, data_root)
    if steps is None:
        assert cpu_budget is not None
        steps = max(1, int(cpu_budget / cpu_seconds_per_step(candidate, data, seed)))
    trainer = make_trainer(candidate, data, steps, seed)
    windows = eval_windows(data, trainer.block_size, eval_bytes)
    lengths = data.token_byte_lengths()
    probe = None
    if diagnose:  # a fixed batch of held-out windows read in fixed uniform orders
        idx = windows[:EVAL_BATCH]
        probe = (idx, torch.rand(idx.shape, generator=torch.Generator().manual_seed(seed)).argsort(1))
    curve, cpu, wall, losses = [], 0.0, 0.0, []
    for step in range(steps):
        start_cpu, start_wall = cpu_seconds(), time.perf_counter()
        losses.append(trainer.train_step().loss)
        cpu, wall = cpu + cpu_seconds() - start_cpu, wall + time.perf_counter() - start_wall
        if curve_every and (step + 1) % curve_every == 0 and step + 1 < steps:
            curve.append(curve_point(trainer, windows, lengths, seed, probe))
        if progress is not None and (step + 1) % 50 == 0:
            progress(f"{candidate.name} (seed {seed}): step {step + 1}/{steps}, loss {sum(losses[-50:]) / 50:.3f}")
    if curve_every:
        curve.append(curve_point(trainer, windows, lengths, seed, probe))
    scores: dict[str, dict[str, float | None]] = {"any_ema": {"nll": None, "bpb": None}}
    for label, model, order in (("l2r_ema", trainer.ema.model, "l2r"), ("l2r_raw", trainer.raw, "l2r"),
                                ("any_ema", trainer.ema.model, "random")):
        if order == "random" and not trainer.family.any_order:
            continue
        res = evaluate(model, windows, order=order, num_orders=1, batch_size=EVAL_BATCH, seed=seed,
                       byte_lengths=lengths)
        scores[label] = {"nll": res.nll, "bpb": res.bpb}
    mc, tc = trainer.model_cfg, trainer.cfg
    tail = losses[-max(1, min(50, steps // 10)):]
    return {
        "name": candidate.name, "seed": seed, "variant": mc.variant, "fields": candidate.fields,
        "tokenizer": candidate.tokenizer, "layers": mc.n_layer, "width": mc.n_embd, "heads": mc.n_head,
        "block": mc.block_size, "batch": tc.batch_size, "lr": tc.lr, "warmup": tc.warmup_steps,
        "ema_decay": tc.ema_decay, "order": tc.order, "params": trainer.raw.num_params(), "steps": steps,
        "tokens": steps * trainer.tokens_per_step, "cpu_seconds": cpu, "wall_seconds": wall,
        "cpu_seconds_per_step": cpu / steps, "train_loss_end": sum(tail) / len(tail),
        "eval_tokens": int(windows.numel()), "eval_bytes": int(lengths[windows].sum()),
        "unigram_bpb": unigram_bpb(data, windows), "curve": curve, **scores,
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,  # CPU time is what compares
    }


def _run_task(task: tuple[Candidate, Path, dict[str, Any], int]) -> dict[str, Any]:
    """One candidate and seed in a worker process of its own (`sweep` with jobs > 1)."""
    candidate, data_root, options, threads = task
    torch.set_num_threads(threads)
    return run_candidate(candidate, data_root, **options)


def thread_speedup(candidate: Candidate, data_root: Path, threads: int = 2, steps: int = 6,
                   seed: int = 1337) -> dict[str, Any]:
    """Wall seconds per step with one thread and with `threads`, interleaved step by step, and their
    ratio (the best of each, which is least disturbed by other work). Meaningful on a quiet machine
    only: the load average is reported with it."""
    data = data_for(candidate.tokenizer, data_root)
    trainer = make_trainer(candidate, data, 10**6, seed)
    before = torch.get_num_threads()  # restored afterwards
    times: dict[int, list[float]] = {1: [], threads: []}
    try:
        for i in range(2 * steps + 2):
            n = 1 if i % 2 == 0 else threads
            torch.set_num_threads(n)
            start = time.perf_counter()
            trainer.train_step()
            if i >= 2:
                times[n].append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
    best = {n: min(v) for n, v in times.items()}
    return {"name": candidate.name, "threads": threads, "seconds_per_step": best, "speedup": best[1] / best[threads],
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def sweep(candidates: list[Candidate], data_root: Path, *, steps: int | None = None, cpu_budget: float | None = None,
          eval_bytes: int | None = None, minutes: float = 10.0, speedup: float | None = None, seed: int = 1337,
          seeds: int = 1, jobs: int = 1, curve_every: int = 0, diagnose: bool = False, out: Path | None = None,
          progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every candidate with `seeds` seeds (seed, seed + 1, ...), `jobs` at a time in processes of
    their own (one after another with jobs=1); the table and plots are rewritten after each run, so an
    interrupted sweep keeps what it measured."""
    from aogpt.bench.training.recipe_report import plot_curves

    if not candidates:
        raise AOGPTError("no candidates given", "pass --candidates NAME,NAME or NAME:key=value")
    for candidate in candidates:  # a malformed field fails now, not after the first hour
        candidate.configs(512, 1, seed)
    result: dict[str, Any] = {"benchmark": "recipe", "steps": steps, "cpu_budget": cpu_budget,
                              "eval_bytes": eval_bytes, "minutes": minutes, "speedup": speedup, "seed": seed,
                              "seeds": seeds, "curve_every": curve_every, "threads": torch.get_num_threads(),
                              "jobs": jobs, "rows": [],
                              "environment": environment("cpu", "auto")}  # the training default
    options = dict(steps=steps, cpu_budget=cpu_budget, eval_bytes=eval_bytes, curve_every=curve_every,
                   diagnose=diagnose)
    tasks = [(c, s) for s in range(seed, seed + seeds) for c in candidates]  # every candidate once, then again

    def record(row: dict[str, Any]) -> None:
        if speedup:
            row["steps_in_budget"] = int(minutes * 60 * speedup / row["cpu_seconds_per_step"])
        result["rows"].append(row)
        result["rows"].sort(key=lambda r: ([c.name for c in candidates].index(r["name"]), r["seed"]))
        result["environment"] = finish_environment(result["environment"])
        if out is not None:
            result["files"] = write_outputs(out, "recipe", to_markdown(result), result,
                                            plot=plot_curves if curve_every else None)
        if progress is not None:
            progress(f"{row['name']} (seed {row['seed']}): {row['l2r_ema']['bpb']:.3f} bits/byte left to right, "
                     f"{_num(row['any_ema']['bpb'])} in a random order (EMA)")

    if jobs <= 1:
        for candidate, s in tasks:
            record(run_candidate(candidate, data_root, seed=s, progress=progress, **options))
        return result
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    context = multiprocessing.get_context("spawn")  # a fresh interpreter per worker: no forked torch state
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(_run_task, (c, data_root, {**options, "seed": s}, torch.get_num_threads()))
                   for c, s in tasks]
        for future in as_completed(futures):
            record(future.result())
    return result


def _num(x: float | None, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def to_markdown(result: dict[str, Any]) -> str:
    from aogpt.bench.training.recipe_report import candidate_rows

    budget = (f"{result['steps']} steps each" if result["steps"] else
              f"{result['cpu_budget']:g} CPU seconds each (steps sized by a probe, schedule fitted to them)")
    threads = f"{result['threads']} thread" + ("s" if result["threads"] > 1 else "")
    scored = f"the first {result['eval_bytes']:,} bytes of" if result["eval_bytes"] else "all of"
    seeds = result.get("seeds", 1)
    runs = f"{seeds} seeds each (mean [95% interval over seeds])" if seeds > 1 else "one seed each"
    lines = [
        "# Recipe sweep",
        "",
        f"Each candidate: AO-GPT (unless named otherwise) trained for {budget}, {threads}, {runs}; scored on "
        f"{scored} the held-out plays in bits per byte (lower is better): left to right with the EMA and the raw "
        "weights, and under one random order with the EMA weights; load: the machine's 1-minute load average "
        "when the candidate finished. " + describe_environment(result["environment"]),
        "",
    ]
    unigram = next((r["unigram_bpb"] for r in result["rows"] if "unigram_bpb" in r), None)
    if unigram is not None:
        lines += [f"The unigram level of the scored text (the plateau): {unigram:.3f} bits per byte. 'Left the "
                  f"plateau': the first validation point at least {PLATEAU_MARGIN:g} below it, in how many seeds, "
                  "and the median step.", ""]
    if result.get("speedup"):
        lines += [f"Steps in budget: steps that fit in {result['minutes']:g} minutes on a quiet machine whose "
                  f"threads run {result['speedup']:g}x faster than one (CPU s / step at one thread).", ""]
    headers, rows = candidate_rows(result)
    lines.append(markdown_table(headers, rows))
    return "\n".join(lines)
