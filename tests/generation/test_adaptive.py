"""Adaptive orders (confidence, margin, entropy) against an independent recomputation.

The reference decoder `recompute` below knows nothing of the KV cache, packing or the samplers: at
every step it asks `aogpt.conditional_logprobs` for every remaining position given the chain
decided so far (one plain forward), scores them with numpy, takes the best, and draws the tokens
with the same token rule and generator. The generator's orders, tokens and recorded logits must
equal it, for decoders and the encoder, with prompts, blanks, batches, several positions per step,
Bernoulli counts, a threshold, top-p and temperature.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from aogpt.errors import AOGPTError
from aogpt.evaluation.evaluate import conditional_logprobs
from aogpt.generation.adaptive import candidate_scores, choose
from aogpt.generation.generate import generate, infill
from aogpt.generation.streams import SequenceStreams
from aogpt.orders import ADAPTIVE, make_order_sampler
from aogpt.sampling import SamplingConfig, sample_tokens
from tests.generation.test_generate import tiny_model

N = 9


def numpy_scores(logp: np.ndarray, policy: str) -> tuple[np.ndarray, np.ndarray]:
    """The three policies written out by hand from log-probabilities (R, V)."""
    p = np.exp(logp)
    top = -np.sort(-p, axis=1)
    if policy == "confidence":
        return top[:, 0], top[:, 0]
    if policy == "margin":
        return top[:, 0] - top[:, 1], top[:, 0]
    return (p * np.where(p > 0, logp, 0.0)).sum(1), top[:, 0]  # minus the entropy


def recompute(model, res, policy: str, cfg: SamplingConfig, seed: int, threshold: float | None = None):
    """(orders, tokens) the adaptive policy gives when every step is recomputed from scratch: same
    step counts planned (`res.step_counts` as floors), each token drawn from its sequence's own stream,
    best first."""
    B, n = res.tokens.shape
    streams = SequenceStreams(seed, 0, B)
    m = int(res.known.sum())
    orders = [list(res.orders[b, :m].tolist()) for b in range(B)]
    tokens = torch.full((B, n), -1, dtype=torch.long)
    tokens[:, res.known] = res.tokens[:, res.known]
    for t in range(res.step_counts.shape[1]):
        rows, where = [], []
        for b in range(B):
            left = sorted(set(range(n)) - set(orders[b]))
            if not left or res.step_counts[b, t] == 0:
                continue
            lp = conditional_logprobs(model, tokens[b].clamp(min=0), torch.tensor(orders[b], dtype=torch.long),
                                      torch.tensor(left))
            score, conf = numpy_scores(lp.numpy(), policy)
            rank = sorted(range(len(left)), key=lambda j: (-score[j], left[j]))  # ties: lowest position
            k = int(res.step_counts[b, t]) if threshold is None else 1
            pick = [j for r, j in enumerate(rank) if r < k or (threshold is not None and conf[j] >= threshold)]
            for j in pick:
                rows.append(lp[j])
                where.append((b, left[j]))
                orders[b].append(left[j])
        if rows:
            seqs = np.array([b for b, _ in where])
            new = sample_tokens(torch.stack(rows), cfg, uniforms=streams.token_uniforms(seqs, cfg.dtype, "cpu"))
            for (b, p), tok in zip(where, new.tolist(), strict=True):
                tokens[b, p] = tok
    return torch.tensor(orders), tokens


CASES = {
    "one per step": dict(),
    "prompt, 3 steps, batch": dict(prompt=[4, 1], steps=3, num_samples=3),
    "bernoulli, batch": dict(policy="bernoulli", steps=4, num_samples=3),
    "blanks, top-p": dict(template=[3, None, None, 5, None, 7, None, None, 2], top_p=0.8, steps=2, num_samples=2),
}


@pytest.mark.parametrize("variant", ["aogpt", "sigma", "encoder-mdm"])
@pytest.mark.parametrize("policy", ADAPTIVE)
@pytest.mark.parametrize("case", list(CASES))
def test_orders_tokens_and_logits_equal_a_full_recomputation(variant, policy, case):
    model = tiny_model(variant, block=N)
    kw = dict(CASES[case])
    template = kw.pop("template", None)
    cfg = SamplingConfig(temperature=0.9, top_p=kw.get("top_p", 1.0))
    common = dict(order=policy, temperature=0.9, seed=11, record_logits=True, **kw)
    res = infill(model, template, **common) if template else generate(model, length=N, **common)
    orders, tokens = recompute(model, res, policy, cfg, seed=11)
    assert torch.equal(res.orders, orders) and torch.equal(res.tokens, tokens)
    assert int(res.step_counts.sum()) == N * res.tokens.shape[0] - int(res.known.sum()) * res.tokens.shape[0]
    # every recorded logit is the recomputed conditional of its position given the chain before its step
    for b in range(res.tokens.shape[0]):
        g = int(res.known.sum())
        for k in res.step_counts[b].tolist():
            chain = res.orders[b]
            if k:
                lp = conditional_logprobs(model, res.tokens[b], chain[:g], chain[g:g + k])
                assert torch.allclose(torch.log_softmax(res.logits[b, g:g + k], -1), lp, atol=1e-9)
            g += k


@pytest.mark.parametrize("variant", ["aogpt", "encoder-mdm"])
@pytest.mark.parametrize("policy", ADAPTIVE)
def test_greedy_reveals_the_argmax_of_the_recomputed_scores(variant, policy):
    model = tiny_model(variant, block=N, seed=3)
    res = generate(model, length=N, num_samples=4, order=policy, greedy=True, prompt=[2], seed=0)
    for b in range(4):
        chain, x = res.orders[b], res.tokens[b]
        for i in range(1, N):
            left = chain[i:].sort().values
            lp = conditional_logprobs(model, x, chain[:i], left)
            score, _ = numpy_scores(lp.numpy(), policy)
            best = int(np.argmax(score))  # the first maximum: the lowest position
            assert int(left[best]) == int(chain[i])
            assert int(x[chain[i]]) == int(lp[best].argmax())


@pytest.mark.parametrize("variant", ["aogpt", "encoder-mdm"])
def test_threshold_reveals_every_confident_candidate_and_at_least_one(variant):
    model = tiny_model(variant, block=N, seed=5)
    for threshold in (0.3, 0.45, 0.6):
        res = generate(model, length=N, num_samples=3, order="margin", threshold=threshold, seed=2, temperature=0.7)
        orders, tokens = recompute(model, res, "margin", SamplingConfig(temperature=0.7), 2, threshold=threshold)
        assert torch.equal(res.orders, orders) and torch.equal(res.tokens, tokens)
        assert (res.step_counts.sum(1) == N).all()
        if threshold < 0.4:  # most first-step confidences are above it (they lie in 0.28 .. 0.61)
            assert (res.step_counts[:, 0] > 1).all()
    # a threshold above every confidence reveals one position per step
    one = generate(model, length=N, num_samples=2, order="confidence", threshold=1.0, seed=2)
    assert (one.step_counts == 1).all()


@pytest.mark.parametrize("variant", ["aogpt", "encoder-mdm"])
def test_cache_batches_and_candidates_do_not_change_greedy_results(variant):
    model = tiny_model(variant, block=N, seed=7)
    base = dict(length=N, order="entropy", greedy=True, seed=4, prompt=[1, 2, 3], steps=4)
    batch = generate(model, num_samples=3, **base)
    assert torch.equal(batch.tokens[0], batch.tokens[1])  # greedy and the same prompt: one answer
    alone = generate(model, num_samples=1, **base)
    nocache = generate(model, num_samples=3, use_cache=False, **base)
    everything = generate(model, num_samples=3, candidates=N, **base)
    for other in (nocache, everything):
        assert torch.equal(batch.tokens, other.tokens) and torch.equal(batch.orders, other.orders)
    assert torch.equal(alone.tokens[0], batch.tokens[0]) and torch.equal(alone.orders[0], batch.orders[0])


def test_one_random_candidate_per_step_gives_a_uniform_order():
    """With C = 1 the only candidate is a uniformly drawn remaining position, so the order is uniform:
    the position revealed first is uniform over the 4 positions (chi-square); the full policy's
    deterministic (greedy) choice is firmly rejected by the same test."""
    model = tiny_model("aogpt", block=4, seed=1)
    draws = 2000
    first = generate(model, length=4, num_samples=draws, order="confidence", candidates=1, greedy=True,
                     seed=9, batch_size=500).orders[:, 0]
    counts = np.bincount(first.numpy(), minlength=4)
    assert stats.chisquare(counts).pvalue > 1e-3
    full = generate(model, length=4, num_samples=200, order="confidence", greedy=True, seed=9).orders[:, 0]
    assert stats.chisquare(np.bincount(full.numpy(), minlength=4) + 1).pvalue < 1e-6


def test_slot_evaluations_count_every_candidate():
    model = tiny_model("aogpt", block=N)
    res = generate(model, length=N, num_samples=2, order="confidence", seed=0)
    assert res.timing["slot_evaluations"] == 2 * N * (N + 1) // 2  # all remaining scored, one per step
    assert res.timing["forwards"] == N and res.timing["padded_slots"] == 0
    budget = generate(model, length=N, num_samples=2, order="confidence", candidates=3, seed=0)
    scored = 2 * sum(min(3, u) for u in range(1, N + 1))
    assert budget.timing["slot_evaluations"] == scored  # the best candidate's keys are reused: no catch-ups
    several = generate(model, length=N, num_samples=1, order="confidence", steps=3, seed=0)
    # 3 steps of 3: queries 9 + 6 + 3, and each step's two other revealed tokens caught up next step
    assert several.timing["slot_evaluations"] == 18 + 2 + 2


def test_scores_and_choice_by_hand():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1, 0.0], [0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]],
                                    dtype=torch.float64))
    for policy in ADAPTIVE:
        score, conf = candidate_scores(logits, policy)
        want_s, want_c = numpy_scores(torch.log_softmax(logits, -1).numpy(), policy)
        assert np.allclose(score.numpy(), want_s) and np.allclose(conf.numpy(), want_c)
    ent, _ = candidate_scores(logits, "entropy")
    assert torch.isfinite(ent).all() and ent[1] == pytest.approx(-np.log(2))
    # ties go to the candidate listed first; padding (-inf) never wins; the threshold adds the confident
    score = np.array([[0.2, 0.5, 0.5, -np.inf], [0.9, 0.1, 0.8, 0.3]])
    conf = np.array([[0.3, 0.6, 0.6, -1.0], [0.95, 0.9, 0.2, 0.99]])
    picks = choose(score, conf, np.array([1, 1]), None)
    assert [p.tolist() for p in picks] == [[1], [0]]
    picks = choose(score, conf, np.array([3, 1]), 0.9)
    assert [p.tolist() for p in picks] == [[1, 2, 0], [0, 3, 1]]


def test_adaptive_requests_refused_where_they_make_no_sense():
    gpt = tiny_model("gpt", block=N)
    with pytest.raises(AOGPTError, match="cannot choose its own unmasking order"):
        generate(gpt, length=N, order="confidence")
    model = tiny_model("aogpt", block=N)
    with pytest.raises(AOGPTError, match="only to an adaptive order"):
        generate(model, length=N, order="random", candidates=3)
    with pytest.raises(AOGPTError, match="only to an adaptive order"):
        generate(model, length=N, threshold=0.9)
    with pytest.raises(AOGPTError, match=r"threshold must be in \(0, 1\]"):
        generate(model, length=N, order="margin", threshold=1.5)
    with pytest.raises(AOGPTError, match="candidates must be"):
        generate(model, length=N, order="margin", candidates=0)
    with pytest.raises(AOGPTError, match="adaptive order is chosen while decoding"):
        generate(model, length=N, order="margin", speculative=4)
    with pytest.raises(AOGPTError, match="chosen by the model while generating"):
        make_order_sampler("entropy")


@pytest.mark.parametrize("variant", ["aogpt", "encoder-mdm"])
def test_a_candidate_budget_keeps_the_tokens_exact_and_picks_the_best_of_c(variant):
    """With C random candidates per step the order is the model's pick among some C remaining
    positions: each revealed position outranks at least C - 1 others by the recomputed scores, and
    its greedy token is the argmax of the recomputed conditional given the chain before it."""
    model = tiny_model(variant, block=N, seed=13)
    C = 3
    res = generate(model, length=N, num_samples=4, order="margin", candidates=C, greedy=True, prompt=[5], seed=6)
    for b in range(4):
        chain, x = res.orders[b], res.tokens[b]
        assert sorted(chain.tolist()) == list(range(N))
        for i in range(1, N):
            left = chain[i:].sort().values
            lp = conditional_logprobs(model, x, chain[:i], left)
            score, _ = numpy_scores(lp.numpy(), "margin")
            me = int((left == chain[i]).nonzero())
            beaten = sum(score[j] < score[me] or (score[j] == score[me] and j > me) for j in range(len(left)))
            assert beaten >= min(C, len(left)) - 1
            assert int(x[chain[i]]) == int(lp[me].argmax())
