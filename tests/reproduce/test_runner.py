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
    assert resolve_findings(["fig9", "1", "F1"]) == ("f1", "adaln-ema")
    with pytest.raises(AOGPTError, match="unknown finding"):
        resolve_findings(["f99"])


def test_ema_decays_are_scaled_to_the_run():
    assert ema_decay("none", 960) == 0.0
    assert ema_decay("0.9999", 50_000) == pytest.approx(0.9999)  # the reference length keeps the paper's decay
    assert ema_decay("0.9999", 960) == pytest.approx(1 - 1 / (10_000 * 960 / 50_000))
    assert ema_decay("0.99", 200) == 0.0  # a horizon under one step: no averaging at all
