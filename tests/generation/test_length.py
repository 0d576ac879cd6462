"""The gap-length estimate: unbiased for the exact marginal (enumerated over every fill), its proposal
a normalised law, and the choice reproducible."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from aogpt.errors import AOGPTError
from aogpt.generation.generate import generate
from aogpt.generation.length import candidate_lengths, choose_length, ids_layout, log_marginal, template_layout
from aogpt.generation.likelihood import chain_logprobs
from tests.helpers import random_model

PREFIX, SUFFIX = [3, 1], [4, 0]


def exact(model, k: int) -> tuple[float, torch.Tensor, torch.Tensor]:
    """p_k by enumeration, and for every fill its proposal probability q and weight p / q."""
    fills = torch.tensor(list(itertools.product(range(model.config.vocab_size), repeat=k)))
    rows = torch.cat([torch.tensor(PREFIX).expand(len(fills), -1), fills, torch.tensor(SUFFIX).expand(len(fills), -1)],
                     dim=1)
    n, m = rows.shape[1], len(PREFIX) + len(SUFFIX)
    l2r = chain_logprobs(model, rows, torch.arange(n).expand(len(rows), -1)).logprobs.sum(1)
    known_first = torch.tensor([*range(len(PREFIX)), *range(len(PREFIX) + k, n), *range(len(PREFIX), len(PREFIX) + k)])
    q = chain_logprobs(model, rows, known_first.expand(len(rows), -1)).logprobs[:, m:].sum(1)
    return float(torch.logsumexp(l2r, 0)), q.exp(), (l2r - q).exp()


@pytest.mark.parametrize("k", [1, 2])
def test_the_estimate_is_unbiased_for_the_exact_marginal(k: int) -> None:
    model = random_model("aogpt", n=8, vocab=7, seed=2, scale=0.6)
    log_p, q, w = exact(model, k)
    assert abs(float(q.sum()) - 1.0) < 1e-9  # the proposal is a law over the fills
    p = math.exp(log_p)
    sd = math.sqrt(float((q * w * w).sum()) - p * p)  # the weights' exact spread under q
    draws = 4000
    layout = ids_layout(PREFIX, SUFFIX, model.config)
    cond = layout(k)
    fills = generate(model, condition=cond, num_samples=4, seed=0, order="l2r", policy="count")
    assert fills.orders[0].tolist() == [0, 1, 2 + k, 3 + k, *range(2, 2 + k)]  # the chain q is computed along
    estimate, weights = log_marginal(model, cond, draws, seed=11)
    assert weights.shape == (draws,)
    assert abs(math.exp(estimate) - p) < 4 * sd / math.sqrt(draws)
    # power: the marginal of the neighbouring length, or the fill's probability without the suffix, is far off
    assert abs(math.exp(estimate) - math.exp(exact(model, k + 1)[0])) > 8 * sd / math.sqrt(draws)


def test_the_choice_is_the_most_probable_length_and_reproducible() -> None:
    model = random_model("aogpt", n=12, vocab=7, seed=4, scale=0.6)
    layout = ids_layout(PREFIX, SUFFIX, model.config)
    assert candidate_lengths(layout, model.config) == list(range(1, 9))
    a = choose_length(model, layout, seed=5, draws=3)
    b = choose_length(model, layout, seed=5, draws=3)
    assert a == b and a.candidates == list(range(1, 9)) and abs(sum(a.posterior) - 1) < 1e-12
    assert a.length == a.candidates[max(range(8), key=lambda i: a.log_marginals[i])]
    c = choose_length(model, layout, seed=5, draws=3, candidates=[2, 3])
    assert c.candidates == [2, 3] and c.log_marginals == a.log_marginals[1:3]  # each length its own streams


def test_templates_and_refusals() -> None:
    from aogpt.data.tokenizer import ByteTokenizer

    tok, config = ByteTokenizer(), random_model("aogpt", n=32, vocab=257).config
    layout = template_layout("ab[MASK:?]cd[MASK:2]", tok, config, extra=1)
    cond = layout(3)
    assert cond.length == 2 + 3 + 2 + 2 + 1 and cond.positions.tolist() == [0, 1, 5, 6]
    with pytest.raises(AOGPTError, match="more than one"):
        template_layout("a[MASK:?]b[MASK:?]", tok, config)
    with pytest.raises(AOGPTError, match="needs text after it"):
        template_layout("ab[MASK:?][MASK:2]", tok, config)
    with pytest.raises(AOGPTError, match="needs text after it"):
        ids_layout([1], [], config)
    assert candidate_lengths(ids_layout([1] * 16, [2] * 15, config), config) == [1]  # the one place left
    with pytest.raises(AOGPTError, match="does not fit the model's context of 32"):
        candidate_lengths(ids_layout([1] * 16, [2] * 16, config), config)
    gpt = random_model("gpt", n=8)
    with pytest.raises(AOGPTError, match="cannot choose a gap's length"):
        choose_length(gpt, ids_layout([1], [2], gpt.config), seed=0)
