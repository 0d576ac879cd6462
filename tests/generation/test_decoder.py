"""The decoder's plan of uniform steps (every sequence the same rows), built for all steps at once,
against the steps written out one by one from their definition (`aogpt.generation.decoder`'s module
docstring: catch-ups L .. g - 1 and k queries at columns g .. g + k - 1, the mask of `step_mask`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aogpt.generation.decoder import plan_steps
from aogpt.kv_cache import additive, step_mask


def one_by_one(counts: np.ndarray, m: int, pos: torch.Tensor, tgt: torch.Tensor, static: bool) -> list[dict]:
    B, n = pos.shape[0], pos.shape[1] - 1
    L, g, out = 0, m, []
    for k in counts[0]:
        if k == 0:
            continue
        S = g - L + k
        cols = torch.arange(L, L + S)
        content = cols.clamp(max=g)
        b = torch.arange(B)[:, None]
        query = g + torch.arange(k)
        span = n + 1 if static else L + S
        mask = None if S == 1 and not static else additive(step_mask(cols, g, span)[None, None], torch.float32)
        out.append(dict(gather=b * (n + 2) + content, pos=pos[:, content], target=tgt[:, cols],
                        cache_pos=cols.expand(B, S) if static else L, mask=mask,
                        select=None if S == k else (S - k + torch.arange(k)).expand(B, k),
                        dest=(b * (n + 2) + query + 1).reshape(-1), chain_at=(b * n + query).reshape(-1),
                        revealed=B * k, rows=B * S, draws=np.repeat(np.arange(B), k)))
        L, g = g + 1, g + k
    return out


@pytest.mark.parametrize("batch, static", [(1, False), (3, False), (1, True), (2, True)])
def test_uniform_steps_are_the_steps_written_one_by_one(batch, static):
    gen = torch.Generator().manual_seed(batch)
    n, m = 14, 2
    counts = np.tile(np.array([1, 0, 3, 1, 2, 0, 1, 2]), (batch, 1))  # every sequence alike: uniform steps
    chain = torch.stack([torch.randperm(n, generator=gen) for _ in range(batch)])
    pos = torch.cat([torch.zeros_like(chain[:, :1]), chain + 1], dim=1)
    tgt = torch.cat([chain, torch.full_like(chain[:, :1], 20)], dim=1)
    got = plan_steps(counts, m, True, pos, tgt, torch.float32, static)
    want = one_by_one(counts, m, pos, tgt, static)
    assert len(got) == len(want) == 6
    for step, ref in zip(got, want, strict=True):
        for name, value in ref.items():
            mine = getattr(step, name)
            if isinstance(value, torch.Tensor):
                assert mine.shape == value.shape and torch.equal(mine, value), name
            elif isinstance(value, np.ndarray):
                assert np.array_equal(mine, value), name
            else:
                assert mine == value, name
        assert step.padded == 0
