"""`aogpt bench speculative`: its numbers are those of the runs it made, side by side."""

from __future__ import annotations

import json

import pytest
import torch

from aogpt.bench.generation.speculative import bench_speculative
from aogpt.config import model_config
from aogpt.errors import AOGPTError
from aogpt.model import Transformer


def small(variant: str) -> Transformer:
    torch.manual_seed(0)
    extra = {"target_dim": 8} if variant == "aogpt" else {}
    model = Transformer(model_config(variant, n_layer=1, n_head=2, n_embd=16, block_size=12, vocab_size=16, **extra))
    with torch.no_grad():  # peaked conditionals, so drafts are often accepted
        model.lm_head.weight.mul_(20.0)
    return model.eval()


def test_bench_reports_forwards_speedups_and_quality(tmp_path):
    res = bench_speculative(small("aogpt"), gpt=small("gpt"), ns=[8, 12], batches=[1, 2], ks=[2, "auto"],
                            repeats=2, samples=4, out=tmp_path)
    rows = {(r["sampler"], r["n"], r["batch"]): r for r in res["rows"]}
    assert set(rows) == {(s, n, b) for s in ("one-token", "spec-2", "spec-auto", "gpt") for n in (8, 12)
                         for b in (1, 2)}
    one = rows[("one-token", 12, 1)]
    assert one["forwards"] == 12 and one["tokens_per_forward"] == 1.0 and one["speedup_vs_one_token"] == 1.0
    spec = rows[("spec-2", 12, 2)]
    assert 6 <= spec["forwards"] <= 12 and spec["tokens_per_forward"] == pytest.approx(12 / spec["forwards"])
    assert spec["speedup_vs_one_token"] == pytest.approx(rows[("one-token", 12, 2)]["wall"] / spec["wall"])
    assert set(res["quality"]) >= {"one-token", "spec-2", "spec-auto", "evaluator", "n"}
    assert 0.0 <= res["quality"]["spec-2"]["welch_p"] <= 1.0
    md = (tmp_path / "speculative.md").read_text()
    assert "tokens / forward" in md and "Welch" in md
    assert json.loads((tmp_path / "speculative.json").read_text())["ks"] == [2, "auto"]
    assert (tmp_path / "speculative.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_requests():
    with pytest.raises(AOGPTError, match="draft length"):
        bench_speculative(small("aogpt"), ns=[8], batches=[1], ks=["0"], repeats=1, samples=2)
    with pytest.raises(AOGPTError, match="context"):
        bench_speculative(small("aogpt"), ns=[64], batches=[1], ks=[2], repeats=1, samples=2)
    with pytest.raises(AOGPTError, match="cannot draft"):
        bench_speculative(small("gpt"), ns=[8], batches=[1], ks=[2], repeats=1, samples=2)


def test_without_a_gpt_checkpoint_a_random_gpt_of_the_same_size_is_timed():
    """GPT's time does not depend on its weights (n one-slot steps), so without a trained GPT the
    benchmark times one with random weights at the AO-GPT's size, and says so."""
    res = bench_speculative(small("aogpt"), ns=[8], batches=[1], ks=[2], repeats=1, samples=2)
    gpt_rows = [r for r in res["rows"] if r["sampler"] == "gpt"]
    assert len(gpt_rows) == 1 and gpt_rows[0]["forwards"] == 8 and res["gpt_weights"] == "random weights, same size"
    assert res["quality"]["evaluator"] == "the AO-GPT itself (left to right)"
    spec = next(r for r in res["rows"] if r["sampler"] == "spec-2")
    assert spec["time_vs_gpt"] == pytest.approx(spec["wall"] / gpt_rows[0]["wall"])
