"""compare_runs: curves read back exactly, final metrics tabulated, bad inputs refused."""

from __future__ import annotations

import json

import pytest

from aogpt.errors import AOGPTError
from aogpt.reproduce.compare import compare_runs, read_run
from tests.train.runs import make


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    for name, order in (("a", "l2r"), ("b", "fixed-random:1")):
        (root / name).mkdir()
        make(root / name, order=order).fit()
    return root / "a", root / "b"


def test_curves_and_final_metrics_match_the_metrics_file(two_runs, tmp_path):
    summary = compare_runs(list(two_runs), tmp_path / "cmp", labels=["left", "fixed"])
    for label, run in zip(("left", "fixed"), two_runs, strict=True):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        last_eval = [r for r in rows if r["kind"] == "eval"][-1]
        last_train = [r for r in rows if r["kind"] == "train"][-1]
        final = summary["final"][label]
        assert final["step"] == 12 and final["train/loss"] == last_train["loss"]
        assert {k: v for k, v in final.items() if k.startswith("val/")} == {
            k: v for k, v in last_eval.items() if k.startswith("val/")}
    assert "val/own/ema" in summary["final"]["fixed"] and "val/own/ema" not in summary["final"]["left"]
    for name in ("compare.png", "compare.md", "compare.json"):
        assert (tmp_path / "cmp" / name).is_file()
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| left | 12 |" in table and "val/any/ema" in table and "val/l2r/raw" not in table


def test_read_run_keeps_the_last_record_of_a_step(two_runs, tmp_path):
    run = tmp_path / "dup"
    run.mkdir()
    rows = [{"kind": "eval", "step": 6, "val/l2r/ema": 2.0}, {"kind": "eval", "step": 6, "val/l2r/ema": 1.5},
            {"kind": "train", "step": 6, "loss": 3.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    curves = read_run(run)
    assert curves.evals["val/l2r/ema"] == [(6, 1.5)] and curves.train == [(6, 3.0)]


def test_bad_inputs_are_user_errors(two_runs, tmp_path):
    with pytest.raises(AOGPTError, match="no metrics.jsonl"):
        compare_runs([tmp_path], tmp_path / "x")
    with pytest.raises(AOGPTError, match="labels"):
        compare_runs(list(two_runs), tmp_path / "x", labels=["one"])
    with pytest.raises(AOGPTError, match="weights"):
        compare_runs(list(two_runs), tmp_path / "x", weights="best")
