"""Exact self-speculative decoding, proven by tests: the empirical law of many speculative samples
matches the exact sequential any-order law (enumerated over all sequences and orders) by a
chi-square test, with a power check that the naive parallel sampler is rejected; k = 1 equals one
token per step draw for draw."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats

from aogpt.config import model_config
from aogpt.errors import AOGPTError
from aogpt.generation.generate import generate
from aogpt.model import Transformer
from aogpt.sampling import SamplingConfig, probabilities

N = 20000


def tiny(variant: str = "aogpt", vocab: int = 4, block: int = 4, seed: int = 0) -> Transformer:
    """A random float64 model with large weights: conditionals far from uniform and order dependent."""
    torch.manual_seed(seed)
    extra = {"target_dim": 8} if variant == "aogpt" else {}
    model = Transformer(model_config(variant, n_layer=2, n_head=2, n_embd=16, block_size=block, vocab_size=vocab,
                                     **extra))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.8)
    return model.double().eval()


def conditional(model: Transformer, chain: list[int], x: torch.Tensor, i: int, cfg: SamplingConfig,
                joint_parallel_from: int | None = None) -> torch.Tensor:
    """p(x[chain[i]] | x[chain[:c]]) for all rows of x (X, n), c = i (sequential) or the context a
    parallel step sees: one causal forward over the chain prefix with the target chain[i]."""
    c = i if joint_parallel_from is None else min(i, joint_parallel_from)
    X = x.shape[0]
    y = x[:, chain]
    tokens = torch.cat([torch.full((X, 1), -1), y[:, :c]], 1)
    prefix = torch.tensor(chain[:c], dtype=torch.long)
    pos = torch.cat([torch.tensor([0]), prefix + 1]).expand(X, c + 1)
    tgt = torch.cat([prefix, torch.tensor([chain[i]])]).expand(X, c + 1)
    with torch.no_grad():
        logits = model.forward_slots(tokens, pos, tgt)[:, -1]
    return probabilities(logits, cfg).gather(1, y[:, i:i + 1])[:, 0]


def exact_law(model: Transformer, n: int, V: int, cfg: SamplingConfig, known: dict[int, int] | None = None,
              parallel: bool = False) -> np.ndarray:
    """The law of x over V^n: known positions first, the rest in a uniform random order, each
    position drawn from its transformed conditional given everything before it in the chain
    (parallel=True: every unknown position given only the known ones, the naive one-step sampler)."""
    known = known or {}
    xs = torch.tensor(list(itertools.product(range(V), repeat=n)))
    consistent = torch.ones(len(xs), dtype=torch.bool)
    for p, tok in known.items():
        consistent &= xs[:, p] == tok
    free = [p for p in range(n) if p not in known]
    total = torch.zeros(len(xs), dtype=torch.float64)
    orders = list(itertools.permutations(free))
    for order in orders:
        chain = sorted(known) + list(order)
        prob = torch.ones(len(xs), dtype=torch.float64)
        for i in range(len(known), n):
            prob = prob * conditional(model, chain, xs, i, cfg, len(known) if parallel else None)
        total += prob
    return (total / len(orders) * consistent).numpy()


def chi2(tokens: torch.Tensor, V: int, law: np.ndarray, min_expected: float = 5.0) -> float:
    """The chi-square p-value of the samples under `law`; 0 if a sample is impossible under it. Cells
    expected fewer than `min_expected` times are pooled into one (else a single draw of a sequence of
    probability 1e-6, a legitimate event, decides the test)."""
    n = tokens.shape[1]
    codes = (tokens * (V ** torch.arange(n - 1, -1, -1))).sum(1).numpy()
    observed = np.bincount(codes, minlength=V ** n)
    keep = law > 0
    if observed[~keep].sum():
        return 0.0
    observed, expected = observed[keep], law[keep] / law[keep].sum() * observed.sum()
    small = expected < min_expected
    if small.any():
        observed = np.append(observed[~small], observed[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    return float(stats.chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("variant,k,sampling,known", [
    ("aogpt", 2, {}, None),
    ("aogpt", 4, {}, None),
    ("aogpt", "auto", dict(temperature=0.7), None),
    ("aogpt", 3, dict(top_k=3, temperature=1.3), None),
    ("aogpt", 4, dict(top_p=0.8), None),
    ("aogpt", 3, {}, {1: 2}),  # infilling: position 1 given
    ("sigma", 4, {}, None),
])
def test_speculative_samples_follow_the_exact_sequential_law(variant, k, sampling, known):
    V, n = 4, 4
    model = tiny(variant, vocab=V, block=n, seed=3)
    cfg = SamplingConfig(**sampling).validate()
    template = None if known is None else [known.get(p) for p in range(n)]
    kw = dict(num_samples=N, length=n, seed=7, batch_size=N, speculative=k, **sampling)
    if template is None:
        res = generate(model, **kw)
    else:
        from aogpt.generation.generate import infill

        res = infill(model, template, **{x: y for x, y in kw.items() if x != "length"})
    law = exact_law(model, n, V, cfg, known)
    assert abs(law.sum() - 1) < 1e-9
    assert chi2(res.tokens, V, law) > 1e-3
    # power: the naive parallel sampler's law (every position from the same context) is rejected
    assert chi2(res.tokens, V, exact_law(model, n, V, cfg, known, parallel=True)) < 1e-6
    assert res.timing["forwards"] < N * (n - len(known or {}))  # several tokens per forward on average
    assert all(0.0 <= a <= 1.0 for a in res.timing["acceptance_by_position"].values())


def test_one_draft_is_one_token_per_step_draw_for_draw():
    model = tiny("aogpt", vocab=11, block=8, seed=1)
    for kw in (dict(num_samples=6, length=8), dict(num_samples=5, length=8, prompt=[3, 4])):
        a = generate(model, seed=5, batch_size=3, speculative=1, **kw)
        b = generate(model, seed=5, batch_size=3, policy="count", **kw)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.orders, b.orders)
        assert a.timing["forwards"] == b.timing["forwards"]


def test_reports_forwards_tokens_per_forward_and_acceptance():
    model = tiny("aogpt", vocab=5, block=12, seed=2)
    res = generate(model, num_samples=4, length=12, seed=1, speculative=4, batch_size=4)
    t = res.timing
    assert t["tokens_per_forward"] == pytest.approx(12 / t["forwards"])  # one batch: each forward serves all
    assert 1.0 <= t["tokens_per_forward"] <= 4.0
    assert set(t["acceptance_by_position"]) <= {"1", "2", "3"}
    assert int(res.step_counts.sum()) == 48 and res.settings["speculative"] == 4
    assert (res.step_counts.sum(1) == 12).all()  # every sequence revealed every position once


@pytest.mark.parametrize("k", [8, "auto"])
def test_acceptance_counts_only_verified_drafts(k):
    """Near the end of a sequence, or with per-sequence draft lengths, the sequences of a batch verify
    different numbers of drafts; a fully accepted short draft must not count positions it never had.
    Recounted here from the accepted counts: never more accepted than verified at any position."""
    model = tiny("aogpt", vocab=3, block=14, seed=4)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.05)  # nearly flat conditionals: drafts are almost always accepted
    res = generate(model, num_samples=6, length=14, seed=2, speculative=k, batch_size=6)
    rates = res.timing["acceptance_by_position"]
    assert rates and all(0.0 <= a <= 1.0 for a in rates.values()), rates


def test_refusals():
    with pytest.raises(AOGPTError, match="cannot draft"):
        generate(tiny("gpt", vocab=5, block=6), num_samples=1, length=6, speculative=2)
    model = tiny("aogpt", vocab=5, block=6)
    for kw, match in ((dict(speculative=0), "draft length K"), (dict(speculative="fast"), "draft length K"),
                      (dict(speculative=2, steps=3), "steps and policy"),
                      (dict(speculative=2, record_logits=True), "its own tokens")):
        with pytest.raises(AOGPTError, match=match):
            generate(model, num_samples=1, length=6, **kw)
