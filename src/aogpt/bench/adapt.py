"""`aogpt bench adapt`: does a trained left-to-right GPT, adapted and fine-tuned, beat AO-GPT trained from
scratch at equal compute, and does it keep its left-to-right quality?

Per seed, on Shakespeare (bpe:512) at the quickstart model size, with step budgets (so the load of a
shared machine changes the wall time, not the comparison; the CPU time of every path is recorded):

1. **source**: our GPT trained S steps with the quickstart recipe (its rate decayed at the end);
2. **candidates**: the source adapted to AO-GPT (`aogpt.adaptation.adapt`: equal to it left to right
   at step 0) and fine-tuned F steps with a fine-tuning recipe (`CANDIDATES`: the `adapt` preset,
   `aogpt.config.ADAPT_RECIPE`, with some fields changed; ``plain`` is the recipe before it existed);
3. **scratch**: AO-GPT from scratch for S + F steps (quickstart recipe, the any-order start fitted to
   its steps), the same total compute;
4. **l2r**: the source trained F more steps left to right (at the recipe's backbone rate), so "it was
   just more training" is ruled out.

Every path is scored at its end (and every `curve_every` steps) on the held-out plays in bits per
byte, EMA weights, left to right and in one random order. Each finished path is kept as JSON in the
work folder (``seed<K>/<path>-F<F>.json``) and reused, so separate processes can share the study
(``only``) and an interrupted study continues; the report (`aogpt.bench.adapt_report`) reads them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aogpt.bench.common import cpu_seconds, environment, write_outputs
from aogpt.bench.recipe import data_for, eval_windows
from aogpt.config import ADAPT_RECIPE, any_order_start, model_config, train_config
from aogpt.errors import AOGPTError

TOKENIZER = "bpe:512"
PRESET = "quickstart"
ORDER = "mixture"  # AO-GPT's own mixture (10% left to right): scratch's order and the candidates' final one
EVAL_BATCH = 16
PATHS = ("source", "l2r", "scratch", "candidates")
RATES = ("lr", "min_lr", "warmup_steps", "target_lr_mult", "lr_schedule", "decay_share", "ema_decay")
SILENT = dict(max_minutes=0.0, eval_interval=10**9, ckpt_interval=10**9, log_interval=10**6, compile="off")


def _plain(steps: int) -> dict[str, Any]:
    """The fine-tuning recipe before this one: the quickstart rates for every weight (target pathway x10),
    no replay, no distillation, the any-order start fitted to the run."""
    quick = train_config(PRESET, "aogpt")
    return {**{k: getattr(quick, k) for k in RATES}, "order": ORDER, "backbone_lr_mult": 1.0, "replay_l2r": 0.0,
            "distill_l2r": 0.0, **any_order_start(ORDER, steps)}


FAST = {"curriculum": "l2r@10,mallows:4..0.05@60"}  # a short ramp: near uniform orders after 60 steps


def _ramp(steps: int) -> dict[str, Any]:
    return {"curriculum": f"l2r@10,mallows:4..0.05@{max(11, steps)}"}


# The recipe the candidates change (the `adapt` preset as it was when the screening began; kept here so a later
# preset does not change what a kept result means). `MEASURED` is the candidate the preset now is (the test
# tests/bench/test_adapt.py holds them equal).
BASE: dict[str, Any] = dict(
    batch_size=16, max_steps=100_000, max_minutes=10.0, lr=3e-3, min_lr=3e-4, warmup_steps=10,
    backbone_lr_mult=0.1, target_lr_mult=1.0, replay_l2r=0.25, distill_l2r=1.0, order="mixture",
    curriculum="l2r@10,mallows:4..0.05@200", lr_schedule="wsd", decay_share=0.2, eval_interval=250,
    eval_batches=8, log_interval=10, ckpt_interval=1000, ema_decay=0.99)

MEASURED = "recipe-fast"  # the candidate the `adapt` preset is (aogpt.config.ADAPT_RECIPE)

# Fine-tuning recipes: changes to `BASE` (a function of the run's steps F).
CANDIDATES: dict[str, Callable[[int], dict[str, Any]]] = {
    "plain": _plain,
    "recipe": lambda f: {},
    "roles": lambda f: {"replay_l2r": 0.0, "distill_l2r": 0.0},
    "roles+replay": lambda f: {"distill_l2r": 0.0},
    "recipe-replay0.5": lambda f: {"replay_l2r": 0.5},
    "recipe-distill0": lambda f: {"distill_l2r": 0.0, "replay_l2r": 0.5},
    "recipe-kl3": lambda f: {"distill_l2r": 3.0},
    "recipe-backbone0.3": lambda f: {"backbone_lr_mult": 0.3},
    "recipe-backbone1": lambda f: {"backbone_lr_mult": 1.0},
    "recipe-target3": lambda f: {"target_lr_mult": 3.0},
    "recipe-backbone0.03": lambda f: {"backbone_lr_mult": 0.03},
    "recipe-slow-ramp": _ramp,
    "recipe-no-ramp": lambda f: {"curriculum": "l2r@10"},
    "pathway-only": lambda f: {"freeze_backbone_steps": f},
    "recipe-target10": lambda f: {"target_lr_mult": 10.0},
    "recipe-fast": lambda f: {"target_lr_mult": 10.0, **FAST},
    "recipe-fast-backbone0.3": lambda f: {"target_lr_mult": 10.0, "backbone_lr_mult": 0.3, **FAST},
    "recipe-fast-backbone1": lambda f: {"target_lr_mult": 10.0, "backbone_lr_mult": 1.0, **FAST},
}


def _data(data_root: Path) -> Any:
    return data_for(TOKENIZER, data_root)


def _score(model: torch.nn.Module, windows: torch.Tensor, lengths: Any, seed: int, any_order: bool) -> dict[str, float]:
    from aogpt.evaluation.evaluate import evaluate

    out = {"l2r": evaluate(model, windows, order="l2r", batch_size=EVAL_BATCH, byte_lengths=lengths).bpb}
    if any_order:
        out["any"] = evaluate(model, windows, order="random", num_orders=1, batch_size=EVAL_BATCH, seed=seed,
                              byte_lengths=lengths).bpb
    return out


def _train(model_cfg: Any, train_cfg: Any, data: Any, windows: torch.Tensor, seed: int, curve_every: int, label: str,
           progress: Callable[[str], None] | None, start: dict[str, float] | None = None) -> tuple[Any, dict]:
    """Train `train_cfg.max_steps` steps; (trainer, record: steps, CPU seconds, curve, final scores)."""
    from aogpt.train import Trainer

    trainer = Trainer(model_cfg, train_cfg, data, None, show_progress=False)
    lengths = data.token_byte_lengths()
    steps, cpu = train_cfg.max_steps, 0.0
    curve = [{"step": 0, "cpu": 0.0, **start}] if start else []
    for step in range(steps):
        begin = cpu_seconds()
        loss = trainer.train_step().loss
        cpu += cpu_seconds() - begin
        if (curve_every and (step + 1) % curve_every == 0) or step + 1 == steps:
            point = _score(trainer.ema.model, windows, lengths, seed, trainer.family.any_order)
            curve.append({"step": step + 1, "cpu": cpu, "loss": loss, **point})
            if progress is not None:
                progress(f"{label} (seed {seed}): step {step + 1}/{steps}, loss {loss:.3f}, "
                         + ", ".join(f"{k} {v:.3f}" for k, v in point.items()) + " bits/byte")
    return trainer, {"steps": steps, "cpu_seconds": cpu, "curve": curve, **curve[-1],
                     "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def _cached(path: Path, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    if path.is_file():
        return json.loads(path.read_text())
    record = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)
    return record


class Study:
    """One seed's paths, kept in `work`/seed<K> (module docstring)."""

    def __init__(self, data_root: Path, work: Path, seed: int, steps: int, *, eval_bytes: int | None,
                 curve_every: int, progress: Callable[[str], None] | None = None):
        self.data = _data(data_root)
        self.dir = Path(work) / f"seed{seed}"
        self.seed, self.steps, self.curve_every, self.progress = seed, steps, curve_every, progress
        self.gpt_cfg = model_config("gpt", preset=PRESET, vocab_size=self.data.padded_vocab_size)
        self.windows = eval_windows(self.data, self.gpt_cfg.block_size, eval_bytes)

    def _fields(self, steps: int, **more: Any) -> dict[str, Any]:
        return {"max_steps": steps, "seed": self.seed, **SILENT, **more}

    def source(self) -> dict[str, Any]:
        """The GPT (S steps), saved with its EMA weights as the model: what is adapted and trained on."""
        def make() -> dict[str, Any]:
            from aogpt.checkpoint import save

            cfg = train_config(PRESET, "gpt", **self._fields(self.steps))
            trainer, record = _train(self.gpt_cfg, cfg, self.data, self.windows, self.seed, self.curve_every,
                                     "source", self.progress)
            save(trainer.ema.model, self.dir / "source", tokenizer=self.data.tokenizer,
                 step=self.steps)
            return record
        return _cached(self.dir / f"source-S{self.steps}.json", make)

    def adapted(self) -> tuple[Any, dict[str, float]]:
        """The adapted checkpoint (made once) and its scores at step 0."""
        from aogpt.adaptation import adapt

        self.source()
        path = self.dir / "adapted"
        if not (path / "config.json").is_file():
            adapt(self.dir / "source", "aogpt", path, seed=self.seed, overwrite=True)
        from aogpt.checkpoint import load

        loaded = load(path, weights="raw")
        start = _cached(self.dir / f"adapted-S{self.steps}.json",
                        lambda: _score(loaded.model, self.windows, self.data.token_byte_lengths(), self.seed, True))
        return loaded, start

    def candidate(self, name: str, f: int) -> dict[str, Any]:
        if name not in CANDIDATES:
            raise AOGPTError(f"unknown candidate {name!r}", f"choose from: {', '.join(CANDIDATES)}")

        def make() -> dict[str, Any]:
            loaded, start = self.adapted()
            fields = {**BASE, **CANDIDATES[name](f), "init_from": str(self.dir / "adapted"), **self._fields(f)}
            cfg = train_config("adapt", "aogpt", **fields)
            _, record = _train(loaded.config, cfg, self.data, self.windows, self.seed, self.curve_every, name,
                               self.progress, start)
            return {**record, "fields": {k: v for k, v in cfg.__dict__.items() if k in ADAPT_RECIPE or k in fields}}
        return _cached(self.dir / f"{name}-S{self.steps}-F{f}.json", make)

    def scratch(self, f: int) -> dict[str, Any]:
        def make() -> dict[str, Any]:
            n = self.steps + f
            cfg = train_config(PRESET, "aogpt", **self._fields(n, order=ORDER, **any_order_start(ORDER, n)))
            mc = model_config("aogpt", preset=PRESET, vocab_size=self.data.padded_vocab_size)
            return _train(mc, cfg, self.data, self.windows, self.seed, self.curve_every, "scratch", self.progress)[1]
        return _cached(self.dir / f"scratch-S{self.steps}-F{f}.json", make)

    def l2r(self, f: int) -> dict[str, Any]:
        """The source trained F more steps left to right, at the recipe's backbone rate (no re-warm-up)."""
        def make() -> dict[str, Any]:
            self.source()
            rate = ADAPT_RECIPE["backbone_lr_mult"]
            cfg = train_config(PRESET, "gpt", **self._fields(f, init_from=str(self.dir / "source"),
                                                             lr=ADAPT_RECIPE["lr"] * rate,
                                                             min_lr=ADAPT_RECIPE["min_lr"] * rate,
                                                             warmup_steps=ADAPT_RECIPE["warmup_steps"]))
            start = {"l2r": self.source()["l2r"]}
            return _train(self.gpt_cfg, cfg, self.data, self.windows, self.seed, self.curve_every, "l2r",
                          self.progress, start)[1]
        return _cached(self.dir / f"l2r-S{self.steps}-F{f}.json", make)


def run(data_root: Path, work: Path, *, steps: int = 400, finetune: tuple[int, ...] = (200, 400),
        candidates: tuple[str, ...] = ("plain", "recipe"), seeds: int = 3, seed: int = 0, only: tuple[str, ...] = PATHS,
        eval_bytes: int | None = 50_000, curve_every: int = 100, out: Path | None = None,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every seed's paths (those in `only` trained, the others read where kept); the report is rewritten
    after each seed, so an interrupted study keeps it."""
    from aogpt.bench.adapt_report import plot, summary, to_markdown

    unknown = sorted(set(candidates) - set(CANDIDATES)) + sorted(set(only) - set(PATHS))
    if unknown:
        raise AOGPTError(f"unknown candidate or path {unknown[0]!r}",
                         f"candidates: {', '.join(CANDIDATES)}; paths: {', '.join(PATHS)}")
    result: dict[str, Any] = {"benchmark": "adapt", "steps": steps, "finetune": list(finetune), "seeds": seeds,
                              "candidates": list(candidates), "eval_bytes": eval_bytes, "tokenizer": TOKENIZER,
                              "threads": torch.get_num_threads(), "preset": PRESET, "rows": []}
    started = time.perf_counter()
    for s in range(seed, seed + seeds):
        study = Study(data_root, work, s, steps, eval_bytes=eval_bytes, curve_every=curve_every, progress=progress)
        row: dict[str, Any] = {"seed": s}
        keys = ["source", *(f"{p}/F{f}" for f in finetune for p in ("l2r", "scratch", *candidates))]
        for key in keys:
            path, _, f = key.partition("/")
            wanted = path if path in ("source", "l2r", "scratch") else "candidates"
            if wanted in only or (study.dir / _file(key, steps)).is_file():
                row[key] = _job(study, path, int(f[1:]) if f else 0)
        start = study.dir / f"adapted-S{steps}.json"
        if start.is_file():
            row["adapted_start"] = json.loads(start.read_text())
        result["rows"].append(row)
        result["environment"] = {**environment(torch.device("cpu")),
                                 "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
        result["wall_seconds"] = time.perf_counter() - started
        result["summary"] = summary(result)
        if out is not None:
            result["files"] = write_outputs(out, "adapt", to_markdown(result), result, plot=plot)
    return result


def _job(study: Study, path: str, f: int) -> dict[str, Any]:
    if path == "source":
        return study.source()
    if path in ("l2r", "scratch"):
        return getattr(study, path)(f)
    return study.candidate(path, f)


def _file(key: str, steps: int) -> str:
    path, _, f = key.partition("/")
    return f"source-S{steps}.json" if path == "source" else f"{path}-S{steps}-{f}.json"


__all__ = ["BASE", "CANDIDATES", "MEASURED", "PATHS", "Study", "run"]
