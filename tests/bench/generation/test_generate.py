"""`aogpt.bench.generation.generate`: every method runs, does the work it claims (forward counts), and the reported
ratios are those of the medians."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import torch

from aogpt.bench.generation.generate import METHODS, bench_generate, bench_lengths, check_methods, resolve_steps
from aogpt.bench.generation.generate_report import ratios
from aogpt.errors import AOGPTError
from tests.bench import TINY
from tests.helpers import needs_bf16


def test_generate_runs_every_method_and_writes_table_json_png(tmp_path):
    res = bench_generate(n=12, batch=2, steps=[3, 12], size=TINY, methods=list(METHODS), repeats=2, out=tmp_path,
                         count_flops=False)
    assert set(res["seconds"]) == set(METHODS) and not res["skipped"]
    for m in METHODS:  # left-to-right models always take n steps
        assert set(res["seconds"][m]) == ({"3", "12"} if METHODS[m].every_t else {"12"})
    for m in (m for m in METHODS if METHODS[m].every_t):
        assert all(len(r) == 2 for r in res["runs"][m].values())  # repeats, median of them
    f = res["forwards"]
    assert f["gpt"]["12"] == 12 and f["aogpt-count"]["3"] == 3 and f["encoder-noskip"]["12"] == 12
    assert f["encoder"]["12"] <= 12 and f["aogpt"]["12"] <= 12
    # the work claimed: one token per step is one slot per step; Lemma 4.1 packs, so no padding slots
    # reach the linear layers, and the cache is never recomputed (at most 2n slots per sequence)
    assert res["slots"]["aogpt-count"]["12"] == 2 * 12 and res["padded_slots"]["aogpt-count"]["12"] == 0
    assert res["slots"]["aogpt"]["12"] <= 2 * 2 * 12 <= res["slots"]["aogpt-nocache"]["12"]
    assert res["padded_slots"]["aogpt"]["3"] == res["padded_slots"]["aogpt"]["12"] == 0  # ragged steps: no padding
    r = res["ratios"]["12"]
    assert math.isclose(r["encoder/aogpt"], res["seconds"]["encoder"]["12"] / res["seconds"]["aogpt"]["12"])
    assert math.isclose(res["ratios"]["n"]["aogpt/gpt"], res["seconds"]["aogpt"]["12"] / res["seconds"]["gpt"]["12"])
    assert math.isclose(res["cpu_ratios"]["n"]["aogpt/hf-gpt2"],
                        res["cpu_seconds"]["aogpt"]["12"] / res["cpu_seconds"]["hf-gpt2"]["12"])
    est = res["runs"]["encoder-est"]  # T x one timed pass: the median of the scaled runs
    assert res["seconds"]["encoder-est"]["3"] == statistics.median(est["3"]) > 0
    md = (tmp_path / "generate.md").read_text()
    assert "| 12 |" in md and "What this run shows:" in md and "estimated as T x one timed pass" in md
    assert "issue" not in md.lower() and "NOT met" not in md
    saved = json.loads((tmp_path / "generate.json").read_text())
    assert saved["seconds"] == res["seconds"]
    assert (tmp_path / "generate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_transformers_is_said_not_hidden(monkeypatch):
    from aogpt.bench.generation import hf_gpt2

    monkeypatch.setattr(hf_gpt2, "available", lambda: False)
    res = bench_generate(n=8, batch=1, steps=[8], size=TINY, methods=["gpt", "hf-gpt2"], repeats=1,
                         memory_buffer=8 * 2 ** 20)
    assert res["methods"] == ["gpt"] and "transformers" in res["skipped"]["hf-gpt2"]


def test_skip_and_noskip_encoders_generate_the_same_samples():
    """The two encoder contenders do the same work apart from skipped forwards (same samples)."""
    from aogpt.bench.common import build_model
    from aogpt.generation.generate import generate

    model = build_model("encoder-mdm", TINY, 16, torch.device("cpu"), seed=0)
    a = generate(model, num_samples=3, length=16, steps=16, batch_size=1, seed=3, **METHODS["encoder"].settings)
    b = generate(model, num_samples=3, length=16, steps=16, batch_size=1, seed=3, skip_noop=False,
                 **METHODS["encoder-noskip"].settings)
    assert torch.equal(a.tokens, b.tokens)
    assert a.timing["forwards"] < b.timing["forwards"] == 48


def test_bad_inputs():
    with pytest.raises(AOGPTError, match="steps"):
        bench_generate(n=8, steps=[16], size=TINY)
    with pytest.raises(AOGPTError, match="unknown method"):
        check_methods(["aogpt", "sedd"])


def test_ratios_of_the_medians():
    fake = {"steps": [4], "n": 4, "seconds": {"aogpt": {"4": 2.0}, "encoder": {"4": 50.0}, "gpt": {"4": 1.0}}}
    r = ratios(fake)
    assert r["4"]["encoder/aogpt"] == 25.0 and r["n"]["aogpt/gpt"] == 2.0 and r["4"]["aogpt-nocache/aogpt"] is None


@needs_bf16
def test_precisions_side_by_side(tmp_path):
    from aogpt.bench.generation.generate import bench_generate

    res = bench_generate(n=6, batch=2, steps=[3], size=TINY, methods=["aogpt", "gpt"], repeats=1,
                         dtypes="fp32,bf16", out=tmp_path, count_flops=False)
    assert res["dtypes"] == ["fp32", "bf16"] and set(res["by_dtype"]) == {"fp32", "bf16"}
    assert res["by_dtype"]["bf16"]["precision"] == "bf16" and res["by_dtype"]["fp32"]["precision"] == "fp32"
    fp32, bf16 = res["by_dtype"]["fp32"]["seconds"], res["by_dtype"]["bf16"]["seconds"]
    assert res["dtype_ratios"]["bf16"]["aogpt"]["3"] == pytest.approx(bf16["aogpt"]["3"] / fp32["aogpt"]["3"])
    assert res["by_dtype"]["bf16"]["slots"] == res["by_dtype"]["fp32"]["slots"]  # the same plan, other precision
    text = (tmp_path / "generate.md").read_text()
    assert "bf16 ÷ fp32" in text and "## In bf16" in text


def test_steps_relative_to_n():
    assert resolve_steps(["n", "n/8", "3"], 64) == [3, 8, 64] and resolve_steps(["n/8"], 4) == [1]
    for bad in ("0", "n/0", "x", "n/"):
        with pytest.raises(AOGPTError, match="bad steps list"):
            resolve_steps([bad], 16)


def test_several_lengths_per_step_times_and_flops(tmp_path):
    """Two lengths in one report; milliseconds per step are the medians over the forwards; the
    estimated encoder's FLOPs are T x one pass's, checked against the products counted by hand."""
    res = bench_lengths([4, 8], ["n", "n/4"], batch=2, size=TINY, methods=["aogpt", "encoder", "gpt"], repeats=1,
                        encoder_limit=0.0, dtypes=["fp32"], out=tmp_path,
                        memory_buffer=8 * 2 ** 20)
    assert res["lengths"] == [4, 8] and set(res["by_n"]) == {"4", "8"}
    for n in (4, 8):
        r = res["by_n"][str(n)]
        assert r["steps"] == [n // 4, n] and r["encoder_estimated"] == {"encoder": [n // 4, n]}
        assert "encoder" not in r["seconds"] or not r["seconds"]["encoder"]
        for m, T in (("aogpt", n), ("aogpt", n // 4), ("gpt", n)):
            assert math.isclose(r["ms_per_step"][m][str(T)], r["seconds"][m][str(T)] / r["forwards"][m][str(T)] * 1e3)
            assert math.isclose(r["mfu"][m][str(T)],
                                r["flops"][m][str(T)] / r["seconds"][m][str(T)] / r["matmul_rate"]["best"])
        B, d, V, L = 2, TINY.n_embd, TINY.vocab_size, TINY.n_layer
        for T in (n, n // 4):  # one full pass: q/k/v, out, MLP, attention's two products, the head on ceil(n/T)
            trunk = 2 * B * n * L * (3 * d * d + d * d + 8 * d * d) + 4 * B * n * n * d * L
            one = trunk + 2 * B * math.ceil(n / T) * d * V
            assert r["flops"]["encoder-est"][str(T)] == T * one
    md = (tmp_path / "generate.md").read_text()
    assert "## n = 4" in md and "## n = 8" in md and "ms per step" in md and "(est.)" in md


@needs_bf16
def test_the_encoder_run_in_one_precision_and_estimated_in_another(tmp_path, monkeypatch):
    """Past `encoder_limit` the encoder is estimated per precision: a fast bf16 pass may run where fp32
    is estimated. The report keeps each precision's figures and compares only what both have."""
    import aogpt.bench.generation.generate as bg

    real = bg._estimate_slow_encoder

    def fp32_estimated(keys, one_pass, dev, limit):  # as if only fp32's pass were over the limit
        out, _ = real(keys, one_pass, dev, float("inf"))
        out = [("encoder-est", T, d) if (m, d) == ("encoder", "fp32") else (m, T, d) for m, T, d in out]
        return out, {"encoder": [T for m, T, d in out if m == "encoder-est"]}

    monkeypatch.setattr(bg, "_estimate_slow_encoder", fp32_estimated)
    res = bench_generate(n=6, batch=2, steps=[3], size=TINY, methods=["aogpt", "encoder"], repeats=1,
                         dtypes="fp32,bf16", encoder_limit=1.0, out=tmp_path, count_flops=False)
    assert "3" in res["by_dtype"]["bf16"]["seconds"]["encoder"]
    assert "3" not in res["by_dtype"]["fp32"]["seconds"]["encoder"]
    assert "3" not in res["dtype_ratios"]["bf16"]["encoder"] and "3" in res["dtype_ratios"]["bf16"]["aogpt"]
    assert "## In bf16" in (tmp_path / "generate.md").read_text()
