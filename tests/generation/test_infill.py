"""Infilling methods: best-of-D's law against enumeration (chi-square, with a power check that the
single-draft law and best-of-(D-1) are rejected), its exact draft scores against token-by-token
forwards, hidden-word passages and the filled words a word check counts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats

from aogpt.data.tokenizer import ByteTokenizer
from aogpt.errors import AOGPTError
from aogpt.generation.infill import fill, fill_nll, filled_words, parse_method, parse_passage
from tests.helpers import prefix_conditional, random_model

V, N_POS = 3, 5
KNOWN = {0: 2, 4: 1}  # blanks at 1, 2, 3


def enumerate_fills(model) -> tuple[torch.Tensor, np.ndarray]:
    """Every fill (V^3 sequences) and q(fill) = prod of its conditionals, known tokens read first and the
    blanks left to right, each from its own forward."""
    rows = [[KNOWN[0], *y, KNOWN[4]] for y in itertools.product(range(V), repeat=3)]
    x = torch.tensor(rows)
    order = [0, 4, 1, 2, 3]
    q = np.array([np.exp(-sum(prefix_conditional(model, x[i:i + 1], order, s) for s in range(2, 5)))
                  for i in range(len(rows))])
    return x, q


def best_of_law(q: np.ndarray, D: int) -> np.ndarray:
    """P(the most likely of D independent draws from q is y) = (1 - A)^D - (1 - A - q)^D, A = the mass
    of the fills more likely than y (no ties in float64 here)."""
    order = np.argsort(-q)
    above = np.concatenate([[0.0], np.cumsum(q[order])[:-1]])
    law = np.empty_like(q)
    law[order] = (1 - above) ** D - np.clip(1 - above - q[order], 0, None) ** D
    return law


def chi2(tokens: torch.Tensor, law: np.ndarray) -> float:
    codes = (tokens[:, 1:4] * torch.tensor([V * V, V, 1])).sum(1).numpy()
    observed = np.bincount(codes, minlength=V ** 3)
    keep = law * observed.sum() >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(law[keep], law[~keep].sum()) * observed.sum()
    return float(stats.chisquare(obs[exp > 0], exp[exp > 0]).pvalue)


def test_best_of_d_follows_the_enumerated_law_of_the_most_likely_of_d_draws() -> None:
    model = random_model("aogpt", n=N_POS, vocab=V, seed=11, scale=0.7)
    x, q = enumerate_fills(model)
    assert q.sum() == pytest.approx(1.0, abs=1e-10)
    np.testing.assert_allclose(torch.exp(-fill_nll(model, x, torch.tensor([1, 0, 0, 0, 1]).bool())).numpy(), q,
                               rtol=1e-9)
    D, N = 3, 6000
    res = fill(model, KNOWN, method=f"best-of:{D}", length=N_POS, num_samples=N, seed=5, batch_size=N * D)
    assert res.tokens.shape == (N, N_POS) and (res.tokens[:, 0] == 2).all() and (res.tokens[:, 4] == 1).all()
    assert chi2(res.tokens, best_of_law(q, D)) > 1e-3
    # power: one draft's law and best of D - 1 are firmly rejected by the same samples
    assert chi2(res.tokens, q) < 1e-6 and chi2(res.tokens, best_of_law(q, D - 1)) < 1e-6
    # the kept draft is the most likely of its D, by the exact scores
    drafts = np.array(res.settings["draft_nll"])
    assert drafts.shape == (N, D) and np.allclose(drafts.min(1), res.settings["fill_nll"])
    codes = (res.tokens[:, 1:4] * torch.tensor([V * V, V, 1])).sum(1).numpy()
    np.testing.assert_allclose(np.exp(-np.array(res.settings["fill_nll"])), q[codes], rtol=1e-9)


def test_plain_methods_and_bad_methods() -> None:
    model = random_model("aogpt", n=N_POS, vocab=V, seed=12)
    res = fill(model, KNOWN, method="confidence", length=N_POS, num_samples=4, seed=1)
    assert res.settings["order"] == "the model's surest position first (confidence)" and (res.tokens[:, 0] == 2).all()
    assert parse_method("best-of:4:confidence").drafts == 4
    for bad in ("best-of:0", "best-of:x", "best", "best-of:2:sideways"):
        with pytest.raises(AOGPTError, match="unknown infilling method"):
            parse_method(bad)


def test_passages_and_filled_words() -> None:
    tok = ByteTokenizer()
    p = parse_passage("To be, or [[not to]] be, that is the [[question]]:", tok)
    assert p.text == "To be, or not to be, that is the question:"
    assert p.template == "To be, or [MASK:6] be, that is the [MASK:8]:"
    assert tok.decode(p.tokens.tolist()) == p.text and int(p.hidden.sum()) == 14
    # a word touching a filled byte counts ("nothing" has its first 3 letters given); given words do not
    tokens = tok.encode("To be or nothing, quiet")
    known = [True] * 11 + [False] * 5 + [True] * 2 + [False] * 5
    assert filled_words(tok, tokens, known) == ["nothing", "quiet"]
    with pytest.raises(AOGPTError, match="hides nothing"):
        parse_passage("nothing hidden", tok)
