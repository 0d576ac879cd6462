"""The runner: interleaved pieces, resuming after an interruption, skipping finished runs, budgets."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from aogpt.checkpoint import load
from aogpt.data import PreparedData
from aogpt.errors import AOGPTError
from aogpt.reproduce import runner
from aogpt.reproduce.runner import make_plan, resolve_findings, train_runs
from aogpt.reproduce.scale import QUICK, ema_decay
from aogpt.train import Trainer

SCALE = dataclasses.replace(QUICK, steps=8, evals=2, eval_batches=2, warmup_steps=2)  # seconds per run


def plan_for(out, data, findings=("f1",), scale=SCALE, seeds=(1,)):
    return make_plan(out, scale, seeds, findings, int(data.tokenizer.padded_vocab_size))


def evals(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if k.startswith("val/")} for r in rows if r["kind"] == "eval"}


def test_runs_take_turns_and_record_every_piece(tmp_path, bytes_data):
    data = PreparedData(bytes_data)
    plan = plan_for(tmp_path, data)
    order = []
    original = runner.advance

    def spy(run, until, data):
        order.append((run.spec.key, until))
        return original(run, until, data)

    runner.advance = spy
    try:
        train_runs(plan, data, show_progress=False)
    finally:
        runner.advance = original
    piece = SCALE.eval_interval
    assert order == [("l2r", piece), ("uniform", piece), ("l2r", 2 * piece), ("uniform", 2 * piece)]
    for run in plan.runs:
        assert run.done and run.step() == SCALE.steps
        records = run.batch_records()
        assert sorted(records) == [piece, 2 * piece]
        assert len(records[piece]["val/l2r/ema"]) == SCALE.eval_batches
        assert not any(c.joinpath("trainer.pt").exists() for c in run.dir.glob("ckpt-*"))  # finished: weights only
        assert (run.dir / "loss.png").is_file() and (run.dir / "run.json").is_file()


def test_an_interrupted_reproduction_continues_exactly(tmp_path, bytes_data, monkeypatch):
    data = PreparedData(bytes_data)
    whole = plan_for(tmp_path / "whole", data)
    train_runs(whole, data, show_progress=False)

    cut = plan_for(tmp_path / "cut", data)
    original = Trainer.train_step

    def interrupted(self):
        result = original(self)
        if self.step == 3 and self.out.name.startswith("uniform"):
            self._stop_signal = "SIGINT"  # what Ctrl-C sets: the step finishes, a checkpoint is written
        return result

    monkeypatch.setattr(Trainer, "train_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_runs(cut, data, show_progress=False)
    monkeypatch.setattr(Trainer, "train_step", original)
    assert cut.run("uniform", 1).step() == 3 and cut.run("l2r", 1).step() == SCALE.eval_interval
    train_runs(cut, data, show_progress=False)
    for a, b in zip(whole.runs, cut.runs, strict=True):
        assert a.batch_records() == b.batch_records()
        grid = set(a.batch_records())
        assert {s: v for s, v in evals(a.dir).items() if s in grid} == {s: v for s, v in evals(b.dir).items()
                                                                        if s in grid}
        wa, wb = load(a.dir).model.state_dict(), load(b.dir).model.state_dict()
        assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_rerun_skips_finished_runs_and_retrains_changed_ones(tmp_path, bytes_data, monkeypatch):
    data = PreparedData(bytes_data)
    plan = plan_for(tmp_path, data)
    train_runs(plan, data, show_progress=False)

    def must_not_run(*args):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(runner, "advance", must_not_run)
    assert train_runs(plan_for(tmp_path, data), data, show_progress=False) == []
    monkeypatch.undo()
    changed = plan_for(tmp_path, data, scale=dataclasses.replace(SCALE, lr=1e-3))
    notes = train_runs(changed, data, show_progress=False)
    assert len(notes) == 2 and all("other settings" in n for n in notes)
    assert all(r.done for r in changed.runs)


def test_budget_picks_the_steps_from_measured_times(tmp_path, bytes_data, monkeypatch):
    data = PreparedData(bytes_data)
    plan = plan_for(tmp_path, data)  # two runs of the same model
    model_keys = {json.dumps([dataclasses.asdict(r.model_cfg), r.train_cfg.order], sort_keys=True)
                  for r in plan.runs}
    monkeypatch.setattr(runner, "time_per_step",
                        lambda plan, data: {**dict.fromkeys(model_keys, 0.01), "validation": 0.1})
    steps, info = runner.fit_budget(plan, data, minutes=1.0)
    # 60 s, 15% kept for analyses, 2 runs x 2 validations x 0.1 s, 2 x 0.01 s per step
    expected = int((60 * 0.85 - 0.4) / 0.02) // SCALE.evals * SCALE.evals
    assert steps == expected and steps % SCALE.evals == 0
    with pytest.raises(AOGPTError, match="too few"):
        runner.fit_budget(plan, data, minutes=0.005)


def test_finding_names_and_aliases():
    assert resolve_findings(None)[0] == "f1" and "orders" in resolve_findings([])
    assert "infill" not in resolve_findings(None) and resolve_findings(["fim"]) == ("infill",)  # only when named
    assert resolve_findings(["fig9", "1", "F1"]) == ("f1", "adaln-ema")
    with pytest.raises(AOGPTError, match="unknown finding"):
        resolve_findings(["f99"])


def test_ema_decays_are_scaled_to_the_run():
    assert ema_decay("none", 960) == 0.0
    assert ema_decay("0.9999", 50_000) == pytest.approx(0.9999)  # the reference length keeps the paper's decay
    assert ema_decay("0.9999", 960) == pytest.approx(1 - 1 / (10_000 * 960 / 50_000))
    assert ema_decay("0.99", 200) == 0.0  # a horizon under one step: no averaging at all


def test_recipe_findings_run_three_seeds_and_the_others_one(tmp_path):
    """The default plan: every run of a training-recipe finding at 3 seeds, runs only the other findings
    need at the first seed; each finding (and analysis) sees exactly its own seeds."""
    from aogpt.reproduce.findings import FINDINGS, RECIPE
    from aogpt.reproduce.scale import DEFAULT

    seeds = tuple(range(7, 7 + DEFAULT.seeds))
    plan = make_plan(tmp_path, DEFAULT, seeds, tuple(FINDINGS), 320, recipe_only=True, text_vocab=257)
    recipe_runs = {k for f in RECIPE for k in FINDINGS[f].runs}
    other_runs = {k for f in FINDINGS for k in FINDINGS[f].runs} - recipe_runs
    by_key: dict[str, list[int]] = {}
    for r in plan.runs:
        by_key.setdefault(r.spec.key, []).append(r.seed)
    assert {k: v for k, v in by_key.items() if k in recipe_runs} == {k: list(seeds) for k in recipe_runs}
    assert {k: v for k, v in by_key.items() if k in other_runs} == {k: [7] for k in other_runs}
    assert len(plan.runs) == 3 * len(recipe_runs) + len(other_runs)
    for f in FINDINGS:
        sub = plan.for_finding(f)
        assert sub.seeds == (seeds if f in RECIPE else (7,))
        for key in FINDINGS[f].runs:  # every run a finding pairs over exists at each of its seeds
            assert all(sub.run(key, s) for s in sub.seeds)
    assert plan.for_analysis("ensemble").seeds == (7,) and plan.for_analysis("genppl").seeds == (7,)
    every = make_plan(tmp_path, DEFAULT, seeds, tuple(FINDINGS), 320, text_vocab=257)  # --seeds N: all at N
    assert len(every.runs) == 3 * len(recipe_runs | other_runs) and every.for_finding("f6").seeds == seeds


def test_the_report_says_which_verdicts_rest_on_one_seed():
    from aogpt.reproduce.markdown import to_markdown

    check = {"claim": "A below B", "rule": "lower", "margin": 0.0, "a": {"label": "A", "mean": 1.0},
             "b": {"label": "B", "mean": 2.0}, "estimate": {"value": 1.0, "low": 0.5, "high": 1.5, "n": 3,
                                                            "units": "seeds"}, "verdict": "reproduced"}
    finding = {"key": "f1", "title": "F1", "claim": "c", "verdict": "reproduced", "checks": [check]}
    report = {"scale": {"name": "default", "description": "d"}, "seeds": [1, 2, 3], "wall_seconds": 1.0,
              "machine": {"device": "cpu", "threads": 1, "cpus": 2, "torch": "x", "load_average": None},
              "rule": "r", "notes": [], "findings": [{**finding, "seeds": [1, 2, 3]},
                                                     {**finding, "key": "f2", "seeds": [1]}]}
    text = to_markdown(report)
    assert "*3 seeds (1, 2, 3):* intervals over seeds." in text
    assert "*One seed (1):* this verdict rests on one training run per model" in text
    assert "| reproduced | 1 reproduced | 3 seeds |" in text and "| reproduced | 1 reproduced | one seed |" in text
