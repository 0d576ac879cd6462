"""The encoder-only MDM baseline against independent computations.

The reference for every conditional is `conditional`: one bidirectional forward whose only visible
tokens are the given context, read at one position. Losses are checked against exact enumeration
(all masks, all n! orders, all cuts), the sampler against the exact joint (chi-square).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from aogpt.checkpoint import load, save_checkpoint
from aogpt.config import model_config, to_dict, train_config
from aogpt.errors import AOGPTError
from aogpt.evaluation.evaluate import evaluate
from aogpt.families import family_of
from aogpt.families.encoder import (
    any_cut_estimate,
    draw_masks,
    l2r_cut_estimate,
    masked_diffusion_loss,
    mc_bound,
    order_nll,
    validation_losses,
    weighted_losses,
)
from aogpt.generation import laws
from aogpt.generation.generate import generate, infill
from aogpt.model import Transformer
from aogpt.train import RandomTokens, Trainer


def tiny_encoder(vocab: int = 5, block: int = 4, scale: float = 0.6, seed: int = 0) -> Transformer:
    """A random float64 encoder with large weights: conditionals far from uniform, context dependent."""
    torch.manual_seed(seed)
    model = Transformer(model_config("encoder-mdm", n_layer=2, n_head=2, n_embd=16, block_size=block,
                                     vocab_size=vocab))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, scale)
    return model.double().eval()


def conditional(model: Transformer, x: torch.Tensor, context: list[int] | tuple[int, ...], j: int) -> torch.Tensor:
    """log p(. | x[context]) at position j: its own forward, everything outside `context` masked."""
    n = x.shape[0]
    tokens = torch.full((1, n), -1, dtype=torch.long)
    for p in context:
        tokens[0, p] = x[p]
    with torch.no_grad():
        logits = model.forward_slots(tokens, torch.arange(1, n + 1)[None], select=torch.tensor([[j]]))[0, 0]
    return torch.log_softmax(logits.double(), -1)


def conditional_table(model: Transformer, x: torch.Tensor) -> torch.Tensor:
    """All n * 2^(n-1) order-invariant conditionals of x (paper Finding 5): table[S, j] =
    log p(x_j | x_S) for every context bitmask S, one row per S with exactly S visible."""
    n = x.shape[0]
    S = torch.arange(2 ** n)
    visible = (S[:, None] >> torch.arange(n)) & 1 == 1
    tokens = torch.where(visible, x, -1)
    with torch.no_grad():
        logits = model.forward_slots(tokens, torch.arange(1, n + 1).expand(2 ** n, n))
    return torch.log_softmax(logits.double(), -1).gather(2, x.expand(2 ** n, n)[..., None])[..., 0]


def order_logp(table: torch.Tensor, order: tuple[int, ...], sizes: list[int] | None = None) -> float:
    """log-probability of x along `order`, tokens of one step (sizes) conditioning on earlier steps only."""
    sizes = sizes or [1] * len(order)
    total, g, ctx = 0.0, 0, 0
    for k in sizes:
        for i in range(g, g + k):
            total += float(table[ctx, order[i]])
        for i in range(g, g + k):
            ctx |= 1 << order[i]
        g += k
    return total


def brute_force_order_nll(model: Transformer, x: torch.Tensor, order: tuple[int, ...]) -> float:
    return -order_logp(conditional_table(model, x), order)


def brute_force_any_order(model: Transformer, x: torch.Tensor) -> float:
    """E_sigma sum_i -log p(x_sigma_i | x_sigma_<i): mean over all n! orders."""
    table = conditional_table(model, x)
    orders = list(itertools.permutations(range(x.shape[0])))
    return -sum(order_logp(table, o) for o in orders) / len(orders)


def all_masks(n: int) -> list[tuple[float, torch.Tensor]]:
    """Every (probability, mask) of the training distribution: k ~ U{1..n}, then a uniform k-subset."""
    out = []
    for k in range(1, n + 1):
        for subset in itertools.combinations(range(n), k):
            mask = torch.zeros(n, dtype=torch.bool)
            mask[list(subset)] = True
            out.append((1.0 / n / math.comb(n, k), mask))
    return out


# ----------------------------------------------------------------------------- training objective
@pytest.mark.parametrize("n", [3, 4])
def test_training_loss_over_all_masks_equals_brute_force_any_order_loss(n):
    model = tiny_encoder(block=n, seed=n)
    idx = torch.randint(5, (3, n), generator=torch.Generator().manual_seed(n))
    masks = all_masks(n)
    assert abs(sum(p for p, _ in masks) - 1) < 1e-12
    stacked = torch.stack([m for _, m in masks])
    probs = torch.tensor([p for p, _ in masks], dtype=torch.float64)
    for b in range(idx.shape[0]):
        rows = idx[b].expand(len(masks), n)
        with torch.no_grad():
            _, losses = model(rows, mask=stacked)
        expected_loss = float((probs * weighted_losses(losses, stacked).sum(1)).sum())
        want = brute_force_any_order(model, idx[b])
        assert abs(expected_loss - want) < 1e-9 * max(1.0, want)
        # the identity has content: one fixed order (left to right) gives a different number
        assert abs(brute_force_order_nll(model, idx[b], tuple(range(n))) - want) > 1e-3


def test_masks_follow_the_training_distribution():
    """k ~ U{1..n} and a uniform subset of size k: every nonempty subset S has probability
    1 / (n * C(n, |S|)). Chi-square over the 15 subsets of n = 4."""
    n, draws = 4, 30000
    mask, k = draw_masks(draws, n, torch.Generator().manual_seed(3))
    assert torch.equal(mask.sum(1), k) and bool((k >= 1).all())
    codes = (mask.long() * (2 ** torch.arange(n))).sum(1).numpy()
    observed = np.bincount(codes, minlength=2 ** n)[1:]
    expected = np.array([1 / n / math.comb(n, bin(s).count("1")) for s in range(1, 2 ** n)]) * draws
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    assert np.bincount(codes, minlength=2 ** n)[0] == 0  # the empty mask never occurs


def test_training_loss_uses_the_drawn_masks_and_is_per_token():
    model = tiny_encoder(block=4)
    idx = torch.randint(5, (6, 4), generator=torch.Generator().manual_seed(1))
    loss = masked_diffusion_loss(model, idx, torch.Generator().manual_seed(9))
    mask, k = draw_masks(6, 4, torch.Generator().manual_seed(9))
    _, losses = model(idx, mask=mask)
    manual = torch.where(mask, losses, 0.0).sum(1) * 4 / k  # (n/k) * sum over masked: per sequence
    torch.testing.assert_close(loss.sum(1), manual)
    torch.testing.assert_close(loss.mean(), (manual / 4).mean())  # per token
    assert loss.requires_grad


def test_training_loss_through_a_ddp_style_wrapper():
    """The trainer may pass a DDP module: it is called, never bypassed."""
    model = tiny_encoder(block=4)

    class Wrapper(nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module
            self.calls = 0

        def forward(self, *a, **kw):
            self.calls += 1
            return self.module(*a, **kw)

    wrapped = Wrapper(model)
    idx = torch.randint(5, (2, 4))
    a = masked_diffusion_loss(wrapped, idx, torch.Generator().manual_seed(0))
    b = masked_diffusion_loss(model, idx, torch.Generator().manual_seed(0))
    assert wrapped.calls == 1 and torch.equal(a, b)
    l2r, anyo = validation_losses(wrapped, idx, torch.rand(2, 4).argsort(1))
    assert wrapped.calls == 3 and l2r.shape == anyo.shape == ()


def test_decoders_are_refused():
    dec = Transformer(model_config("aogpt", n_layer=1, n_head=2, n_embd=8, block_size=4, vocab_size=5, target_dim=4))
    with pytest.raises(AOGPTError, match="not an encoder-only MDM"):
        masked_diffusion_loss(dec, torch.zeros(1, 4, dtype=torch.long), None)
    with pytest.raises(AOGPTError, match="not an encoder-only MDM"):
        order_nll(dec, torch.zeros(1, 4, dtype=torch.long))


# ----------------------------------------------------------------------------- likelihoods
def test_exact_order_nll_equals_separate_single_position_conditionals():
    n = 6
    model = tiny_encoder(vocab=7, block=n, seed=2)
    g = torch.Generator().manual_seed(4)
    idx = torch.randint(7, (3, n), generator=g)
    order = torch.rand(3, n, generator=g).argsort(1)
    for o, budget in ((order, 3 * n), (None, None)):  # chunks of 3 rows, then one chunk
        got = order_nll(model, idx, o, token_budget=budget)
        oo = torch.arange(n).expand(3, n) if o is None else o
        for b in range(3):
            seq = tuple(int(p) for p in oo[b])
            want = [-float(conditional(model, idx[b], seq[:i], seq[i])[idx[b, seq[i]]]) for i in range(n)]
            torch.testing.assert_close(got[b], torch.tensor(want, dtype=got.dtype), atol=1e-10, rtol=0)


def test_mc_bound_is_the_weighted_masked_loss_and_unbiased():
    n = 4
    model = tiny_encoder(block=n, seed=7)
    x = torch.randint(5, (1, n), generator=torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(5)
    draws = torch.cat([mc_bound(model, x.expand(2000, n), g) for _ in range(2)])
    want = brute_force_any_order(model, x[0])
    se = float(draws.std()) / math.sqrt(len(draws))
    assert abs(float(draws.mean()) - want) < 4 * se
    mask, _ = draw_masks(3, n, torch.Generator().manual_seed(1))
    _, losses = model(x.expand(3, n), mask=mask)
    torch.testing.assert_close(mc_bound(model, x.expand(3, n), torch.Generator().manual_seed(1)),
                               weighted_losses(losses, mask).sum(1))


def test_validation_estimators_are_exactly_unbiased_and_reproducible():
    """Averaged over all cuts the left-to-right estimator is the exact NLL of every sequence; averaged
    over all cuts and all n! orders the any-order estimator is the any-order loss."""
    n = 4
    model = tiny_encoder(block=n, seed=11)
    idx = torch.randint(5, (2, n), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        l2r = sum(l2r_cut_estimate(model, idx, torch.full((2,), i)) for i in range(n)) / n
        torch.testing.assert_close(l2r, order_nll(model, idx).sum(1))
        perms = list(itertools.permutations(range(n)))
        total = torch.zeros(2, dtype=torch.float64)
        for perm in perms:
            order = torch.tensor(perm).expand(2, n)
            total += sum(any_cut_estimate(model, idx, order, torch.full((2,), i)) for i in range(n)) / n
    for b in range(2):
        assert abs(float(total[b]) / len(perms) - brute_force_any_order(model, idx[b])) < 1e-9
    order = torch.rand(2, n).argsort(1)
    first = validation_losses(model, idx, order)
    assert all(torch.equal(a, b) for a, b in zip(first, validation_losses(model, idx, order), strict=True))


def test_evaluate_dispatches_to_the_encoder():
    n = 5
    model = tiny_encoder(block=n, seed=3)
    data = torch.randint(5, (6, n), generator=torch.Generator().manual_seed(3))
    assert family_of(model).name == "encoder-mdm" and not family_of(model).ensemble
    res = evaluate(model, data, order="l2r", batch_size=4)
    assert abs(res.nll - float(order_nll(model, data).sum()) / data.numel()) < 1e-9
    bound = evaluate(model, data, order="random", num_orders=4, batch_size=4, seed=1)
    assert bound.num_orders == 4 and bound.se is not None and bound.se > 0
    want = sum(brute_force_any_order(model, row) for row in data) / data.numel()
    assert abs(bound.nll - want) < 6 * bound.se
    with pytest.raises(AOGPTError, match="ensembl"):
        evaluate(model, data, order="random", ensemble=2)


# ----------------------------------------------------------------------------- sampling
def exact_joint(model: Transformer, n: int, V: int, plans: list[tuple[float, list[int]]]) -> np.ndarray:
    """p(x) for every x in V^n: mean over orders, sum over plans (step sizes) of the product of the
    conditionals; tokens revealed in one step all condition on the context before that step."""
    probs = np.zeros(V ** n)
    orders = list(itertools.permutations(range(n)))
    for xi, x in enumerate(itertools.product(range(V), repeat=n)):
        table = conditional_table(model, torch.tensor(x))
        total = sum(w * math.exp(order_logp(table, o, sizes)) for o in orders for w, sizes in plans)
        probs[xi] = total / len(orders)
    return probs


def chi2_pvalue(tokens: torch.Tensor, V: int, probs: np.ndarray) -> float:
    """Chi-square goodness of fit (`aogpt.generation.laws`); outcomes expected fewer than 5 times are pooled."""
    return laws.chi2_pvalue(tokens, probs, V=V)


def test_sampler_one_token_per_step_matches_the_exact_joint():
    V, n, N = 3, 3, 24000
    model = tiny_encoder(vocab=V, block=n, scale=0.6, seed=5)
    res = generate(model, num_samples=N, length=n, steps=n, policy="count", seed=11, batch_size=N)
    exact = exact_joint(model, n, V, [(1.0, [1, 1, 1])])
    assert abs(exact.sum() - 1) < 1e-12
    assert chi2_pvalue(res.tokens, V, exact) > 1e-3
    # power: all three positions drawn in one step (independent marginals) is a different law
    assert chi2_pvalue(res.tokens, V, exact_joint(model, n, V, [(1.0, [3])])) < 1e-6


def test_sampler_parallel_bernoulli_steps_match_the_exact_joint():
    """Two Lemma 4.1 steps over 3 positions: counts ~ Binomial(3, 1/2), padded per-sequence batches."""
    V, n, N = 3, 3, 24000
    model = tiny_encoder(vocab=V, block=n, scale=0.6, seed=6)
    res = generate(model, num_samples=N, length=n, steps=2, policy="bernoulli", seed=12, batch_size=N)
    plans = [(math.comb(3, k) / 8, [k, 3 - k]) for k in range(4)]
    assert chi2_pvalue(res.tokens, V, exact_joint(model, n, V, plans)) > 1e-3
    assert chi2_pvalue(res.tokens, V, exact_joint(model, n, V, [(1.0, [1, 1, 1])])) < 1e-6


@pytest.mark.parametrize("kw", [dict(policy="bernoulli"), dict(policy="count", schedule="cosine"),
                                dict(policy="bernoulli", temperature=0.7, top_p=0.9, top_k=4, prompt=[1, 2])])
def test_noop_skipping_gives_identical_samples(kw):
    model = tiny_encoder(vocab=7, block=12, seed=8)
    args = dict(num_samples=6, length=12, steps=12, batch_size=2, record_logits=True) | kw
    for seed in (0, 1, 2):
        skip = generate(model, seed=seed, **args)
        full = generate(model, seed=seed, skip_noop=False, **args)
        assert torch.equal(skip.tokens, full.tokens) and torch.equal(skip.orders, full.orders)
        torch.testing.assert_close(skip.logits, full.logits, equal_nan=True, atol=0, rtol=0)
        assert full.timing["forwards"] == 12 * 3  # every step of the three batches ran its forward
        assert skip.timing["forwards"] < full.timing["forwards"]  # and some of them revealed nothing


def test_each_step_conditions_on_exactly_the_earlier_steps():
    """Recorded logits of every revealed position equal an independent forward whose context is the
    known tokens plus the tokens of earlier steps (never those revealed in the same step)."""
    model = tiny_encoder(vocab=7, block=10, seed=9)
    res = infill(model, [3, None, None, 5, None, None, None, 1, None, None], num_samples=4, steps=3,
                 policy="bernoulli", seed=4, record_logits=True, batch_size=3)
    for b in range(4):
        chain, x = res.orders[b], res.tokens[b]
        assert x[0] == 3 and x[3] == 5 and x[7] == 1
        assert chain[:3].tolist() == [0, 3, 7]
        g = 3
        for k in res.step_counts[b].tolist():
            for i in range(g, g + k):
                want = conditional(model, x, chain[:g].tolist(), int(chain[i]))
                got = torch.log_softmax(res.logits[b, i], -1)
                torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
            g += k
        assert g == 10 and torch.isnan(res.logits[b, :3]).all()


def test_prompts_orders_and_settings():
    model = tiny_encoder(vocab=7, block=8, seed=10)
    res = generate(model, num_samples=3, length=8, prompt=[4, 4, 2], steps=2, order="l2r", seed=0)
    assert (res.tokens[:, :3] == torch.tensor([4, 4, 2])).all()
    assert res.orders[0].tolist() == list(range(8))
    assert res.settings["variant"] == "encoder-mdm" and res.settings["use_cache"] is False
    greedy = [generate(model, num_samples=2, length=8, greedy=True, seed=s).tokens for s in (0, 1)]
    assert greedy[0].shape == (2, 8)
    again = generate(model, num_samples=3, length=8, prompt=[4, 4, 2], steps=2, order="l2r", seed=0)
    assert torch.equal(res.tokens, again.tokens)
    with pytest.raises(AOGPTError, match="steps"):
        generate(model, num_samples=1, length=8, steps=9)


# ----------------------------------------------------------------------------- trainer and checkpoints
def test_trains_validates_and_round_trips_through_a_checkpoint(tmp_path):
    V = 24
    mc = model_config("encoder-mdm", preset="tiny", vocab_size=V)
    tc = train_config("tiny", "encoder-mdm", max_steps=3, eval_batches=2)
    trainer = Trainer(mc, tc, RandomTokens(V), None, show_progress=False)
    losses = [trainer.train_step().loss for _ in range(3)]
    assert all(math.isfinite(x) for x in losses)
    first, second = trainer.evaluate(), trainer.evaluate()
    assert first == second and set(first) == {"val/l2r/raw", "val/any/raw", "val/l2r/ema", "val/any/ema"}
    assert all(math.log(V) - 1.5 < v < math.log(V) + 1.5 for v in first.values())
    save_checkpoint(tmp_path / "ckpt", trainer.raw, config={"model": to_dict(mc)})
    loaded = load(tmp_path / "ckpt", weights="raw")
    assert loaded.config.variant == "encoder-mdm"
    idx = torch.randint(V, (2, 8))
    torch.testing.assert_close(order_nll(loaded.model, idx), order_nll(trainer.raw.eval(), idx))
    out = loaded.generate(num_samples=2, length=8, steps=4, seed=0)
    assert out.tokens.shape == (2, 8) and int(out.tokens.max()) < V
