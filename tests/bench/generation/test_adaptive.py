"""`aogpt.bench.generation.adaptive`: the pieces against independent computations, and one tiny end-to-end run
(training, solving, the spread, the report, reuse of trained runs)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from aogpt.bench.generation.adaptive import (
    ORDERS,
    answer_digits,
    bench_adaptive,
    puzzle_template,
    spread,
    targets,
    wilson,
)
from aogpt.data.synthetic import puzzles, task
from aogpt.errors import AOGPTError
from tests.generation.test_generate import tiny_model


def test_wilson_interval_by_its_formula():
    z = 1.959963984540054
    for k, n in ((0, 10), (3, 10), (50, 200), (200, 200)):
        p = k / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        low, high = wilson(k, n)
        assert low == pytest.approx(max(0.0, centre - half), abs=1e-9)
        assert high == pytest.approx(min(1.0, centre + half), abs=1e-9)


def test_templates_and_answers_round_trip():
    t = task("sudoku4")
    for p in puzzles(t, 5, seed=0):
        template = puzzle_template(t, p)
        assert len(template) == 17 and template[-1] == 256
        assert [None if x is None else int(chr(x)) for x in template[:16]] == list(p.givens)
        ids = torch.tensor([ord(str(d)) for d in p.solution] + [256])
        assert answer_digits(t, ids) == list(p.solution) and t.check(p, answer_digits(t, ids))
        bad = ids.clone()
        bad[0] = 256  # an end-of-text token where a digit belongs
        assert answer_digits(t, bad)[0] == -1 and not t.check(p, answer_digits(t, bad))


def test_targets_are_ratios_to_random_order():
    rows = [{"model": "aogpt", "order": o, "rate": r} for o, r in
            (("random", 0.2), ("l2r", 0.1), ("confidence", 0.5), ("margin", 0.3), ("entropy", 0.0))]
    got = {t["name"].split(": ")[1].split()[0]: t for t in targets(rows)}
    assert set(got) == {"confidence", "margin", "entropy"}
    assert got["confidence"]["value"] == pytest.approx(2.5) and got["confidence"]["met"]
    assert got["margin"]["value"] == pytest.approx(1.5) and not got["margin"]["met"]
    assert got["entropy"]["value"] == 0.0
    none = targets([{"model": "aogpt", "order": "random", "rate": 0.0}, {"model": "aogpt", "order": "margin",
                                                                         "rate": 0.0}])
    assert none[0]["value"] is None and none[0]["met"] is None
    lucky = targets([{"model": "aogpt", "order": "random", "rate": 0.0}, {"model": "aogpt", "order": "margin",
                                                                          "rate": 0.002}])
    assert lucky[0]["value"] is None and lucky[0]["met"] is None and "random order solved none" in lucky[0]["line"]


def test_spread_is_the_exact_nll_of_every_order(bytes_data):
    from aogpt.data import PreparedData
    from aogpt.families import family_of

    data = PreparedData(bytes_data)
    model = tiny_model("aogpt", vocab=320, block=12).float()
    got = spread(model, data, sequences=3, orders=4, block=12, seed=0)
    idx = next(data.iter_eval_batches("val", 3, 12))
    gen = torch.Generator().manual_seed(0)
    nll = np.stack([family_of(model).order_nll(model, idx, torch.rand(3, 12, generator=gen).argsort(1)).sum(1)
                    .detach().numpy() for _ in range(4)])
    assert got["mean_nll"] == pytest.approx(nll.mean(), rel=1e-5)
    assert got["sd_across_orders"] == pytest.approx(nll.std(0, ddof=1).mean(), rel=1e-4)
    assert got["range_across_orders"] == pytest.approx((nll.max(0) - nll.min(0)).mean(), rel=1e-4)
    assert got["best_order_nll"] <= got["order_mixture_nll"] <= got["mean_nll"] + 1e-9


def test_end_to_end_tiny_run_and_reuse(tmp_path, tiny_run, bytes_data):
    kw = dict(task="sudoku4", train_steps=3, solutions=300, puzzles=2, seeds=2, layers=1, width=16, heads=2, batch=4,
              spread_sequences=2, spread_orders=2, text_checkpoint=tiny_run, text_data=bytes_data,
              work=tmp_path / "work", out=tmp_path / "out", show_progress=False, seed=5)
    res = bench_adaptive(**kw)
    assert [(r["model"], r["order"]) for r in res["solve"]] == [(m, o) for m in ("aogpt", "encoder-mdm")
                                                                for o in ORDERS]
    for r in res["solve"]:
        assert r["attempts"] == 4 and len(r["per_seed"]) == 2 and r["ci95"] == pytest.approx(wilson(r["solved"], 4))
        assert r["forwards_per_puzzle"] > 0
    dec = {r["order"]: r["slot_evaluations_per_puzzle"] for r in res["solve"] if r["model"] == "aogpt"}
    assert dec["confidence"] > dec["random"]  # every remaining position scored at every step
    assert [s["data"] for s in res["spread"]] == ["synthetic:sudoku4", "synthetic:sudoku4", res["spread"][2]["data"]]
    assert len(res["targets"]) == 6
    for name in ("adaptive.md", "adaptive.json"):
        assert (tmp_path / "out" / name).is_file()
    assert "## How much log p(x) depends on the order" in (tmp_path / "out" / "adaptive.md").read_text()
    runs = sorted((tmp_path / "work" / "runs").iterdir())
    stamps = [(r / "finished.json").stat().st_mtime_ns for r in runs]
    again = bench_adaptive(**{**kw, "orders": ["l2r"], "out": None})  # the trained runs are reused
    assert [(r / "finished.json").stat().st_mtime_ns for r in runs] == stamps
    assert again["solve"][0]["rate"] == res["solve"][1]["rate"]  # l2r with greedy tokens: deterministic
    with pytest.raises(AOGPTError, match="unknown order"):
        bench_adaptive(**{**kw, "orders": ["sideways"]})
    with pytest.raises(AOGPTError, match="holds a encoder-mdm model"):
        bench_adaptive(**{**kw, "checkpoints": {"aogpt": runs[1]}})


def test_an_interrupted_training_is_not_reused(tmp_path, monkeypatch):
    """A training stopped by a signal is reported and left unfinished (the next run trains afresh),
    never reused as if it had run all its steps."""
    from aogpt.bench.generation.adaptive import TrainSpec, prepared_corpus, trained_run
    from aogpt.train.trainer import Trainer

    step = Trainer.train_step

    def interrupted(self):
        out = step(self)
        self._stop_signal = "SIGINT"  # as if Ctrl-C arrived during the first step
        return out

    data = prepared_corpus("synthetic:sudoku4", tmp_path, 0, False, 200)
    spec = TrainSpec("aogpt", "synthetic:sudoku4", 4, 1, 16, 2, 4, block=data.record_tokens)
    monkeypatch.setattr(Trainer, "train_step", interrupted)
    with pytest.raises(AOGPTError, match="stopped at step 1 of 4"):
        trained_run(spec, data, tmp_path, "cpu", False)
    assert not (tmp_path / "runs" / spec.name / "finished.json").exists()
    monkeypatch.setattr(Trainer, "train_step", step)
    assert (trained_run(spec, data, tmp_path, "cpu", False) / "finished.json").is_file()
