"""Token-level sampling rules against brute force and the reference top-p vectors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from aogpt import sampling
from aogpt.errors import AOGPTError
from aogpt.sampling import SamplingConfig, categorical, probabilities, sample_tokens, top_k_filter, top_p_mask
from tests.helpers import reference_expected


def top_p_filter(probs: torch.Tensor, p: float, use_numpy: bool | None = None) -> torch.Tensor:
    """The reference top-p rule on probabilities: the kept ones, renormalised."""
    out = probs * top_p_mask(probs, p, use_numpy)
    return out / out.sum(dim=-1, keepdim=True)


def test_top_p_matches_reference_vectors():
    exp = reference_expected()
    probs_in = torch.from_numpy(exp["topp_probs_in_f32"])  # already at temperature 0.9
    want = torch.from_numpy(exp["topp_probs_filtered_f32"])
    got = top_p_filter(probs_in, float(exp["topp_p"]))
    torch.testing.assert_close(got, want, atol=1e-7, rtol=0)
    assert torch.equal(got > 0, want > 0) and (got == 0).any()  # the rule really dropped tokens here
    # in float64 the same tokens survive
    got64 = top_p_filter(probs_in.double(), float(exp["topp_p"]))
    assert torch.equal(got64 > 0, want > 0)


def brute_top_p(p: np.ndarray, top_p: float) -> np.ndarray:
    """Loop over tokens from the most likely: keep while the running sum (this token included) <= top_p."""
    if top_p >= 1.0:  # disabled
        return p
    out = np.zeros_like(p)
    total = 0.0
    for rank, i in enumerate(np.argsort(-p, kind="stable")):
        total += p[i]
        if rank == 0 or total <= top_p:
            out[i] = p[i]
    return out / out.sum()


def brute_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float, limit: int) -> np.ndarray:
    z = logits[:limit] / temperature
    if top_k:
        kth = np.sort(z)[::-1][top_k - 1]
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max())
    return brute_top_p(p / p.sum(), top_p)


@pytest.mark.parametrize("temperature,top_k,top_p,limit", [
    (1.0, 0, 1.0, 12), (0.7, 0, 1.0, 12), (1.3, 5, 1.0, 12), (0.9, 0, 0.8, 12), (0.8, 6, 0.7, 10), (2.0, 3, 0.1, 9),
])
def test_probabilities_equal_brute_force(temperature, top_k, top_p, limit):
    logits = torch.randn(7, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    cfg = SamplingConfig(temperature, top_p, top_k, vocab_limit=limit).validate()
    got = probabilities(logits, cfg).numpy()
    assert got.shape == (7, limit)
    for row, lg in zip(got, logits.numpy(), strict=True):
        np.testing.assert_allclose(row, brute_probs(lg, temperature, top_k, top_p, limit), atol=1e-12)


def test_draws_follow_the_filtered_distribution():
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.2, -0.5, 3.0, 0.0, -1.0]], dtype=torch.float64)
    cfg = SamplingConfig(temperature=0.8, top_p=0.9, top_k=6, vocab_limit=7).validate()
    N = 40000
    gen = torch.Generator().manual_seed(4)
    draws = sample_tokens(logits.expand(N, 8), cfg, gen).numpy()
    p = brute_probs(logits[0].numpy(), 0.8, 6, 0.9, 7)
    observed = np.bincount(draws, minlength=7)
    keep = p > 0
    assert observed[~keep].sum() == 0  # truncated and padding ids never appear
    assert stats.chisquare(observed[keep], p[keep] * N).pvalue > 1e-3
    # and the test has power: the unfiltered softmax is rejected
    q = torch.softmax(logits[0, :7], -1).numpy()
    assert stats.chisquare(observed[keep], q[keep] / q[keep].sum() * N).pvalue < 1e-6


def test_greedy_is_argmax_within_the_real_vocabulary():
    logits = torch.randn(50, 20, generator=torch.Generator().manual_seed(1))
    logits[:, 17] = 100.0  # a padding id with the largest logit is still never chosen
    cfg = SamplingConfig(greedy=True, temperature=0.5, top_p=0.5, vocab_limit=16).validate()
    assert torch.equal(sample_tokens(logits, cfg), logits[:, :16].argmax(-1))


def test_float64_draw_is_seeded_and_empty_batches_work():
    logits = torch.randn(5, 9, generator=torch.Generator().manual_seed(2))
    cfg = SamplingConfig().validate()
    a = sample_tokens(logits, cfg, torch.Generator().manual_seed(7))
    b = sample_tokens(logits, cfg, torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and a.dtype == torch.long
    assert probabilities(logits, cfg).dtype == torch.float64
    assert sample_tokens(logits[:0], cfg).shape == (0,)


def test_top_k_keeps_ties_and_k_largest():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, 0.0]])
    assert torch.isinf(top_k_filter(logits, 2)).tolist() == [[True, False, False, True, True]]
    assert torch.equal(top_k_filter(logits, 0), logits)


@pytest.mark.parametrize("kw,match", [
    (dict(temperature=0.0), "temperature"), (dict(temperature=-2.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.01), "top_p"),
    (dict(top_k=-1), "top_k"), (dict(dtype=torch.float16), "dtype"), (dict(vocab_limit=0), "vocab_limit"),
])
def test_bad_sampling_settings(kw, match):
    with pytest.raises(AOGPTError, match=match):
        SamplingConfig(**kw).validate()


@pytest.mark.parametrize("numpy_sort", [True, False])
@pytest.mark.parametrize("vocab,partial", [(50, 64), (200, 16), (200, 2)])
def test_top_p_mask_brute_force_and_ties(monkeypatch, numpy_sort, vocab, partial):
    """Both code paths (numpy on the CPU, torch elsewhere), with the partial sort covering the nucleus
    or not (rows sorted whole), against the brute-force rule."""
    monkeypatch.setattr(sampling, "PARTIAL", partial)
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        logits = torch.randn(4, vocab, generator=gen, dtype=torch.float64) * 3
        logits[:, 10:14] = logits[:, 10:11]  # exact ties
        probs = torch.softmax(logits, -1)
        for p in (0.05, 0.5, 0.9, 0.999):
            got = top_p_filter(probs, p, numpy_sort).numpy()
            for row, pr in zip(got, probs.numpy(), strict=True):
                np.testing.assert_allclose(row, brute_top_p(pr, p), atol=1e-14)
    tied = torch.tensor([[0.3, 0.3, 0.3, 0.1]], dtype=torch.float64)
    assert (top_p_filter(tied, 0.65, numpy_sort) > 0).tolist() == [[True, True, False, False]]  # lowest ids win


def test_categorical_never_draws_zero_weights():
    w = torch.tensor([[0.0, 2.0, 0.0, 1.0, 0.0, 0.0]], dtype=torch.float64).expand(30000, 6)
    draws = categorical(w, torch.Generator().manual_seed(0))
    counts = np.bincount(draws.numpy(), minlength=6)
    assert counts[[0, 2, 4, 5]].sum() == 0
    assert stats.chisquare(counts[[1, 3]], [20000, 10000]).pvalue > 1e-3


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_two_level_inversion_draws_the_exact_law(dtype):
    """A vocabulary past 2 x BLOCK is inverted block by block: zero-weight tokens (a whole zero block,
    zeros at block edges, a ragged last block) are never drawn and the rest follow their weights."""
    from aogpt.sampling import BLOCK

    V, N = 3 * BLOCK + 17, 12000
    hot = np.array([0, 5, BLOCK - 1, BLOCK + 3, 3 * BLOCK + 16])  # block 2 is all zero
    w = torch.zeros(V, dtype=dtype)
    w[hot] = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=dtype)
    draws = categorical(w.expand(N, V), torch.Generator().manual_seed(1), torch.float64)
    counts = np.bincount(draws.numpy(), minlength=V)
    assert counts.sum() == N and counts[np.setdiff1d(np.arange(V), hot)].sum() == 0
    law = w[hot].double().numpy() / float(w.sum())
    assert stats.chisquare(counts[hot], N * law).pvalue > 1e-3
    assert stats.chisquare(counts[hot], N * np.roll(law, 1)).pvalue < 1e-6  # the test has power
