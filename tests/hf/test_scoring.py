"""Continuation and document log-likelihoods against independent computations: conditionals from
their own forwards (`conditional_logprobs`) and exact per-order NLLs from `aogpt.evaluate`."""

from __future__ import annotations

import statistics

import pytest
import torch

from aogpt.config import model_config
from aogpt.errors import AOGPTError
from aogpt.evaluation.evaluate import conditional_logprobs, evaluate
from aogpt.hf.scoring import rolling_windows, score_continuations, score_documents
from aogpt.model import Transformer
from tests.helpers import random_model

WINDOW = 8


def by_conditionals(model: Transformer, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """log p(continuation | context) and the greedy check, one `conditional_logprobs` call per token."""
    seq = torch.tensor(context + continuation)
    total, greedy = 0.0, True
    for t in range(len(context), len(seq)):
        logp = conditional_logprobs(model, seq, torch.arange(t), torch.tensor([t]))[0]
        total += float(logp[seq[t]])
        greedy = greedy and int(logp.argmax()) == int(seq[t])
    return total, greedy


def order_nll(model: Transformer, tokens: list[int], order: list[int]) -> float:
    return evaluate(model, torch.tensor([tokens]), order=torch.tensor(order), per_sequence=True).sequence_nlls[0][0]


PAIRS = [([3, 1, 4], [1, 5]), ([], [9, 2, 6]), ([5, 3, 5, 8, 9, 7, 9], [3, 2]),  # the last one is cut on the left
         ([2], []), ([7, 1, 8, 2, 8], [1, 8, 2, 8]), ([4], [4])]


def test_left_to_right_is_the_exact_conditional_likelihood() -> None:
    model = random_model("aogpt", n=WINDOW)
    scores = score_continuations(model, PAIRS, batch_size=2)
    for (ctx, cont), s in zip(PAIRS, scores, strict=True):
        keep = (ctx + cont)[-WINDOW:]
        want, greedy = by_conditionals(model, keep[:len(keep) - len(cont)], cont)
        assert s.logprob == pytest.approx(want, abs=1e-9) and s.is_greedy == greedy
        assert s.exact and s.se is None and s.tokens == len(cont) and s.draws == [s.logprob]
        assert s.context_dropped == max(0, len(ctx) + len(cont) - WINDOW)
    assert scores[2].context_dropped == 1
    greedy = torch.tensor(PAIRS[0][0])  # then a continuation the model itself would choose
    for _ in range(3):
        nxt = conditional_logprobs(model, torch.cat([greedy, greedy[:1]]), torch.arange(len(greedy)),
                                   torch.tensor([len(greedy)]))[0].argmax()
        greedy = torch.cat([greedy, nxt[None]])
    assert score_continuations(model, [(PAIRS[0][0], greedy[3:].tolist())])[0].is_greedy


def test_any_order_draws_are_exact_order_likelihoods() -> None:
    model = random_model("aogpt", n=WINDOW)
    K = 5
    scores = score_continuations(model, PAIRS, order="random", num_orders=K, seed=3, batch_size=4)
    for (ctx, cont), s in zip(PAIRS, scores, strict=True):
        keep = (ctx + cont)[-WINDOW:]
        m = len(keep) - len(cont)
        assert not s.exact and len(s.draws) == len(s.orders) == K
        context_nll = order_nll(model, keep[:m], list(range(m))) if m else 0.0
        for draw, perm in zip(s.draws, s.orders, strict=True):
            assert sorted(perm) == list(range(len(cont)))
            # the context left to right, then the continuation in the drawn order: the chain rule
            full = order_nll(model, keep, list(range(m)) + [m + p for p in perm])
            assert draw == pytest.approx(-(full - context_nll), abs=1e-9)
        assert s.logprob == pytest.approx(statistics.fmean(s.draws))
        assert s.se == pytest.approx(statistics.stdev(s.draws) / K ** 0.5)
        assert s.is_greedy == by_conditionals(model, keep[:m], cont)[1]  # always the left-to-right check
    alone = score_continuations(model, [PAIRS[4]], order="random", num_orders=K, seed=3)[0]
    # a score does not depend on its batch: the same orders, the same value up to the matrix library's
    # rounding (bitwise where its kernels are row-invariant; MKL's AVX2 kernels round by batch shape)
    assert alone.orders == scores[4].orders and alone.draws == pytest.approx(scores[4].draws, rel=1e-12, abs=1e-12)
    assert len({tuple(o) for o in scores[4].orders}) > 1  # the K draws read in different orders
    assert scores[4].orders != score_continuations(model, [PAIRS[4]], order="random", num_orders=K,
                                                   seed=4)[0].orders


def test_refusals() -> None:
    with pytest.raises(AOGPTError, match="left to right only"):
        score_continuations(random_model("gpt", n=WINDOW), PAIRS, order="random", num_orders=2)
    with pytest.raises(AOGPTError, match="not supported here"):
        score_continuations(random_model("aogpt", n=WINDOW), PAIRS, order="blockwise:2")
    with pytest.raises(AOGPTError, match="does not fit"):
        score_continuations(random_model("aogpt", n=WINDOW), [([], list(range(WINDOW + 1)))])
    encoder = Transformer(model_config("encoder-mdm", n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11))
    with pytest.raises(AOGPTError, match="not a causal decoder"):
        score_continuations(encoder, PAIRS)


@pytest.mark.parametrize("window", [2, 3, 8, 32])
def test_rolling_windows_score_every_token_once_with_full_context(window: int) -> None:
    assert rolling_windows(70, 32) == [(0, 0, 32), (31, 32, 63), (38, 63, 70)]
    for n in range(0, 80):
        windows = rolling_windows(n, window)
        scored = [t for _, first, end in windows for t in range(first, end)]
        assert scored == list(range(n))
        for k, (start, first, end) in enumerate(windows):
            if k == 0:
                assert start == first == 0 and end == min(n, window)
            else:
                assert end - start == window and first - start >= 1


def test_documents_in_rolling_windows() -> None:
    model = random_model("aogpt", n=WINDOW)
    docs = [[1, 2, 3], list(range(11)) * 2, [], [5] * WINDOW]
    scores = score_documents(model, docs, batch_size=3)
    assert scores[2].logprob == 0.0 and scores[2].tokens == 0
    for doc, s in zip(docs, scores, strict=True):
        if len(doc) <= WINDOW:  # one window: the exact likelihood of the document
            assert s.logprob == pytest.approx(-order_nll(model, doc, list(range(len(doc)))) if doc else 0.0, abs=1e-9)
    # 22 tokens: 8 from the start, then windows of 8 tokens scoring their last 7 (at most), each token once
    doc = docs[1]
    want = -order_nll(model, doc[:8], list(range(8)))
    want += by_conditionals(model, doc[7:8], doc[8:15])[0] + by_conditionals(model, doc[14:15], doc[15:22])[0]
    assert scores[1].logprob == pytest.approx(want, abs=1e-9) and scores[1].tokens == 22
    bound = score_documents(model, docs, order="random", num_orders=3, seed=1)[1]
    parts = score_continuations(model, [(doc[:0], doc[:8]), (doc[7:8], doc[8:15]), (doc[14:15], doc[15:22])],
                                order="random", num_orders=3, seed=1)
    assert bound.draws == pytest.approx([sum(p.draws[k] for p in parts) for k in range(3)])
    assert bound.se == pytest.approx(statistics.stdev(bound.draws) / 3 ** 0.5)
