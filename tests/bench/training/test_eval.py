"""`aogpt.bench.training.eval`: every contender runs on the same model and tokens, the ratios are those of the
reported medians, and bad input is refused before any work."""

from __future__ import annotations

import json
import math

import pytest

from aogpt.bench.training.eval import CONTENDERS, bench_eval, ratios
from aogpt.errors import AOGPTError
from tests.bench import TINY


def test_eval_times_every_contender_and_writes_table_and_json(tmp_path):
    res = bench_eval(n=8, batch=3, size=TINY, members=3, ensemble_sequences=2, repeats=2, out=tmp_path)
    assert set(res["seconds"]) == set(res["cpu_seconds"]) == set(CONTENDERS)
    assert all(len(res["runs"][k]) == len(res["cpu_runs"][k]) == 2 for k in CONTENDERS)
    assert res["tokens"] == {"train": 24, "eval-l2r": 24, "eval-random": 24, "ensemble-base": 16, "ensemble": 16}
    s, c = res["seconds"], res["cpu_seconds"]
    assert math.isclose(res["ratios"]["train/eval-l2r"], s["train"] / s["eval-l2r"])
    assert math.isclose(res["cpu_ratios"]["train/eval-random"], c["train"] / c["eval-random"])
    per_member = (s["ensemble"] - s["ensemble-base"]) / 2
    assert math.isclose(res["ratios"]["member/ensemble-base"], per_member / s["ensemble-base"])
    assert math.isclose(res["seconds_per_member_per_sequence"], per_member / 2)
    assert math.isclose(res["tokens_per_second"]["eval-l2r"], 24 / s["eval-l2r"])
    # untrained model over 32 tokens: every NLL per token is near log(32)
    assert all(abs(v - math.log(32)) < 0.5 for v in res["nll_per_token"].values())
    assert res["targets"][0]["value"] == res["ratios"]["train/eval-l2r"] and res["targets"][0]["relation"] == ">="
    md = (tmp_path / "eval.md").read_text()
    assert "| training step (forward, backward, AdamW) | 24 |" in md and "ensemble of 3 members" in md
    assert json.loads((tmp_path / "eval.json").read_text())["seconds"] == res["seconds"]


def test_ratios_of_the_medians():
    sec = {"train": 6.0, "eval-l2r": 2.0, "eval-random": 3.0, "ensemble-base": 1.0, "ensemble": 7.0}
    assert ratios(sec, members=4) == {"train/eval-l2r": 3.0, "train/eval-random": 2.0, "member/ensemble-base": 2.0}


@pytest.mark.parametrize("kw, message", [
    (dict(repeats=0), "repeats positive"),
    (dict(n=2), "n must be at least 3"),
    (dict(batch=0), "batch"),
    (dict(members=1), "at least 2 members"),
    (dict(ensemble_sequences=5, batch=4), "ensemble sequences"),
    (dict(long_run=0.0), "--long-run"),
])
def test_bad_inputs(kw, message):
    with pytest.raises(AOGPTError, match=message):
        bench_eval(size=TINY, **kw)
