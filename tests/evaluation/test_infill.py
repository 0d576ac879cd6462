"""Infill likelihoods against independent computations: token-by-token forwards with full recomputation
(every order, the adaptive choice redone by brute force), the enumerated conditional law of a span on a
tiny vocabulary (Bayes over the full sequence's likelihood), and cuts that no model changes."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from aogpt.errors import AOGPTError
from aogpt.evaluation.infill import adaptive_span_nll, evaluate_infill, make_cuts, score_cuts, span_nll
from aogpt.families import family_of
from tests.helpers import prefix_conditional, random_model

C, L = 2, 3  # context each side, span
W = 2 * C + L


def windows(B: int = 3, vocab: int = 11, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (B, W), generator=torch.Generator().manual_seed(seed))


def brute(model, x: torch.Tensor, read: list[int], span_steps: list[int]) -> float:
    """Sum of -log p(x[span_steps[i]] | x[read + span_steps[:i]]), one separate forward per token."""
    order = read + span_steps
    return sum(prefix_conditional(model, x[None], order, len(read) + i) for i in range(len(span_steps)))


@pytest.mark.parametrize("variant", ["sigma", "aogpt"])
def test_span_nll_is_the_sum_of_separately_computed_conditionals(variant: str) -> None:
    model = random_model(variant, n=W, seed=2)
    x = windows()
    ctx = [0, 1, 5, 6]
    span = [2, 3, 4]
    orders = torch.tensor([[0, 1, 2], [2, 0, 1], [1, 2, 0]])
    got_l2r = span_nll(model, x, C, L)
    got_ord = span_nll(model, x, C, L, orders)
    got_pre = span_nll(model, x, C, L, sides="prefix")
    for b in range(3):
        assert float(got_l2r[b]) == pytest.approx(brute(model, x[b], ctx, span), abs=1e-10)
        assert float(got_ord[b]) == pytest.approx(brute(model, x[b], ctx, [C + int(o) for o in orders[b]]), abs=1e-10)
        assert float(got_pre[b]) == pytest.approx(brute(model, x[b, :C + L], [0, 1], span), abs=1e-10)
    assert not torch.allclose(got_l2r, got_ord)  # the order matters for this model: the check can fail


def test_gpt_scores_the_prefix_only() -> None:
    model = random_model("gpt", n=W, seed=4)
    x = windows()
    got = span_nll(model, x, C, L, sides="prefix")
    for b in range(3):
        assert float(got[b]) == pytest.approx(brute(model, x[b, :C + L], [0, 1], [2, 3, 4]), abs=1e-10)
    with pytest.raises(AOGPTError, match="left to right only"):
        span_nll(model, x, C, L)


@pytest.mark.parametrize("policy", ["confidence", "entropy"])
def test_adaptive_order_equals_a_brute_force_choice_with_full_recomputation(policy: str) -> None:
    model = random_model("aogpt", n=W, seed=5)
    x = windows(B=2, seed=3)
    nll, chosen = adaptive_span_nll(model, x, C, L, policy)
    for b in range(2):
        read, missing, total, mine = [0, 1, 5, 6], [2, 3, 4], 0.0, []
        while missing:
            best, best_score, best_logp = None, -math.inf, None
            for p in missing:  # p's distribution from its own forward: slots read + a query aimed at p
                tokens = torch.tensor([[-1] + [int(x[b, q]) for q in read]])
                pos = torch.tensor([[0] + [q + 1 for q in read]])
                logp = torch.log_softmax(model.forward_slots(tokens, pos, torch.tensor([read + [p]]))[0, -1], -1)
                prob = logp.exp()
                score = float(prob.max()) if policy == "confidence" else float((prob * logp).sum())
                if score > best_score + 1e-12:
                    best, best_score, best_logp = p, score, logp
            total -= float(best_logp[x[b, best]])
            mine.append(best - C)
            read.append(best)
            missing.remove(best)
        assert float(nll[b]) == pytest.approx(total, abs=1e-10)
        assert chosen[b].tolist() == mine


def test_enumerated_conditional_law_of_a_span_on_a_tiny_vocabulary() -> None:
    V = 3
    model = random_model("aogpt", n=W, vocab=V, seed=6, scale=0.6)
    ctx = torch.tensor([2, 0, 1, 2])
    spans = torch.tensor(list(itertools.product(range(V), repeat=L)))  # all V^L spans
    x = torch.cat([ctx[:C].expand(len(spans), C), spans, ctx[C:].expand(len(spans), C)], dim=1)
    fam = family_of(model)
    order = torch.tensor([0, 1, 5, 6, 2, 3, 4]).expand(len(spans), W)
    joint = -fam.order_nll(model, x, order).double().sum(1)  # log p(prefix, suffix, span), whole sequence
    bayes = torch.softmax(joint, 0)  # p(span | prefix, suffix) by enumeration
    law = torch.exp(-span_nll(model, x, C, L))
    np.testing.assert_allclose(law.numpy(), bayes.numpy(), atol=1e-10)
    adaptive = torch.exp(-adaptive_span_nll(model, x, C, L)[0])
    # the adaptive order is a normalised law over spans (its choice never peeks at the scored token) ...
    assert float(adaptive.sum()) == pytest.approx(1.0, abs=1e-10)
    # ... and a different one: a scorer that picked per span the best fixed order would not sum to one
    best_fixed = torch.stack([torch.exp(-span_nll(model, x, C, L, torch.tensor(p)))
                              for p in itertools.permutations(range(L))]).max(0).values
    assert float(best_fixed.sum()) > 1.0 + 1e-3


def test_cuts_depend_on_the_data_and_seed_only_and_every_model_gets_them() -> None:
    text = np.random.default_rng(0).integers(1, 11, 400)
    text[[50, 51, 200]] = 0  # end-of-text tokens: no window may hold one
    a = make_cuts(text, L, num_cuts=20, context=C, seed=3, eot_id=0)
    b = make_cuts(text, L, num_cuts=20, context=C, seed=3, eot_id=0)
    assert np.array_equal(a.starts, b.starts) and torch.equal(a.windows, b.windows)
    assert not np.array_equal(a.starts, make_cuts(text, L, num_cuts=20, context=C, seed=4, eot_id=0).starts)
    for s, w in zip(a.starts, a.windows, strict=True):
        assert w.tolist() == text[s:s + W].tolist() and 0 not in w.tolist()
    ao, gpt = random_model("aogpt", n=W, seed=7), random_model("gpt", n=W, seed=8)
    lengths = torch.ones(11, dtype=torch.long)
    rows = evaluate_infill(ao, text, lengths=(L,), num_cuts=20, context=C, seed=3, eot_id=0, num_orders=2,
                           byte_lengths=lengths, compare={"gpt": gpt})
    alone = evaluate_infill(ao, text, lengths=(L,), num_cuts=20, context=C, seed=3, eot_id=0, num_orders=2,
                            byte_lengths=lengths)
    assert [r for r in rows if r["model"] == "model"] == alone  # adding a model changes nothing for the other
    gpt_row = next(r for r in rows if r["model"] == "gpt")
    direct = span_nll(gpt, a.windows, C, L, sides="prefix") / L / math.log(2)  # one byte per token here
    assert gpt_row["bpb"] == pytest.approx(float(direct.mean()), abs=1e-10)
    assert gpt_row["gap_vs_both"]["spans"] == 20 and {r["row"] for r in rows if r["model"] == "gpt"} == {"prefix/l2r"}


def test_random_rows_are_the_mean_of_k_exact_draws_and_bad_requests_are_refused() -> None:
    model = random_model("aogpt", n=W, seed=9)
    cuts = make_cuts(np.arange(1, 60) % 11, L, num_cuts=6, context=C, seed=0)
    s = score_cuts(model, cuts, num_orders=3, byte_lengths=torch.ones(11, dtype=torch.long), batch_size=4)
    assert np.allclose(np.mean(s.random_draws, 0), s.nll["both/random"]) and len(s.random_draws) == 3
    assert len({tuple(np.round(d, 8)) for d in s.random_draws}) == 3  # three different draws
    with pytest.raises(AOGPTError, match="exceed the model's context"):
        score_cuts(random_model("aogpt", n=4), cuts)
    with pytest.raises(AOGPTError, match="fewer than one window"):
        make_cuts(np.arange(10), 8, context=4, num_cuts=1)
    with pytest.raises(AOGPTError, match="inside one document"):
        make_cuts(np.array([1, 2, 0] * 20), 1, context=1, num_cuts=2, eot_id=0)


def test_the_models_own_order_is_chosen_on_other_spans_only() -> None:
    """both/best is the l2r or the adaptive row, whichever is likelier on the calibration spans (recomputed
    here); the evaluation spans never enter the choice."""
    from aogpt.evaluation.infill import calibration_cuts, choose_order

    model = random_model("aogpt", n=W, seed=13)
    text = np.random.default_rng(1).integers(0, 11, 300)
    cuts = make_cuts(text, L, num_cuts=8, context=C, seed=2)
    calib = calibration_cuts(text, cuts, seed=2, num_cuts=6)
    assert not np.array_equal(calib.starts, cuts.starts)
    l2r = float(span_nll(model, calib.windows, C, L).sum())
    ada = float(adaptive_span_nll(model, calib.windows, C, L)[0].sum())
    want = "l2r" if l2r <= ada else "confidence"
    assert choose_order(model, calib) == want
    s = score_cuts(model, cuts, num_orders=2, calibration=calib)
    assert s.best_order == want and s.nll["both/best"] == s.nll["both/l2r" if want == "l2r" else "both/adaptive"]
    other = score_cuts(model, cuts, num_orders=2, calibration=make_cuts(text, L, num_cuts=6, context=C, seed=99))
    assert other.nll["both/l2r"] == s.nll["both/l2r"]  # the evaluation rows do not depend on the calibration
