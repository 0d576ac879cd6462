"""`aogpt.kv_cache`: a ragged step's attention, bucketed by width, against attention computed row by
row in float64 from the definition."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aogpt.kv_cache import KVCache, ragged_rows


@pytest.mark.parametrize("B", [6, 64])  # runs of consecutive sequences (views); a large batch: one call per width
def test_ragged_attention_is_each_rows_own_attention_without_padding(B):
    gen = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    H, D, cap = 2, 8, 20
    decided = rng.integers(3, 12, size=B)
    first = decided - rng.integers(0, 3, size=B)  # catch-ups: decided columns not cached yet
    sizes = np.where(rng.random(B) < 0.8, decided - first + rng.integers(1, 4, size=B), 0)
    sizes[0] = sizes[0] or 2  # at least one sequence takes part
    b, col, where = ragged_rows(sizes, first, decided, torch.float64, torch.device("cpu"))
    R = len(b)
    assert R == sizes.sum() and sum(bk.count * bk.width for bk in where.buckets) == R  # no padding row
    for bk in where.buckets:  # sequences of one width: a run of consecutive ones, or all of that width
        seqs = np.arange(bk.seqs.start, bk.seqs.stop) if isinstance(bk.seqs, slice) else bk.seqs.numpy()
        assert len(seqs) == bk.count and (sizes[seqs] == bk.width).all()
    widths = len(np.unique(sizes[sizes > 0]))
    assert len(where.buckets) >= widths
    if B == 64:  # gathered per width instead of dozens of one-sequence runs
        assert len(where.buckets) == widths and any(not isinstance(bk.seqs, slice) for bk in where.buckets)
    cache = KVCache(1, B, H, cap, D, "cpu", torch.float64, attention="sdpa")
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    old_k, old_v = cache.k[0].clone(), cache.v[0].clone()
    q, k, v = (torch.randn(1, H, R, D, generator=gen, dtype=torch.float64) for _ in range(3))
    out = cache.attend(0, q, k, v, where, None)
    keys, values = old_k.clone(), old_v.clone()
    keys[b, :, col] = k[0].transpose(0, 1)
    values[b, :, col] = v[0].transpose(0, 1)
    assert torch.equal(cache.k[0], keys) and torch.equal(cache.v[0], values)
    for r in range(R):  # row r sees its sequence's decided columns up to itself, and itself
        c = np.arange(cap)
        seen = torch.from_numpy(((c < decided[b[r]]) & (c <= col[r])) | (c == col[r]))
        kk, vv = keys[b[r]][:, seen], values[b[r]][:, seen]
        w = torch.softmax(q[0, :, r:r + 1] @ kk.transpose(-1, -2) / D ** 0.5, dim=-1)
        torch.testing.assert_close(out[0, :, r], (w @ vv)[:, 0])


def test_a_bf16_model_attends_over_a_float32_cache():
    """On the CPU a bf16 model's keys are kept (exactly) in float32 and attention runs there; the
    output comes back in bf16, equal to attention computed in float64 on the same bf16 inputs."""
    gen = torch.Generator().manual_seed(1)
    B, H, S, D, cap = 2, 2, 3, 8, 6
    cache = KVCache(1, B, H, cap, D, "cpu", torch.bfloat16, attention="auto")
    assert cache.k.dtype == torch.float32
    q, k, v = (torch.randn(B, H, S, D, generator=gen).to(torch.bfloat16) for _ in range(3))
    out = cache.attend(0, q, k, v, 0, None)
    assert out.dtype == torch.bfloat16 and torch.equal(cache.k[0, :, :, :S], k.float())
    ref = torch.softmax(q.double() @ k.double().transpose(-1, -2) / D ** 0.5, dim=-1) @ v.double()  # no mask: all
    torch.testing.assert_close(out.double(), ref, atol=1e-2, rtol=1e-2)
