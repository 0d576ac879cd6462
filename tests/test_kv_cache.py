"""`aogpt.kv_cache`: a ragged step's attention, in every layout of `aogpt.decode.layouts`, against
attention computed row by row in float64 from the definition."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aogpt.decode.layouts import Static, padded_steps, ragged_rows, run_steps
from aogpt.kv_cache import KVCache


@pytest.mark.parametrize("B,layout", [(6, "buckets"), (64, "buckets"), (6, "runs"), (40, "runs"),
                                      (6, "padded"), (6, "static")])
def test_ragged_attention_is_each_rows_own_attention(B, layout):
    """Buckets of one width (runs of consecutive sequences, views; a large batch: one call per width,
    gathered), runs padded to their widest, one padded call, and its static form (a sink sequence)."""
    gen = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    H, D, cap = 2, 8, 20
    decided = rng.integers(3, 12, size=B)
    first = decided - rng.integers(0, 3, size=B)  # catch-ups: decided columns not cached yet
    sizes = np.where(rng.random(B) < 0.8, decided - first + rng.integers(1, 4, size=B), 0)
    sizes[0] = sizes[0] or 2  # at least one sequence takes part
    cpu, mask = torch.device("cpu"), None
    if layout == "buckets":
        b, col, where = ragged_rows(sizes, first, decided, torch.float64, cpu)
        assert sum(bk.count * bk.width for bk in where.buckets) == len(b)  # no padding row
        for bk in where.buckets:  # sequences of one width: a run of consecutive ones, or all of that width
            seqs = np.arange(bk.seqs.start, bk.seqs.stop) if isinstance(bk.seqs, slice) else bk.seqs.numpy()
            assert len(seqs) == bk.count and (sizes[seqs] == bk.width).all()
        widths = len(np.unique(sizes[sizes > 0]))
        assert len(where.buckets) >= widths
        if B == 64:  # gathered per width instead of dozens of one-sequence runs
            assert len(where.buckets) == widths and any(not isinstance(bk.seqs, slice) for bk in where.buckets)
    elif layout == "runs":
        b, col, where = run_steps(sizes[None], first[None], decided[None], torch.float64, cpu)[0]
        taking_part = np.flatnonzero(sizes)
        runs = np.split(taking_part, np.flatnonzero(np.diff(taking_part) > 1) + 1)
        assert [(bk.seqs.start, bk.count, bk.width) for bk in where.buckets] == \
            [(r[0], len(r), sizes[r].max()) for r in runs]  # runs of sequences taking part, at their widest
    else:
        static = Static(B, cap) if layout == "static" else None
        b, col, where = padded_steps(sizes[None], first[None], decided[None], cpu, static)[0]
        mask = where.mask(torch.float64)
    R = len(b)
    assert R == sizes.sum() and list(b) == sorted(b) or layout == "buckets"  # sequence-major but by width
    rows = len(where.batch)  # the static form's padding rows too, in the sink sequence
    cache = KVCache(1, B + (layout == "static"), H, cap, D, "cpu", torch.float64, kernel="sdpa")
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    old_k, old_v = cache.k[0].clone(), cache.v[0].clone()
    qkv = torch.randn(rows, 3, H, D, generator=gen, dtype=torch.float64)
    out = cache.attend_rows(0, qkv, where, mask, D ** -0.5).view(rows, H, D)
    keys, values = old_k.clone(), old_v.clone()
    keys[b, :, col] = qkv[:R, 1]
    values[b, :, col] = qkv[:R, 2]
    assert torch.equal(cache.k[0, :B], keys[:B]) and torch.equal(cache.v[0, :B], values[:B])
    for r in range(R):  # row r sees its sequence's decided columns up to itself, and itself
        c = np.arange(cap)
        seen = torch.from_numpy(((c < decided[b[r]]) & (c <= col[r])) | (c == col[r]))
        kk, vv = keys[b[r]][:, seen], values[b[r]][:, seen]
        w = torch.softmax(qkv[r, 0][:, None] @ kk.transpose(-1, -2) / D ** 0.5, dim=-1)
        torch.testing.assert_close(out[r], (w @ vv)[:, 0])


def test_a_bf16_model_attends_over_a_float32_cache():
    """On the CPU a bf16 model's keys are kept (exactly) in float32 and attention runs there; the
    output comes back in bf16, equal to attention computed in float64 on the same bf16 inputs."""
    gen = torch.Generator().manual_seed(1)
    B, H, S, D, cap = 2, 2, 3, 8, 6
    cache = KVCache(1, B, H, cap, D, "cpu", torch.bfloat16)
    assert cache.k.dtype == torch.float32
    qkv = torch.randn(B * S, 3, H, D, generator=gen).to(torch.bfloat16)
    out = cache.attend_rows(0, qkv, 0, None, D ** -0.5)
    q, k, v = (qkv[:, i].view(B, S, H, D).transpose(1, 2) for i in range(3))
    out = out.view(B, S, H, D).transpose(1, 2)
    assert out.dtype == torch.bfloat16 and torch.equal(cache.k[0, :, :, :S], k.float())
    ref = torch.softmax(q.double() @ k.double().transpose(-1, -2) / D ** 0.5, dim=-1) @ v.double()  # no mask: all
    torch.testing.assert_close(out.double(), ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("kernel", ["sdpa", "matmul"])
def test_per_sequence_columns_write_where_they_say_and_attend_under_the_mask(kernel):
    """A (B, S) block whose columns are a tensor (a compiled or captured step's static form): each row
    written at its own column, and attending over the whole cache under the mask it is given."""
    gen = torch.Generator().manual_seed(2)
    B, S, H, D, cap = 3, 2, 2, 4, 7
    cache = KVCache(1, B, H, cap, D, "cpu", torch.float64, kernel=kernel)
    cache.kv.normal_(generator=gen)
    before = cache.kv.clone()
    cols = torch.tensor([[2, 3], [4, 5], [0, 1]])
    qkv = torch.randn(B * S, 3, H, D, generator=gen, dtype=torch.float64)
    seen = torch.arange(cap)[None, None, :] <= cols[:, :, None]  # causal up to each row's own column
    mask = torch.zeros(B, 1, S, cap, dtype=torch.float64).masked_fill_(~seen[:, None], float("-inf"))
    out = cache.attend_rows(0, qkv, cols, mask, 0.5).view(B, S, H, D)
    after = before.clone()
    for b in range(B):
        for s in range(S):
            after[0, 0, b, :, cols[b, s]] = qkv[b * S + s, 1]
            after[0, 1, b, :, cols[b, s]] = qkv[b * S + s, 2]
            keys, values = after[0, 0, b][:, seen[b, s]], after[0, 1, b][:, seen[b, s]]
            w = torch.softmax(0.5 * qkv[b * S + s, 0][:, None] @ keys.transpose(-1, -2), dim=-1)
            torch.testing.assert_close(out[b, s], (w @ values)[:, 0])
    assert torch.equal(cache.kv, after)
