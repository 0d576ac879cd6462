"""`aogpt.bench.train_step`: the real training step of every variant is timed."""

from __future__ import annotations

import math

import pytest

from aogpt.bench.train_step import bench_train
from aogpt.errors import AOGPTError
from tests.bench import TINY


def test_train_times_the_real_step_of_every_variant(tmp_path):
    res = bench_train(block=8, batch=2, size=TINY, steps=2, warmup=1, out=tmp_path)
    assert res["variants"] == ["gpt", "sigma", "aogpt", "encoder-mdm"]
    assert res["ratio_to_gpt"]["gpt"] == 1.0
    assert all(len(r) == 2 for r in res["runs"].values())
    assert all(math.isfinite(v) for v in res["last_loss"].values())
    assert res["tokens_per_second"]["aogpt"] == pytest.approx(16 / res["seconds_per_step"]["aogpt"])
    assert "paper code" not in (tmp_path / "train.md").read_text()  # no figures measured elsewhere


def test_bad_inputs():
    with pytest.raises(AOGPTError, match="unknown variant"):
        bench_train(variants=["bert"], size=TINY)
