"""`aogpt.bench.roofline` and `aogpt.bench.limits.memory_bandwidth`: bytes per step counted by hand,
the roofline as the larger of its two terms, and the read rate of buffers of several sizes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from aogpt.bench.generation.generate import bench_generate
from aogpt.bench.limits import memory_bandwidth, rate_at
from aogpt.bench.roofline import StepBytes, cache_read_columns, decode_weight_bytes, decoder_bytes, roofline
from aogpt.config import model_config
from aogpt.model import Transformer
from tests.bench import TINY


def test_cache_columns_counted_by_hand():
    # two sequences, three steps: (2, 0, 1) and (1, 1, 1); a sequence revealing nothing sits the step out
    counts = np.array([[2, 0, 1], [1, 1, 1]])
    columns, forwards = cache_read_columns(counts)
    # seq 0: step 0 g=0 k=2 -> 2 columns; step 2 g=2 k=1 -> 3; seq 1: 1, 2, 3
    assert columns == 2 + 3 + 1 + 2 + 3 and forwards == 3
    assert cache_read_columns(np.ones((3, 4)))[0] == 3 * (1 + 2 + 3 + 4)  # one per step: t + 1 columns


def test_decoder_bytes_of_a_gpt_step():
    cfg = model_config("gpt", n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=32)
    model = Transformer(cfg)
    B, n = 3, 8
    counts = np.ones((B, n), dtype=np.int64)
    got = decoder_bytes(model, torch.float32, counts, n, B * n, B * n)
    linear = sum(p.numel() for name, p in model.named_parameters()
                 if any(k in name for k in ("c_attn", "c_proj", "c_fc"))) + model.lm_head.weight.numel()
    assert decode_weight_bytes(model) == 4 * linear
    kv = 2 * 2 * 16 * 4  # keys and values, two layers, width 16, float32
    assert got.weights == 4 * linear + 2 * 16 * 4 * B  # + token and position rows of the step's B slots
    assert got.cache_read == kv * B * sum(range(1, n + 1)) / n and got.cache_written == kv * B
    assert got.logits == 32 * 4 * 2 * B and got.total == got.weights + got.cache_read + got.cache_written + got.logits


def test_roofline_is_the_larger_term():
    step = StepBytes(8e6, 2e6, 0.0, 0.0)
    bw = {"memory": 5e9, "by_bytes": {str(2 ** 20): 20e9, str(2 ** 30): 5e9}}
    low = roofline(step, flops_per_step=1e6, peak=1e11, bandwidth=bw)
    assert low["bound"] == "bytes" and math.isclose(low["limit_s"], 10e6 / 5e9)
    assert low["working_set_s"] < low["memory_s"]  # 10 MB reads faster than the memory's plateau
    high = roofline(step, flops_per_step=1e10, peak=1e11, bandwidth=bw)
    assert high["bound"] == "FLOPs" and math.isclose(high["limit_s"], 0.1)


def test_memory_bandwidth_plateau_and_interpolation():
    bw = memory_bandwidth(repeats=1, largest=8 * 2 ** 20)
    sizes = sorted(int(k) for k in bw["by_bytes"])
    assert sizes == [4 * 2 ** 20, 8 * 2 ** 20] and bw["memory"] == bw["by_bytes"][str(8 * 2 ** 20)] > 0
    lo, hi = bw["by_bytes"][str(sizes[0])], bw["by_bytes"][str(sizes[1])]
    assert rate_at(bw, 1) == lo and rate_at(bw, 2 ** 40) == hi
    assert min(lo, hi) <= rate_at(bw, 6 * 2 ** 20) <= max(lo, hi)


@pytest.mark.parametrize("dtypes", [["fp32"]])
def test_the_benchmark_sets_every_step_against_its_roofline(dtypes):
    res = bench_generate(n=8, batch=2, steps=[8], size=TINY, methods=["aogpt", "gpt", "gpt-reference", "encoder"],
                         repeats=1, dtypes=dtypes, memory_buffer=8 * 2 ** 20)
    bw = res["memory_bandwidth"]
    for m in ("aogpt", "gpt", "gpt-reference", "encoder"):
        x = res["roofline"][m]["8"]
        flops_s = res["flops"][m]["8"] / res["forwards"][m]["8"] / res["matmul_rate"]["best"]
        assert math.isclose(x["limit_s"], max(flops_s, x["bytes"]["total"] / bw["memory"]))
    assert res["roofline"]["encoder"]["8"]["bytes"]["cache_read"] == 0  # no KV cache
    # the reference path reads the same weights; its gpt forwards are the fast path's
    assert res["roofline"]["gpt-reference"]["8"]["bytes"]["weights"] == res["roofline"]["gpt"]["8"]["bytes"]["weights"]
    assert res["ratios"]["n"]["gpt-reference/gpt"] == pytest.approx(res["seconds"]["gpt-reference"]["8"]
                                                                   / res["seconds"]["gpt"]["8"])
