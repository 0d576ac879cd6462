"""The shared parts of a step, against each request's own computation: the stacked attention
(`StackedCaches.attend_rows`) against every call's `KVCache.attend_rows` alone, and the step's
draws (`draw_together`) against every call's `sample_tokens` alone, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aogpt.decode.layouts import ragged_rows
from aogpt.kv_cache import KVCache, additive, step_mask
from aogpt.sampling import SamplingConfig, sample_tokens
from aogpt.serve.batching import DrawCall, ForwardCall, StackedCaches, draw_together

H, D, CAP = 3, 8, 24


def cache(batch: int, kernel: str, seed: int) -> KVCache:
    c = KVCache(2, batch, H, CAP, D, torch.device("cpu"), torch.float32, None, kernel, torch.float32)
    c.kv.copy_(torch.randn(c.kv.shape, generator=torch.Generator().manual_seed(seed)))
    return c


def calls(kernel: str) -> list[ForwardCall]:
    """One-sequence calls at consecutive columns (with and without a mask), a two-sequence block and
    a packed ragged step: the usual calls and those that take `KVCache.attend_rows` as it is."""
    out = []
    for i, (start, decided, k) in enumerate([(5, 6, 1), (9, 10, 2), (3, 3, 1), (0, 0, 3)]):
        S = decided - start + k
        cols = torch.arange(start, start + S)
        mask = None if S == 1 else additive(step_mask(cols, decided, start + S)[None, None], torch.float32)
        out.append(ForwardCall(torch.zeros(1, S, dtype=torch.long), cols[None], None, mask, cache(1, kernel, i),
                               start, None))
    block = additive(step_mask(torch.arange(4, 6), 5, 6)[None, None], torch.float32)
    out.append(ForwardCall(torch.zeros(2, 2, dtype=torch.long), None, None, block, cache(2, kernel, 7), 4, None))
    b, col, where = ragged_rows(np.array([2, 0, 1]), np.array([6, 6, 6]), np.array([7, 6, 6]), torch.float32,
                                torch.device("cpu"))
    out.append(ForwardCall(torch.zeros(1, len(b), dtype=torch.long), None, None, None, cache(3, kernel, 8), where,
                           None))
    return out


@pytest.mark.parametrize("kernel", ["sdpa", "matmul"])
def test_stacked_attention_is_each_calls_own(kernel):
    mine, theirs = calls(kernel), calls(kernel)
    R = sum(c.shape[0] * c.shape[1] for c in mine)
    qkv = torch.randn(R, 3, H, D, generator=torch.Generator().manual_seed(1))
    for layer in (0, 1):
        got = StackedCaches(mine, None).attend_rows(layer, qkv, 0, None, D ** -0.5)
        want, start = [], 0
        for c in theirs:
            rows = c.shape[0] * c.shape[1]
            want.append(c.cache.attend_rows(layer, qkv[start:start + rows], c.cache_pos, c.attn_mask, D ** -0.5))
            start += rows
        assert torch.equal(got, torch.cat(want))
    for a, b in zip(mine, theirs, strict=True):  # the same keys and values written
        assert torch.equal(a.cache.kv, b.cache.kv)


CONFIGS = [SamplingConfig(), SamplingConfig(temperature=0.7, top_p=0.9), SamplingConfig(top_k=5),
           SamplingConfig(greedy=True), SamplingConfig(dtype=torch.float32, top_p=0.5)]


def test_a_steps_draws_together_are_each_draw_alone():
    gen = torch.Generator().manual_seed(0)
    draws = []
    for i in range(14):
        cfg = CONFIGS[i % len(CONFIGS)]
        rows, vocab = (0, 1, 2, 3)[i % 4], 40 if i % 3 else 700  # 700: the two-level inversion
        logits = torch.randn(rows, vocab, generator=gen) * 3
        if i == 5 and rows:
            logits[:, :4] = 2.5  # ties at the nucleus' edge
        u = None if cfg.greedy else torch.rand(rows, 1, dtype=torch.float64, generator=gen).to(cfg.dtype)
        draws.append(DrawCall(logits, cfg, u))
    got = draw_together(draws)
    for call, tokens in zip(draws, got, strict=True):
        assert torch.equal(tokens, sample_tokens(call.logits, call.cfg, uniforms=call.uniforms))
    assert sum(len(t) for t in got) == sum(c.logits.shape[0] for c in draws)


def test_a_failing_draw_fails_its_own_group_only():
    good = DrawCall(torch.randn(2, 10), SamplingConfig(), torch.rand(2, 1, dtype=torch.float64))
    bad = [DrawCall(torch.randn(2, 10), SamplingConfig(top_k=3), torch.rand(3, 1, dtype=torch.float64)),
           DrawCall(torch.randn(1, 10), SamplingConfig(top_k=3), torch.rand(1, 1, dtype=torch.float64))]
    out = draw_together([bad[0], good, bad[1]])
    assert isinstance(out[0], Exception) and out[0] is out[2]
    assert torch.equal(out[1], sample_tokens(good.logits, good.cfg, uniforms=good.uniforms))
