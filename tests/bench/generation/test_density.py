"""`aogpt.bench.generation.density`: the contenders score the same sequences exactly; checkpoints must match
the size."""

from __future__ import annotations

import math

import pytest
import torch

from aogpt.bench.common import QUICK_SIZE, build_model
from aogpt.bench.generation.density import bench_density
from aogpt.checkpoint import save_checkpoint
from aogpt.config import to_dict
from aogpt.errors import AOGPTError
from tests.bench import TINY


def test_density_scores_the_same_sequences_exactly(tmp_path):
    res = bench_density(n=10, batch=2, size=TINY, repeats=1, out=tmp_path)
    assert res["forwards_per_sequence"] == {"aogpt": 1, "gpt": 1, "encoder-mdm": 10}
    # untrained models over 32 tokens: every exact NLL per token is near log(32)
    assert all(abs(v - math.log(32)) < 0.5 for v in res["nll_per_token"].values())
    assert math.isclose(res["ratios"]["encoder-mdm/aogpt"],
                        res["seconds"]["encoder-mdm"] / res["seconds"]["aogpt"])
    assert "encoder-only MDM (10 passes" in (tmp_path / "density.md").read_text()


def test_checkpoints_are_timed_and_must_match_the_size(tmp_path):
    model = build_model("aogpt", TINY, 12, torch.device("cpu"), seed=1)
    save_checkpoint(tmp_path / "ao", model, config={"model": to_dict(model.config)})
    res = bench_density(n=12, batch=1, repeats=1, checkpoints={"aogpt": tmp_path / "ao"})
    assert res["size"] == TINY.to_dict()  # the checkpoint's size is used for every contender
    with pytest.raises(AOGPTError, match="unequal size"):
        bench_density(n=12, batch=1, repeats=1, size=QUICK_SIZE, checkpoints={"aogpt": tmp_path / "ao"})
    with pytest.raises(AOGPTError, match="holds a aogpt model"):
        bench_density(n=12, batch=1, repeats=1, checkpoints={"gpt": tmp_path / "ao"})
    with pytest.raises(AOGPTError, match="context"):
        bench_density(n=20, batch=1, repeats=1, checkpoints={"aogpt": tmp_path / "ao"})


def test_bad_inputs():
    with pytest.raises(AOGPTError, match="positive"):
        bench_density(n=0, size=TINY)
