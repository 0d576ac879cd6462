"""`aogpt bench adapt`: does a trained left-to-right GPT, adapted and fine-tuned F steps, learn any order sooner
than AO-GPT trained from scratch, and does it keep its left-to-right quality?

Per seed, on Shakespeare (bpe:512) at the quickstart model size (or a narrower one, `width`), with step
budgets (so the load of a shared machine changes the wall time, not the comparison; the CPU time of every
path is recorded):

1. **source**: our GPT trained S steps with the quickstart recipe (its rate decayed at the end);
2. **candidates**: the source adapted to AO-GPT (`aogpt.adaptation.adapt`: equal to it left to right
   at step 0) and fine-tuned F steps with a fine-tuning recipe (`CANDIDATES`; the `adapt` preset,
   `aogpt.config.ADAPT_RECIPE`, is `MEASURED`; ``plain`` is the fine-tuning before any recipe);
3. **scratch**: AO-GPT from scratch for F steps (what a user with a pretrained model pays for), the
   any-order start fitted to its steps (`aogpt.config.any_order_start`), and **scratch-sf** for S + F steps
   (the same total compute), the start fitted to the shortest S + F of the study: those runs share every
   step before their decays, so they are trained as one trunk with each budget's decay branched off it
   (`Study.scratch_family`: bit for bit the runs budgeted for S + F);
4. **l2r**: the source trained F more steps left to right (at the recipe's backbone rate), so "it was
   just more training" is ruled out.

The **gated** candidates (`GATED`; `aogpt.pathway`) adapt the source with a gated pathway of a delta rank
(8, 32, full) and train only the pathway (`aogpt.config.GATED_RECIPE`): read left to right they are the
source, exactly. With several fine-tuning lengths F, a candidate (like scratch) is trained as one trunk
budgeted for the longest F with each budget's decay branched off it (`Study.branched`): bit for bit the
run budgeted for F when its fields do not depend on F (the gated ones), else fitted to the shortest F.
Every path's end is also scored on the 32-token infilling of `aogpt eval --infill` (its default cuts:
32 tokens each side, 64 spans), given both sides and given the prefix only (`_infill`).

Every path is a run budgeted for its own steps (a 500-step path is not read off a longer run: the decay
and the stages are fitted to the budget). It is scored at its end (and every `curve_every` steps)
on the held-out plays in bits per byte, EMA weights, left to right and in one random order. A finished
path is kept as JSON in the work folder (``seed<K>/<path>-....json``) and reused, so separate processes can
share the study (``only``); a path under way saves a checkpoint every `save_every` steps, and an
interrupted study resumes it from there (exactly: the data, order and dropout streams are restored). A
path's folder is locked while it trains. The report (`aogpt.bench.training.adapt_report`) reads the JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aogpt.bench.common import cpu_seconds, write_outputs
from aogpt.bench.environment import environment, finish_environment
from aogpt.bench.training.adapt_candidates import (
    BASE,
    CANDIDATES,
    GATED,
    LETGO,
    MEASURED,
    ORDER,
    PRESET,
    STUDY,
    _known,
    fitted_to,
)
from aogpt.bench.training.recipe import data_for, eval_windows
from aogpt.config import ADAPT_RECIPE, GATED_RECIPE, any_order_start, model_config, train_config
from aogpt.errors import AOGPTError

TOKENIZER = "bpe:512"
WIDTH = 192  # the quickstart's width (3 heads of 64)
EVAL_BATCH = 16
PATHS = ("source", "l2r", "scratch", "scratch-sf", "candidates")
INFILL_LENGTH = 32  # the span length of the infilling score (`aogpt eval --infill`'s cuts of it)
SILENT = dict(max_minutes=0.0, eval_interval=10**9, ckpt_interval=10**9, log_interval=10**6, compile="off",
              keep_last=0)  # the bench keeps and removes checkpoints itself (`_save`)


def _infill(model: torch.nn.Module, data: Any) -> dict[str, Any]:
    """The infilling of `aogpt eval --infill` at `INFILL_LENGTH` tokens (its default cuts of the held-out
    text, seed 0: the same spans for every path and seed), exactly (`aogpt.evaluation.infill.span_nll`):
    given both sides, the span left to right (both/l2r) and in 4 random orders (both/random, their mean
    per span), and given the prefix only (prefix/l2r); per row the mean bits per byte over the spans, and
    each span's. (The adaptive order of `aogpt eval --infill`'s both/best costs a forward per span token:
    left out of a study that scores every path.)"""
    import math

    import numpy as np

    from aogpt.evaluation.infill import make_cuts, span_nll
    from aogpt.families import family_of
    from aogpt.seeds import draw_seed

    ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in data.shards("val")])
    cuts = make_cuts(ids, INFILL_LENGTH, seed=0, eot_id=data.tokenizer.eot_id)
    C, L = cuts.context, cuts.length
    nbytes = data.token_byte_lengths()[cuts.spans.long()].sum(1).double()
    rows: dict[str, list[torch.Tensor]] = {"prefix/l2r": [], "both/l2r": [], "both/random": []}
    gens = [torch.Generator().manual_seed(draw_seed(0, "infill-orders", L, k)) for k in range(4)]
    was = model.training
    model.eval()
    for chunk in cuts.windows.split(EVAL_BATCH):
        rows["prefix/l2r"].append(span_nll(model, chunk, C, L, sides="prefix").cpu())
        if family_of(model).any_order:
            rows["both/l2r"].append(span_nll(model, chunk, C, L).cpu())
            draws = [span_nll(model, chunk, C, L, torch.rand(chunk.shape[0], L, generator=g).argsort(1)).cpu()
                     for g in gens]
            rows["both/random"].append(torch.stack(draws).mean(0))
    model.train(was)
    spans = {row: (torch.cat(v) / nbytes / math.log(2)).tolist() for row, v in rows.items() if v}
    return {"length": L, "spans": spans, **{row: sum(v) / len(v) for row, v in spans.items()}}


def _score(model: torch.nn.Module, windows: torch.Tensor, lengths: Any, seed: int, any_order: bool) -> dict[str, float]:
    from aogpt.evaluation.evaluate import evaluate

    out = {"l2r": evaluate(model, windows, order="l2r", batch_size=EVAL_BATCH, byte_lengths=lengths).bpb}
    if any_order:
        out["any"] = evaluate(model, windows, order="random", num_orders=1, batch_size=EVAL_BATCH, seed=seed,
                              byte_lengths=lengths).bpb
    return out


def _train(model_cfg: Any, train_cfg: Any, data: Any, windows: torch.Tensor, seed: int, curve_every: int, label: str,
           progress: Callable[[str], None] | None, run_dir: Path, save_every: int,
           start: dict[str, float] | None = None, *, stop_at: int | None = None, keep: tuple[int, ...] = (),
           branch: tuple[Path, dict[str, Any]] | None = None, infill: bool = True) -> tuple[Any, dict]:
    """Train until step `stop_at` (default `train_cfg.max_steps`) in `run_dir`; (trainer, record: steps, CPU
    seconds, curve, final scores).

    Resumed from `run_dir`'s checkpoint when an earlier process left one (with the curve and CPU time it had
    then), else from `branch` (a checkpoint of another run and its record there) when given. Checkpoints
    every `save_every` steps (the newest kept) and at the steps in `keep` (all kept, each with its record in
    ``point-<step>.json``: where branches start)."""
    from aogpt.checkpoint import list_checkpoints
    from aogpt.train import Trainer

    trainer = Trainer(model_cfg, train_cfg, data, run_dir, show_progress=False)
    lengths = data.token_byte_lengths()
    steps, cpu = train_cfg.max_steps, 0.0
    stop = steps if stop_at is None else stop_at
    curve = [{"step": 0, "cpu": 0.0, **start}] if start else []
    partial = run_dir / "partial.json"
    own = list_checkpoints(run_dir)
    if own and partial.is_file():
        trainer.resume(own[-1])
        state = json.loads(partial.read_text())
        cpu, curve = state["cpu"], [p for p in state["curve"] if p["step"] <= trainer.step]
    elif branch is not None:
        trainer.resume(branch[0])
        cpu, curve = branch[1]["cpu"], list(branch[1]["curve"])
    if trainer.step and progress is not None:
        progress(f"{label} (seed {seed}): from step {trainer.step}/{steps}")
    for step in range(trainer.step, stop):
        begin = cpu_seconds()
        loss = trainer.train_step().loss
        cpu += cpu_seconds() - begin
        done = step + 1
        if (curve_every and done % curve_every == 0) or done == steps:
            point = _score(trainer.ema.model, windows, lengths, seed, trainer.family.any_order)
            curve.append({"step": done, "cpu": cpu, "loss": loss, **point})
            if progress is not None:
                progress(f"{label} (seed {seed}): step {done}/{steps}, loss {loss:.3f}, "
                         + ", ".join(f"{k} {v:.3f}" for k, v in point.items()) + " bits/byte")
        if done in keep or (save_every and done % save_every == 0 and done < steps):
            _save(trainer, run_dir, {"cpu": cpu, "curve": curve}, keep)
    record = {"steps": steps, "cpu_seconds": cpu, "curve": curve, **(curve[-1] if curve else {}),
              "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
              "trainable_parameters": sum(p.numel() for p in trainer.raw.parameters() if p.requires_grad),
              "parameters": trainer.raw.num_params()}
    if infill and trainer.step == steps:
        record["infill"] = _infill(trainer.ema.model, data)
    return trainer, record


def _save(trainer: Any, run_dir: Path, state: dict[str, Any], keep: tuple[int, ...]) -> None:
    """A checkpoint of the run and its record so far (``partial.json``; ``point-<step>.json`` too at a step in
    `keep`); older checkpoints are removed unless their step is in `keep`."""
    from aogpt.checkpoint import list_checkpoints
    from aogpt.io import write_json

    path = trainer.save()
    write_json(run_dir / "partial.json", state)
    if trainer.step in keep:
        write_json(run_dir / f"point-{trainer.step}.json", state)
    for old in list_checkpoints(run_dir):
        if old != path and int(old.name.rpartition("-")[2]) not in keep:
            shutil.rmtree(old, ignore_errors=True)


def _cached(path: Path, make: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """The record kept at `path`, or `make(run_dir)`'s, kept there; the run's folder (``path`` without its
    suffix) is locked while it trains and removed once the record is kept."""
    from aogpt.io import directory_lock

    if path.is_file():
        return json.loads(path.read_text())
    run_dir = path.with_suffix("")
    run_dir.mkdir(parents=True, exist_ok=True)
    with directory_lock(run_dir, "aogpt bench adapt", inside=True, flag="--work"):
        if path.is_file():  # another process finished it while this one waited
            return json.loads(path.read_text())
        record = make(run_dir)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)
    shutil.rmtree(run_dir, ignore_errors=True)
    return record


class Study:
    """One seed's paths, kept in `work`/seed<K> (module docstring)."""

    def __init__(self, data_root: Path, work: Path, seed: int, steps: int, *, eval_bytes: int | None,
                 curve_every: int, width: int = WIDTH, save_every: int = 250,
                 progress: Callable[[str], None] | None = None, tokenizer: str = TOKENIZER):
        self.data = data_for(tokenizer, data_root)
        self.dir = Path(work) / f"seed{seed}"
        self.seed, self.steps, self.curve_every, self.progress = seed, steps, curve_every, progress
        self.save_every = save_every
        self.size = {} if width == WIDTH else {"n_embd": width, "n_head": max(1, width // 64)}
        self.gpt_cfg = model_config("gpt", preset=PRESET, vocab_size=self.data.padded_vocab_size, **self.size)
        self.windows = eval_windows(self.data, self.gpt_cfg.block_size, eval_bytes)

    def _fields(self, steps: int, **more: Any) -> dict[str, Any]:
        return {"max_steps": steps, "seed": self.seed, **SILENT, **more}

    def source(self) -> dict[str, Any]:
        """The GPT (S steps), saved with its EMA weights as the model: what is adapted and trained on."""
        def make(run_dir: Path) -> dict[str, Any]:
            from aogpt.checkpoint import save

            cfg = train_config(PRESET, "gpt", **self._fields(self.steps))
            trainer, record = _train(self.gpt_cfg, cfg, self.data, self.windows, self.seed, self.curve_every,
                                     "source", self.progress, run_dir, self.save_every)
            save(trainer.ema.model, self.dir / "source", tokenizer=self.data.tokenizer, step=self.steps)
            return record
        return _cached(self.dir / f"source-S{self.steps}.json", make)

    def adapted(self, pathway: str = "shared", rank: int = 0) -> tuple[Any, dict[str, float]]:
        """The adapted checkpoint (made once; `pathway` gated: with a gated pathway of delta rank `rank`) and its
        scores at step 0."""
        from aogpt.adaptation import adapt
        from aogpt.checkpoint import load

        self.source()
        name = "adapted" if pathway == "shared" else f"adapted-gated-r{rank or 'full'}"
        path = self.dir / name
        if not (path / "config.json").is_file():
            adapt(self.dir / "source", "aogpt", path, seed=self.seed, overwrite=True, pathway=pathway, rank=rank)
        loaded = load(path, weights="raw")
        score = self.dir / f"{name}-S{self.steps}.json"
        if not score.is_file():
            score.write_text(json.dumps(_score(loaded.model, self.windows, self.data.token_byte_lengths(), self.seed,
                                               True)))
        return loaded, json.loads(score.read_text())

    def _candidate_configs(self, name: str, f: int, fitted: int) -> tuple[Any, Any, dict[str, float], dict]:
        """(model config, train config for `f` steps with the F-dependent fields fitted to `fitted`, the adapted
        model's scores at step 0, the fields the candidate sets)."""
        if name in GATED:
            rank, change = GATED[name]
            loaded, start = self.adapted("gated", rank)
            fields = {**GATED_RECIPE, **change(fitted)}
            preset, adapted = "adapt-gated", self.dir / f"adapted-gated-r{rank or 'full'}"
        else:
            loaded, start = self.adapted()
            fields = {**BASE, **CANDIDATES[name](fitted)}
            preset, adapted = "adapt", self.dir / "adapted"
        fields = {**fields, "init_from": str(adapted), **self._fields(f)}
        return loaded.config, train_config(preset, "aogpt", **fields), start, fields

    def candidate(self, name: str, f: int, budgets: tuple[int, ...] = ()) -> dict[str, Any]:
        """A candidate fine-tuned `f` steps; with `budgets` (several F), branched off their trunk (`branched`)."""
        if not _known(name):
            raise AOGPTError(f"unknown candidate {name!r}", f"choose from: {', '.join([*CANDIDATES, *GATED])}")
        fitted = fitted_to(name, budgets or (f,))  # 0: the same fields at every F

        def configs(n: int) -> tuple[Any, Any]:
            mc, tc, _, _ = self._candidate_configs(name, n, fitted or n)
            return mc, tc

        def finish(record: dict[str, Any], n: int) -> dict[str, Any]:
            _, tc, _, fields = self._candidate_configs(name, n, fitted or n)
            return {**record, "fields": {k: v for k, v in tc.__dict__.items() if k in ADAPT_RECIPE or k in fields}}

        key = self.dir / (f"{name}-S{self.steps}-F{f}.json" if fitted == f or fitted == 0
                          else f"{name}-S{self.steps}-F{f}-C{fitted}.json")
        start = self._candidate_configs(name, f, fitted or f)[2]
        if len(budgets) > 1:
            record = self.branched(key, f"{name}-trunk-S{self.steps}-C{fitted}", name, configs, budgets, f, start)
            return finish(record, f)

        def make(run_dir: Path) -> dict[str, Any]:
            mc, tc = configs(f)
            _, record = _train(mc, tc, self.data, self.windows, self.seed, self.curve_every, name, self.progress,
                               run_dir, self.save_every, start)
            return finish(record, f)
        return _cached(key, make)

    def _scratch_configs(self, n: int, fitted: int) -> tuple[Any, Any]:
        """AO-GPT from scratch for `n` steps, its any-order start fitted to `fitted` steps."""
        cfg = train_config(PRESET, "aogpt", **self._fields(n, order=ORDER, **any_order_start(ORDER, fitted)))
        return model_config("aogpt", preset=PRESET, vocab_size=self.data.padded_vocab_size, **self.size), cfg

    def scratch(self, n: int) -> dict[str, Any]:
        """AO-GPT from scratch for `n` steps (the any-order start fitted to them)."""
        def make(run_dir: Path) -> dict[str, Any]:
            mc, cfg = self._scratch_configs(n, n)
            return _train(mc, cfg, self.data, self.windows, self.seed, self.curve_every, f"scratch {n}",
                          self.progress, run_dir, self.save_every)[1]
        return _cached(self.dir / f"scratch-N{n}.json", make)

    def scratch_family(self, n: int, budgets: tuple[int, ...]) -> dict[str, Any]:
        """AO-GPT from scratch for `n` steps, one of a family of `budgets` that share their any-order start
        (fitted to the shortest) and so, under the warm-up-stable-decay schedule, every step before their
        decays (`branched`): bit for bit the run budgeted for `n` with that start (tests/bench/test_adapt.py)."""
        fitted, longest = min(budgets), max(budgets)
        key = self.dir / (f"scratch-N{n}.json" if n == fitted else f"scratch-N{n}-C{fitted}.json")
        return self.branched(key, f"scratch-trunk-C{fitted}-N{longest}", "scratch",
                             lambda b: self._scratch_configs(b, fitted), budgets, n, None)

    def branched(self, key: Path, trunk: str, label: str, configs: Callable[[int], tuple[Any, Any]],
                 budgets: tuple[int, ...], n: int, start: dict[str, float] | None) -> dict[str, Any]:
        """The run of `n` steps of a family of `budgets` whose configs (`configs(budget)`: model, train) differ
        in their step budget only, and so, under the warm-up-stable-decay schedule, in nothing before their
        decays: one trunk run (budgeted for the longest) is trained to each budget's decay, and from there the
        budget's own run (budgeted for `n`: its decay) branches off. What it gives is, bit for bit, the run
        budgeted for `n` with that start (tests/bench/training/test_adapt.py); it costs the trunk plus the decays."""
        from aogpt.checkpoint import checkpoint_name
        from aogpt.train import LRSchedule

        longest = max(budgets)

        def make(run_dir: Path) -> dict[str, Any]:
            from aogpt.io import directory_lock

            mc, cfg = configs(n)
            points = tuple(sorted(LRSchedule(configs(b)[1])._planned_decay()[0] for b in budgets))
            fork = LRSchedule(cfg)._planned_decay()[0]
            trunk_dir = self.dir / trunk
            trunk_dir.mkdir(parents=True, exist_ok=True)
            with directory_lock(trunk_dir, "aogpt bench adapt", inside=True, flag="--work"):
                if not (trunk_dir / f"point-{fork}.json").is_file():
                    _, trunk_cfg = configs(longest)
                    _train(mc, trunk_cfg, self.data, self.windows, self.seed, self.curve_every,
                           f"{label} trunk ({', '.join(map(str, budgets))})", self.progress, trunk_dir,
                           self.save_every, start, stop_at=fork, keep=points)

            branch = (trunk_dir / checkpoint_name(fork), json.loads((trunk_dir / f"point-{fork}.json").read_text()))
            record = _train(mc, cfg, self.data, self.windows, self.seed, self.curve_every, f"{label} {n}",
                            self.progress, run_dir, self.save_every, branch=branch)[1]
            return {**record, "branched_at": fork, "fitted_to": min(budgets)}
        return _cached(key, make)

    def l2r(self, f: int) -> dict[str, Any]:
        """The source trained F more steps left to right, at the recipe's backbone rate (no re-warm-up)."""
        def make(run_dir: Path) -> dict[str, Any]:
            source = self.source()
            rate = ADAPT_RECIPE["backbone_lr_mult"]
            cfg = train_config(PRESET, "gpt", **self._fields(f, init_from=str(self.dir / "source"),
                                                             lr=ADAPT_RECIPE["lr"] * rate,
                                                             min_lr=ADAPT_RECIPE["min_lr"] * rate,
                                                             warmup_steps=ADAPT_RECIPE["warmup_steps"]))
            return _train(self.gpt_cfg, cfg, self.data, self.windows, self.seed, self.curve_every, "l2r",
                          self.progress, run_dir, self.save_every, {"l2r": source["l2r"]})[1]
        return _cached(self.dir / f"l2r-S{self.steps}-F{f}.json", make)

    def unigram(self) -> float:
        """Bits per byte of the scored text under the training split's unigram law: the plateau."""
        from aogpt.bench.training.diagnostics import unigram_bpb

        return unigram_bpb(self.data, self.windows)


def run(data_root: Path, work: Path, *, steps: int = 1000, finetune: tuple[int, ...] = (1000,),
        candidates: tuple[str, ...] = (MEASURED,), seeds: int = 1, seed: int = 0, only: tuple[str, ...] = PATHS,
        eval_bytes: int | None = 30_000, curve_every: int = 250, width: int = WIDTH, save_every: int = 250,
        out: Path | None = None, progress: Callable[[str], None] | None = None, jobs: int = 1) -> dict[str, Any]:
    """Every seed's paths (those in `only` trained, the others read where kept); the report is rewritten
    after each seed, so an interrupted study keeps it. `jobs` > 1: the paths are first trained in that many
    processes of their own (every seed's source, then every seed's paths at the shortest F, then at the next F,
    ...: a family of F trains its trunk as far as each F needs), then read back here."""
    from aogpt.bench.training.adapt_report import plot, summary, to_markdown

    unknown = sorted(c for c in candidates if not _known(c)) + sorted(set(only) - set(PATHS))
    if unknown:
        raise AOGPTError(f"unknown candidate or path {unknown[0]!r}",
                         f"candidates: {', '.join([*CANDIDATES, *GATED])}; paths: {', '.join(PATHS)}")
    result: dict[str, Any] = {"benchmark": "adapt", "steps": steps, "finetune": list(finetune), "seeds": seeds,
                              "candidates": list(candidates), "eval_bytes": eval_bytes, "tokenizer": TOKENIZER,
                              "threads": torch.get_num_threads(), "preset": PRESET, "width": width,
                              "measured": MEASURED, "rows": []}
    env = environment("cpu", "auto")  # the training default
    started = time.perf_counter()
    if jobs > 1:
        Study(data_root, work, seed, steps, eval_bytes=eval_bytes, curve_every=curve_every, width=width)  # the data
        paths = [p for p in ("scratch", "scratch-sf", "l2r") if p in only]
        paths += list(candidates) if "candidates" in only else []
        tasks = [(s, "source", 0) for s in range(seed, seed + seeds) if "source" in only or paths]
        tasks += [(s, p, f) for f in sorted(finetune) for s in range(seed, seed + seeds) for p in paths]
        options = dict(steps=steps, finetune=tuple(finetune), eval_bytes=eval_bytes, curve_every=curve_every,
                       width=width, save_every=save_every, threads=torch.get_num_threads(),
                       progress=progress is not None)
        _in_processes(data_root, work, tasks, options, jobs)
    for s in range(seed, seed + seeds):
        study = Study(data_root, work, s, steps, eval_bytes=eval_bytes, curve_every=curve_every, width=width,
                      save_every=save_every, progress=progress)
        result["unigram"] = study.unigram()
        row: dict[str, Any] = {"seed": s}
        keys = ["source", *(f"{p}/F{f}" for f in finetune for p in ("scratch", "scratch-sf", "l2r", *candidates))]
        for key in keys:
            path, _, f = key.partition("/")
            wanted = path if path in PATHS else "candidates"
            if wanted in only or (study.dir / _file(key, steps, finetune)).is_file():
                row[key] = _job(study, path, int(f[1:]) if f else 0, finetune)
        start = study.dir / f"adapted-S{steps}.json"
        if start.is_file():
            row["adapted_start"] = json.loads(start.read_text())
        for c in candidates:  # a gated pathway's step 0 (read left to right: the source)
            if c in GATED and (study.dir / f"adapted-gated-r{GATED[c][0] or 'full'}-S{steps}.json").is_file():
                row[f"{c}/start"] = json.loads((study.dir / f"adapted-gated-r{GATED[c][0] or 'full'}-S{steps}.json")
                                               .read_text())
        result["rows"].append(row)
        result["environment"] = finish_environment(env)
        result["wall_seconds"] = time.perf_counter() - started
        result["summary"] = summary(result)
        if out is not None:
            result["files"] = write_outputs(out, "adapt", to_markdown(result), result, plot=plot)
    return result


def _path_task(task: tuple[Path, Path, int, str, int, dict[str, Any]]) -> str:
    """One seed's path at one F in a worker process of its own (`run` with jobs > 1)."""
    import sys

    data_root, work, seed, path, f, options = task
    torch.set_num_threads(options["threads"])

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    study = Study(data_root, work, seed, options["steps"], eval_bytes=options["eval_bytes"],
                  curve_every=options["curve_every"], width=options["width"], save_every=options["save_every"],
                  progress=say if options["progress"] else None)
    _job(study, path, f, options["finetune"])
    return f"{path} (seed {seed})"


def _in_processes(data_root: Path, work: Path, tasks: list[tuple[int, str, int]], options: dict[str, Any],
                  jobs: int) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")  # a fresh interpreter per worker: no forked torch state
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        for _ in pool.map(_path_task, [(data_root, work, s, p, f, options) for s, p, f in tasks]):
            pass


def _job(study: Study, path: str, f: int, finetune: tuple[int, ...]) -> dict[str, Any]:
    if path == "source":
        return study.source()
    if path == "scratch":  # several F: one family (its start fitted to the shortest), branched off one trunk
        return study.scratch_family(f, finetune) if len(finetune) > 1 else study.scratch(f)
    if path == "scratch-sf":
        return study.scratch_family(study.steps + f, tuple(study.steps + g for g in finetune))
    if path == "l2r":
        return study.l2r(f)
    return study.candidate(path, f, finetune if len(finetune) > 1 else ())


def _file(key: str, steps: int, finetune: tuple[int, ...]) -> str:
    path, _, f = key.partition("/")
    n = int(f[1:]) if f else 0
    if path == "source":
        return f"source-S{steps}.json"
    if path == "scratch":
        fitted = min(finetune)
        return f"scratch-N{n}.json" if n == fitted else f"scratch-N{n}-C{fitted}.json"
    if path == "scratch-sf":
        fitted = steps + min(finetune)
        return f"scratch-N{steps + n}.json" if steps + n == fitted else f"scratch-N{steps + n}-C{fitted}.json"
    fitted = fitted_to(path, finetune) if len(finetune) > 1 and path != "l2r" else 0
    return f"{path}-S{steps}-F{n}.json" if fitted in (0, n) else f"{path}-S{steps}-F{n}-C{fitted}.json"


__all__ = ["BASE", "CANDIDATES", "GATED", "LETGO", "MEASURED", "PATHS", "STUDY", "Study", "fitted_to", "run"]
