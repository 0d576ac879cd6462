"""`aogpt.bench.training.train_step`: the real training step of every variant is timed."""

from __future__ import annotations

import math

import pytest

from aogpt.bench.training.train_step import bench_train
from aogpt.errors import AOGPTError
from tests.bench import TINY
from tests.helpers import needs_bf16


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


@needs_bf16
def test_precisions_side_by_side(tmp_path):
    res = bench_train(block=8, batch=2, size=TINY, steps=1, warmup=0, variants=["gpt", "aogpt"],
                      dtypes="fp32,bf16", profile=True, out=tmp_path)
    assert res["contenders"] == ["gpt/fp32", "aogpt/fp32", "gpt/bf16", "aogpt/bf16"]
    assert res["ratio_to_gpt"]["gpt/bf16"] == 1.0 and res["speedup_over_first"]["aogpt/fp32"] == 1.0
    assert res["speedup_over_first"]["aogpt/bf16"] == pytest.approx(
        res["seconds_per_step"]["aogpt/fp32"] / res["seconds_per_step"]["aogpt/bf16"])
    assert res["precision"]["bf16"]["name"] == "bf16" and len(res["targets"]) == 2
    shares = res["profile"]["aogpt/bf16"]["share"]
    assert sum(shares.values()) == pytest.approx(1.0) and shares["matmul"] > 0
    assert "| matmul |" in (tmp_path / "train.md").read_text()
    with pytest.raises(AOGPTError, match="unknown precision"):
        bench_train(size=TINY, dtypes="int8")


def test_profiling_a_step_writes_nothing_to_stderr(capfd):
    import torch

    from aogpt.bench.training.train_profile import profile_step

    result = profile_step(lambda: torch.randn(16, 16) @ torch.randn(16, 16))
    assert result["total"] > 0
    assert capfd.readouterr().err == ""  # the profiler's native start/stop lines are not shown
