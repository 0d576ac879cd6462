"""Infilling with a fill-in-the-middle GPT: the empirical law of a filled gap against the law enumerated
from separate forwards (chi-square; a law that ignores the suffix is rejected), the sides each gap is
given, free-length middles ended by END, and the exact score of a filled template."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats

from aogpt.errors import AOGPTError
from aogpt.generation.fim import fim_fill, fim_fill_nll, fim_middles, gaps, sides
from tests.evaluation.test_infill_fim import TEXT, S, fim_model

N = 12


def restricted(model, row: list[int], allowed: int) -> torch.Tensor:
    """p(next | row) over ids below `allowed`, renormalised: what a sampler limited to them draws."""
    logits = model(torch.tensor([row]), with_last_slot=True)[0][0, -1, :allowed]  # the slot after the row
    return torch.softmax(logits.double(), -1)


def chisquare_p(observed: np.ndarray, law: np.ndarray) -> float:
    """Chi-square p-value of counts against a law, outcomes expected fewer than 5 times pooled into one."""
    expected = law / law.sum() * observed.sum()
    small = expected < 5
    obs, exp = observed[~small], expected[~small]
    if small.any():
        obs, exp = np.append(obs, observed[small].sum()), np.append(exp, expected[small].sum())
    return float(stats.chisquare(obs, exp).pvalue)


def test_a_gap_follows_the_law_of_its_sides_and_never_holds_a_sentinel() -> None:
    model = fim_model(N, seed=11, scale=0.8)
    template = {0: 1, 1: 2, 4: 0, 5: 2}  # [1, 2, _, _, 0, 2]
    res = fim_fill(model, template, length=6, num_samples=6000, seed=0, batch_size=1000)
    assert (res.tokens[:, [0, 1, 4, 5]] == torch.tensor([1, 2, 0, 2])).all()
    assert int(res.tokens.max()) < TEXT  # text only: no sentinel, no END inside a gap of fixed length
    outcomes = list(itertools.product(range(TEXT), repeat=2))
    observed = np.array([int(((res.tokens[:, 2] == a) & (res.tokens[:, 3] == b)).sum()) for a, b in outcomes])

    def law(suffix: list[int]) -> np.ndarray:
        row = [S.prefix, 1, 2, S.suffix, *suffix, S.middle]
        first = restricted(model, row, TEXT)
        return np.array([float(first[a] * restricted(model, [*row, a], TEXT)[b]) for a, b in outcomes])

    right = law([0, 2])
    assert right.sum() == pytest.approx(1.0)
    assert chisquare_p(observed, right) > 1e-3
    wrong = law([1, 1])  # the same prefix, another suffix: the fill must depend on the text after it
    assert chisquare_p(observed, wrong) < 1e-6
    again = fim_fill(model, template, length=6, num_samples=8, seed=3)
    assert torch.equal(again.tokens, fim_fill(model, template, length=6, num_samples=8, seed=3).tokens)


def test_each_gap_reads_what_is_before_it_and_the_given_text_up_to_the_next_gap() -> None:
    known = torch.tensor([True, False, False, True, True, False, True])
    assert gaps(known) == [(1, 3), (5, 6)]
    tokens = torch.tensor([[7, 8, 9, 10, 11, 12, 13]])
    p, s = sides(tokens, known, (1, 3), space=10)
    assert p.tolist() == [[7]] and s.tolist() == [[10, 11]]  # the second gap is not known yet
    p, s = sides(tokens, known, (5, 6), space=10)
    assert p.tolist() == [[7, 8, 9, 10, 11]] and s.tolist() == [[13]]
    p, s = sides(tokens, known, (5, 6), space=3)  # a short suffix keeps all of it, the prefix the rest
    assert p.tolist() == [[10, 11]] and s.tolist() == [[13]]
    with pytest.raises(AOGPTError, match="no room"):
        sides(tokens, known, (1, 3), space=-1)


def test_the_score_of_a_filled_template_is_the_sum_of_its_gaps_scored_with_those_sides() -> None:
    model = fim_model(N, seed=12)
    known = torch.tensor([True, False, False, True, True, False, True])
    tokens = torch.tensor([[1, 0, 2, 2, 1, 0, 1], [0, 0, 0, 1, 1, 2, 2]])
    got = fim_fill_nll(model, tokens, known)
    expect = []
    for row in tokens.tolist():
        total = 0.0
        for pre, mid, suf in (([row[0]], row[1:3], row[3:5]), (row[:5], row[5:6], row[6:])):
            seq = torch.tensor([[S.prefix, *pre, S.suffix, *suf, S.middle, *mid, S.end]])
            losses = model(seq)[1][0].double()
            total += float(losses[-len(mid) - 1:].sum())
        expect.append(total)
    np.testing.assert_allclose(got.numpy(), expect, atol=1e-10)


def test_free_length_middles_end_where_the_model_writes_end() -> None:
    """Up to 2 tokens: the fill is empty (END first), one token then END, or two tokens (cut there);
    the law of the 13 outcomes from separate forwards, over text ids and END."""
    model = fim_model(N, seed=0, scale=0.3)  # small weights: END and every text id are all likely
    draws = fim_middles(model, [1, 2], [0, 2], max_tokens=2, num_samples=6000, seed=5, batch_size=1000)
    assert all(len(d) <= 2 and all(t < TEXT for t in d) for d in draws)
    row = [S.prefix, 1, 2, S.suffix, 0, 2, S.middle]
    first = restricted(model, row, S.end + 1)  # text or END
    outcomes, law = [()], [float(first[S.end])]
    for t in range(TEXT):
        second = restricted(model, [*row, t], S.end + 1)
        outcomes.append((t,))
        law.append(float(first[t] * second[S.end]))
        for u in range(TEXT):
            outcomes.append((t, u))
            law.append(float(first[t] * second[u]))
    assert sum(law) == pytest.approx(1.0)
    observed = np.array([sum(tuple(d) == o for d in draws) for o in outcomes])
    assert chisquare_p(observed, np.array(law)) > 1e-3
    assert chisquare_p(observed, np.array([law[0], *(x * 1.3 for x in law[1:])])) < 1e-6  # END too rare: rejected
    with pytest.raises(AOGPTError, match="do not fit the context"):
        fim_middles(model, [1] * 6, [2] * 3, max_tokens=4)
