"""Training the runs of a reproduction: interleaved, resumable, budgeted in steps.

Every run trains for the scale's steps in `Scale.evals` equal pieces. The runs take turns piece by
piece (round r brings every run to step r * steps / evals), so a machine that slows down halfway
slows every run alike, and the curves of all runs exist at every point of the command. Each piece is
`Trainer.fit(until=...)`: it ends with a validation and a checkpoint, from which the next piece
resumes exactly (same schedule, data and order streams). So:

* a rerun skips finished runs (``done.json``) and continues the others from their checkpoints;
* Ctrl-C (SIGINT) or SIGTERM stops the current piece after its current step and writes a
  checkpoint: nothing already trained is lost;
* a run directory made with other settings (``reproduce.json`` differs) is trained again from scratch.

Besides the trainer's files (``metrics.jsonl``, ``loss.png``, ``ckpt-*``), a run directory holds
``reproduce.json`` (its spec and configs), ``batches.jsonl`` (the validation loss of every batch at
every piece's end: the error bars) and, when finished, ``done.json``.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from aogpt.checkpoint import list_checkpoints
from aogpt.config import ModelConfig, TrainConfig, to_dict
from aogpt.errors import AOGPTError
from aogpt.io import ensure_writable_dir, read_json, write_json
from aogpt.progress import progress
from aogpt.reproduce.findings import FINDINGS, RECIPE, RUNS, RunSpec
from aogpt.reproduce.scale import Scale, configs

CORPUS = "shakespeare"


@dataclass
class Run:
    """One training run of the plan: a spec at a seed, in its directory."""

    spec: RunSpec
    seed: int
    dir: Path
    model_cfg: ModelConfig
    train_cfg: TrainConfig

    @property
    def name(self) -> str:
        return self.dir.name

    @property
    def identity(self) -> dict[str, Any]:
        return {"spec": asdict(self.spec), "seed": self.seed, "model": to_dict(self.model_cfg),
                "train": to_dict(self.train_cfg)}

    @property
    def done(self) -> bool:
        return (self.dir / "done.json").is_file()

    def step(self) -> int:
        """The step of the newest checkpoint (0 when none)."""
        ckpts = list_checkpoints(self.dir)
        return int(ckpts[-1].name.split("-")[-1]) if ckpts else 0

    def batch_records(self) -> dict[int, dict[str, list[float]]]:
        """{step: {"val/<kind>/<weights>": per-batch losses}} from batches.jsonl (later lines win)."""
        path = self.dir / "batches.jsonl"
        records: dict[int, dict[str, list[float]]] = {}
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    row = json.loads(line)
                    records[int(row.pop("step"))] = row
        return records


@dataclass
class Plan:
    """What one command trains: the runs of the chosen findings at their seeds, at one scale.
    `finding_seeds` gives each finding's seeds (default: all of `seeds`)."""

    out: Path
    scale: Scale
    seeds: tuple[int, ...]
    findings: tuple[str, ...]
    runs: list[Run] = field(default_factory=list)
    finding_seeds: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def seeds_of(self, finding: str) -> tuple[int, ...]:
        return self.finding_seeds.get(finding, self.seeds)

    def for_finding(self, finding: str) -> Plan:
        """The plan as one finding sees it: its seeds only (its checks pair over them)."""
        return dataclasses.replace(self, seeds=self.seeds_of(finding), findings=(finding,))

    def for_analysis(self, name: str) -> Plan:
        """The plan as an analysis sees it: the seeds every planned finding that needs it has."""
        users = [f for f in self.findings if name in FINDINGS[f].analyses]
        seeds = tuple(s for s in self.seeds if all(s in self.seeds_of(f) for f in users))
        return dataclasses.replace(self, seeds=seeds or self.seeds[:1])

    def run(self, key: str, seed: int) -> Run:
        for r in self.runs:
            if r.spec.key == key and r.seed == seed:
                return r
        raise KeyError(f"{key} at seed {seed} is not in the plan")


def resolve_findings(names: list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """Finding keys in their canonical order (when none are named, all but the optional ones,
    `findings.OPTIONAL`, which run only when named); aliases accepted."""
    from aogpt.reproduce.findings import ALIASES, OPTIONAL

    if not names:
        return tuple(k for k in FINDINGS if k not in OPTIONAL)
    wanted = set()
    for name in names:
        key = ALIASES.get(name.lower(), name.lower())
        if key not in FINDINGS:
            raise AOGPTError(f"unknown finding {name!r}", f"choose from: {', '.join(FINDINGS)} (or none for all)")
        wanted.add(key)
    return tuple(k for k in FINDINGS if k in wanted)


def prepare_data(out: Path, tokenizer: str, show_progress: bool = True) -> Any:
    """The bundled Shakespeare corpus, tokenized once into DIR/data/ (reused by reruns)."""
    from aogpt.data import PreparedData, prepare

    data_dir = out / "data" / f"{CORPUS}-{tokenizer.replace(':', '')}"
    if not (data_dir / "meta.json").is_file():
        prepare(CORPUS, tokenizer, data_dir, progress=show_progress)
    return PreparedData(data_dir, expect_tokenizer=tokenizer)


def finding_seeds(findings: tuple[str, ...], seeds: tuple[int, ...], recipe_only: bool) -> dict[str, tuple[int, ...]]:
    """Each finding's seeds: all of them, or with `recipe_only` all for the training-recipe findings
    (`RECIPE`) and the first for the others."""
    return {f: seeds if (not recipe_only or f in RECIPE) else seeds[:1] for f in findings}


def make_plan(out: Path, scale: Scale, seeds: tuple[int, ...], findings: tuple[str, ...], vocab_size: int,
              device: str = "cpu", recipe_only: bool = False, text_vocab: int | None = None) -> Plan:
    """Every run the findings need (shared runs once), at every seed a finding using it has
    (`finding_seeds`), ordered seed-major. `text_vocab`: the tokenizer's own ids (a fill-in-the-middle
    run's sentinels follow them)."""
    keys = list(dict.fromkeys(k for f in findings for k in FINDINGS[f].runs))
    plan = Plan(out, scale, seeds, findings, finding_seeds=finding_seeds(findings, seeds, recipe_only))
    for seed in seeds:
        for key in keys:
            if not any(key in FINDINGS[f].runs and seed in plan.seeds_of(f) for f in findings):
                continue
            mc, tc = configs(RUNS[key], scale, vocab_size, seed, device, text_vocab)
            plan.runs.append(Run(RUNS[key], seed, out / "runs" / f"{key}-seed{seed}", mc, tc))
    return plan


def _check_identity(run: Run) -> str | None:
    """Make the run directory match the run: keep it, or clear one made with other settings.
    Returns a note for the user when a directory was cleared."""
    path = run.dir / "reproduce.json"
    if path.is_file() and same_identity(read_json(path, "run identity"), json.loads(json.dumps(run.identity))):
        return None
    note = None
    if run.dir.exists():
        note = f"{run.name}: made with other settings, training it again"
        shutil.rmtree(run.dir)
    ensure_writable_dir(run.dir)
    write_json(path, run.identity)
    return note


def same_identity(stored: Any, current: dict[str, Any]) -> bool:
    """Whether a run directory's stored identity is the run's: equal, but for fields added to the specs
    and configs after it was written that still hold their defaults (a newer version's new options,
    unused by that run)."""
    if not isinstance(stored, dict):
        return False
    defaults = {"spec": asdict(RunSpec("", "")), "model": to_dict(ModelConfig()), "train": to_dict(TrainConfig())}
    trimmed = dict(current)
    for section, fields in defaults.items():
        if isinstance(stored.get(section), dict) and isinstance(current.get(section), dict):
            trimmed[section] = {k: v for k, v in current[section].items()
                                if k in stored[section] or k not in fields or v != fields[k]}
    return stored == trimmed


def _record(run: Run, step: int, per_batch: dict[str, list[float]]) -> None:
    with open(run.dir / "batches.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": step, **per_batch}) + "\n")


def _finish(run: Run, summary: dict[str, Any]) -> None:
    """Mark the run done; its optimizer state is no longer needed (the weights stay)."""
    for ckpt in list_checkpoints(run.dir):
        (ckpt / "trainer.pt").unlink(missing_ok=True)
    write_json(run.dir / "done.json", {k: v for k, v in summary.items() if k != "plot"})


def advance(run: Run, until: int, data: Any, stop: Callable[[], bool] | None = None) -> int:
    """Train `run` up to step `until` (resuming its newest checkpoint) and record the validation
    batches there; returns the steps trained. Raises KeyboardInterrupt after a stop signal (the
    trainer has checkpointed). `stop`: a signal came before the piece began (a worker of
    `aogpt.reproduce.jobs`): train one step and checkpoint."""
    from aogpt.train import Trainer

    trainer = Trainer(run.model_cfg, run.train_cfg, data, run.dir, tokenizer=data.tokenizer, show_progress=False,
                      run_meta={"tokenizer": data.meta.get("tokenizer"), "data": str(Path(data.directory).resolve()),
                                "reproduce": run.spec.key})
    ckpts = list_checkpoints(run.dir)
    if ckpts:
        trainer.resume(ckpts[-1])
    else:
        write_json(run.dir / "run.json", {"model": to_dict(run.model_cfg), "train": to_dict(run.train_cfg),
                                          "reproduce": run.spec.key, "label": run.spec.label})
    start = trainer.step
    grid = run.train_cfg.eval_interval
    if start and start % grid == 0 and start not in run.batch_records():  # stopped between save and record
        trainer.evaluate()
        _record(run, start, trainer.validation.per_batch)
    if start < until:
        if stop is not None and stop():
            trainer._stop_signal = "SIGINT"
        summary = trainer.fit(until)
        if summary["stopped_by"] in ("SIGINT", "SIGTERM"):
            raise KeyboardInterrupt
        _record(run, trainer.step, trainer.validation.per_batch)
        if trainer.step >= run.train_cfg.max_steps:
            _finish(run, summary)
    elif start >= run.train_cfg.max_steps and not run.done:
        _finish(run, {"step": start, **trainer.evaluate()})
    return trainer.step - start


def pieces(run: Run, evals: int) -> list[int]:
    """The steps each piece of `run` trains to: its steps in `evals` equal pieces."""
    steps = run.train_cfg.max_steps
    return [r * steps // evals for r in range(1, evals + 1)]


def train_runs(plan: Plan, data: Any, show_progress: bool = True, jobs: int = 1) -> list[str]:
    """Train every run of the plan, interleaved piece by piece (module docstring), in this process or,
    with `jobs` > 1, in that many processes side by side (`aogpt.reproduce.jobs`); returns notes."""
    notes = [n for n in (_check_identity(r) for r in plan.runs) if n]
    todo = [r for r in plan.runs if not r.done]
    if not todo:
        return notes
    total, done_steps = sum(r.train_cfg.max_steps for r in todo), sum(r.step() for r in todo)
    evals = plan.scale.evals
    pool = None
    if jobs > 1:
        from aogpt.reproduce.jobs import Pool, threads_per_job

        pool = Pool(Path(data.directory), jobs, threads_per_job(jobs))
    try:
        with progress(total=total, desc="reproduce: training", initial=done_steps, unit="step",
                      disable=not show_progress) as bar:
            for r in range(evals):
                round_ = [(run, pieces(run, evals)[r]) for run in todo if not run.done]
                if pool is None:
                    for run, until in round_:
                        bar.set_postfix_str(f"{run.name} to step {until}")
                        bar.update(advance(run, until, data))
                    continue
                from aogpt.reproduce.jobs import cost

                bar.set_postfix_str(f"round {r + 1} of {evals}, {jobs} processes")
                round_.sort(key=lambda item: -cost(item[0]))
                pool.run_round(advance, round_, lambda run, steps: bar.update(steps))
    finally:
        if pool is not None:
            pool.close()
    return notes


def time_per_step(plan: Plan, data: Any, steps: int = 3) -> dict[str, float]:
    """Seconds per training step of each distinct model in the plan, and of one validation, measured
    here (after a warm-up step): what `fit_budget` plans with."""
    from aogpt.train import Trainer

    seen: dict[str, float] = {}
    for run in plan.runs:
        key = json.dumps([to_dict(run.model_cfg), run.train_cfg.order], sort_keys=True)
        if key in seen:
            continue
        trainer = Trainer(run.model_cfg, run.train_cfg, data, None, show_progress=False)
        trainer.train_step()
        start = time.perf_counter()
        for _ in range(steps):
            trainer.train_step()
        seen[key] = (time.perf_counter() - start) / steps
        if "validation" not in seen:
            start = time.perf_counter()
            trainer.evaluate()
            seen["validation"] = time.perf_counter() - start
    return seen


def fit_budget(plan: Plan, data: Any, minutes: float, analysis_share: float = 0.15,
               jobs: int = 1) -> tuple[int, dict[str, Any]]:
    """The most steps (a multiple of the scale's evaluations) that train every run of the plan in
    `minutes`, keeping `analysis_share` of the time for ensembles, generation and the benchmark.
    A run with its own budget counts its steps per step of the scale; `jobs` processes side by side
    divide the training time by `jobs` (each timed here at one thread). Returns the steps and what the
    estimate was made of."""
    if jobs > 1:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
    try:
        timings = time_per_step(plan, data)
    finally:
        if jobs > 1:
            torch.set_num_threads(threads)
    per_step = sum(timings[json.dumps([to_dict(r.model_cfg), r.train_cfg.order], sort_keys=True)]
                   * r.train_cfg.max_steps / plan.scale.steps for r in plan.runs) / jobs
    validations = len(plan.runs) * plan.scale.evals * timings["validation"] / jobs
    seconds = minutes * 60 * (1 - analysis_share) - validations
    evals = plan.scale.evals
    steps = int(seconds / max(per_step, 1e-9)) // evals * evals
    if steps < 5 * evals:
        need = (5 * evals * per_step + validations) / 60 / (1 - analysis_share)
        raise AOGPTError(f"{minutes:g} minutes are too few for {len(plan.runs)} runs on this machine",
                         f"give at least --budget-minutes {need:.0f}, or fewer findings or seeds")
    return steps, {"seconds_per_step_all_runs": per_step, "validation_seconds": timings["validation"],
                   "threads": torch.get_num_threads(), "jobs": jobs}
