"""Likelihood evaluation against independent computations: per-prefix forwards, brute force over all
n! orders, the reference fixture's ensemble vectors, exact enumeration of position subsets."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from aogpt.config import model_config
from aogpt.errors import AOGPTError
from aogpt.evaluate import (
    draw_seed,
    ensemble_losses,
    ensemble_nll,
    ensemble_sequence_nll,
    evaluate,
    summarize,
    t_quantile,
)
from aogpt.families import FAMILIES, family_of, register
from aogpt.families.base import ModelFamily
from aogpt.model import Transformer
from tests.helpers import reference_aogpt, reference_expected


def tiny(variant: str, n: int = 8, vocab: int = 11, seed: int = 0) -> Transformer:
    """A small random model in float64 with *all* weights random (adaLN starts at zero otherwise)."""
    torch.manual_seed(seed)
    extra = {"target_dim": 8} if variant == "aogpt" else {}
    model = Transformer(model_config(variant, n_layer=2, n_head=2, n_embd=16, block_size=n, vocab_size=vocab, **extra))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.4)
    return model.double().eval().requires_grad_(False)


def prefix_conditional(model: Transformer, idx: torch.Tensor, order: list[int], i: int) -> float:
    """-log p(x[order[i]] | x[order[:i]]) from its own forward over exactly i + 1 slots."""
    x = idx[0]
    tokens = torch.tensor([[-1] + [int(x[p]) for p in order[:i]]])
    pos = torch.tensor([[0] + [p + 1 for p in order[:i]]])
    target = torch.tensor([order[: i + 1]])
    logits = model.forward_slots(tokens, pos, target)[0, -1]
    return float(-torch.log_softmax(logits, -1)[x[order[i]]])


@pytest.fixture(scope="module")
def fx() -> dict[str, np.ndarray]:
    return reference_expected()


# ------------------------------------------------------------------------------------ exact orders
@pytest.mark.parametrize("variant", ["gpt", "sigma", "aogpt"])
def test_l2r_nll_is_the_sum_of_separate_prefix_conditionals(variant: str) -> None:
    model = tiny(variant)
    data = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(1))
    total = 0.0
    for b in range(3):
        for i in range(8):  # a separate forward on each prefix x[:i+1]; its last step scores x[i]
            total += float(model(data[b:b + 1, : i + 1])[1][0, i])
    res = evaluate(model, data, order="l2r", batch_size=2)
    assert res.tokens == 24 and res.sequences == 3 and res.num_orders == 1 and res.se is None
    assert res.nll == pytest.approx(total / 24, abs=1e-12)
    assert res.ppl == pytest.approx(math.exp(total / 24), rel=1e-12)
    # the same through independent slot forwards (start slot + prefix, causal mask never exercised)
    brute = sum(prefix_conditional(model, data[b:b + 1], list(range(8)), i) for b in range(3) for i in range(8))
    assert brute == pytest.approx(total, abs=1e-10)


@pytest.mark.parametrize("variant", ["sigma", "aogpt"])
def test_any_order_bound_over_all_orders_equals_brute_force_and_sampling_is_unbiased(variant: str) -> None:
    n = 4
    model = tiny(variant, n=n, seed=3)
    data = torch.randint(0, 11, (3, n), generator=torch.Generator().manual_seed(2))
    kind = family_of(model)
    perms = list(itertools.permutations(range(n)))
    brute = np.zeros((3, len(perms)))  # NLL of sequence b under order p, from n separate forwards each
    for b in range(3):
        for k, p in enumerate(perms):
            brute[b, k] = sum(prefix_conditional(model, data[b:b + 1], list(p), i) for i in range(n))
    # the one-forward estimator is exact for every one of the n! orders
    for k, p in enumerate(perms):
        got = kind.order_nll(model, data, torch.tensor([p] * 3)).sum(1)
        np.testing.assert_allclose(got.numpy(), brute[:, k], atol=1e-10)
    exact = brute.mean(1).sum() / (3 * n)  # E_sigma NLL per token: the any-order bound
    # K random draws: mean within a CLT bound of the exact value (variance computed exactly)
    K = 400
    res = evaluate(model, data, order="random", num_orders=K, seed=7)
    sd_draw = math.sqrt(brute.var(1).sum()) / (3 * n)  # sd of one draw's mean (orders independent per seq)
    assert abs(res.nll - exact) < 4 * sd_draw / math.sqrt(K)
    assert res.se == pytest.approx(sd_draw / math.sqrt(K), rel=0.2)
    lo, hi = res.ci95
    assert lo < res.nll < hi and hi - lo == pytest.approx(2 * t_quantile(0.975, K - 1) * res.se)


def test_fixed_orders_are_deterministic_and_batching_does_not_matter() -> None:
    model = tiny("aogpt")
    data = torch.randint(0, 11, (5, 8), generator=torch.Generator().manual_seed(4))
    a = evaluate(model, data, order="blockwise:4", num_orders=5, batch_size=2)
    b = evaluate(model, data, order="blockwise:4", num_orders=1, batch_size=5)
    assert a.num_orders == 1 and a.nll == pytest.approx(b.nll, abs=1e-12)
    sigma = torch.tensor([0, 2, 3, 1, 4, 6, 7, 5])
    direct = float(model(data, sigma.expand(5, 8))[1].sum()) / 40
    assert a.nll == pytest.approx(direct, abs=1e-12)
    r1 = evaluate(model, data, order="random", num_orders=3, seed=5, batch_size=2)
    r2 = evaluate(model, data, order="random", num_orders=3, seed=5, batch_size=2)
    r3 = evaluate(model, data, order="random", num_orders=3, seed=6, batch_size=2)
    assert r1.order_means == r2.order_means and r1.order_means != r3.order_means


# ------------------------------------------------------------------------------------ ensembles
def test_ensemble_formula_reproduces_the_fixture(fx: dict) -> None:
    losses = torch.tensor(fx["ens_loss_f64"])[None]
    for m, want in zip((2, 4), fx["ens_nll_K2_K4"], strict=True):
        assert float(ensemble_nll(losses[..., :m]).mean()) == pytest.approx(float(want), abs=1e-12)
    assert float(ensemble_nll(losses[..., :1]).mean()) == pytest.approx(float(fx["ens_nll_base"]), abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ensemble_members_reproduce_the_fixture(fx: dict, dtype: torch.dtype) -> None:
    # The fixture's ens_* arrays were computed in float32 (their member-0 column equals
    # ao_ema_loss_tok_f32 bit for bit), so they hold to float32 precision only.
    model = reference_aogpt(dtype)
    idx, order = torch.tensor(fx["idx"][1:2]), torch.tensor(fx["orders"][1:2])
    members = torch.tensor(fx["ens_orders"])[None]
    losses = ensemble_losses(model, idx, order, 4, member_orders=members, token_budget=200)
    np.testing.assert_allclose(losses[0].numpy(), fx["ens_loss_f64"], atol=3e-6)
    for m, want in zip((2, 4), fx["ens_nll_K2_K4"], strict=True):
        assert float(ensemble_nll(losses[..., :m]).mean()) == pytest.approx(float(want), abs=1e-6)
    if dtype == torch.float64:  # the base order matches the float64 reference to 1e-10
        np.testing.assert_allclose(losses[0, :, 0].numpy(), fx["ao_ema_loss_tok_f64"][1], atol=1e-10)


@pytest.mark.parametrize("budget", [40, 1 << 14])
def test_batched_truncated_member_rows_equal_full_forwards(fx: dict, budget: int) -> None:
    model = reference_aogpt(torch.float64)
    idx, order = torch.tensor(fx["idx"][1:2]), torch.tensor(fx["orders"][1:2])
    members = torch.tensor(fx["ens_orders"])[None]
    losses = ensemble_losses(model, idx, order, 4, member_orders=members, token_budget=budget)
    for i in range(32):
        for j in range(1, 4):  # member j at step i: one full forward of its order, read at step i
            full = float(model(idx, members[:, i, j - 1])[1][0, i])
            assert float(losses[0, i, j]) == pytest.approx(full, abs=1e-10)


def test_random_members_are_uniform_permutations_of_the_context() -> None:
    n = 4
    model = tiny("aogpt", n=n, seed=5)
    idx = torch.randint(0, 11, (1, n), generator=torch.Generator().manual_seed(6))
    order = torch.tensor([[2, 0, 3, 1]])
    M = 601
    losses = ensemble_losses(model, idx, order, M, generator=torch.Generator().manual_seed(8))
    for i in (2, 3):
        ctx = order[0, :i].tolist()
        options = {}
        for perm in itertools.permutations(ctx):  # every ordering of the context, by brute force
            options[perm] = prefix_conditional(model, idx, list(perm) + order[0, i:].tolist(), i)
        values = np.array(list(options.values()))
        got = losses[0, i, 1:].numpy()
        match = np.abs(got[:, None] - values[None, :]).argmin(1)
        assert np.abs(got - values[match]).max() < 1e-10  # each member is one of the orderings
        counts = np.bincount(match, minlength=len(values))
        expect = (M - 1) / len(values)
        chi2 = ((counts - expect) ** 2 / expect).sum()
        assert chi2 < 25  # df <= 5: p < 1e-4 if the draws were not uniform
    assert torch.equal(losses[0, :2, 1:], losses[0, :2, :1].expand(2, M - 1))  # < 2 context tokens


def test_position_subset_estimator_is_unbiased_by_exact_enumeration() -> None:
    n, M, s = 6, 3, 2
    model = tiny("sigma", n=n, seed=9)
    idx = torch.randint(0, 11, (2, n), generator=torch.Generator().manual_seed(10))
    order = torch.stack([torch.randperm(n, generator=torch.Generator().manual_seed(k)) for k in range(2)])
    g = torch.Generator().manual_seed(11)
    members = torch.empty(2, n, M - 1, n, dtype=torch.long)
    for b in range(2):
        for i in range(n):
            for j in range(M - 1):
                perm = torch.randperm(i, generator=g)
                members[b, i, j] = torch.cat([order[b, :i][perm], order[b, i:]])
    full_losses = ensemble_losses(model, idx, order, M, member_orders=members)
    full = ensemble_sequence_nll(full_losses)
    subsets = list(itertools.combinations(range(2, n), s))
    estimates = []
    for sub in subsets:
        steps = torch.tensor([sub, sub])
        part = ensemble_losses(model, idx, order, M, member_orders=members, steps=steps)
        computed = part[:, list(sub), 1:]
        assert torch.allclose(computed, full_losses[:, list(sub), 1:], atol=1e-12)
        estimates.append(ensemble_sequence_nll(part, steps))
    np.testing.assert_allclose(torch.stack(estimates).mean(0).numpy(), full.numpy(), atol=1e-10)
    assert torch.stack(estimates).std(0).max() > 1e-4  # the estimator really varies with the subset


def test_evaluate_with_ensemble_matches_the_per_sequence_computation() -> None:
    model = tiny("aogpt", seed=12)
    data = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(13))
    res = evaluate(model, data, order="l2r", ensemble=3, num_orders=2, seed=3, batch_size=2)
    sums = []
    for k in range(2):  # the same draws, by hand: l2r base order, members from the k-th stream
        g = torch.Generator().manual_seed(draw_seed(3, "members", k))
        losses = ensemble_losses(model, data, torch.arange(8).expand(2, 8), 3, generator=g)
        sums.append(float(ensemble_sequence_nll(losses).sum()))
    assert res.order_means == pytest.approx([s / 16 for s in sums], abs=1e-12)
    base = evaluate(model, data, order="l2r")
    assert res.nll != pytest.approx(base.nll, abs=1e-6)
    part = evaluate(model, data, order="l2r", ensemble=3, ensemble_positions=2, num_orders=2, seed=3)
    assert part.ensemble_positions == 2 and np.isfinite(part.nll)


# ------------------------------------------------------------------------------------ statistics
def test_t_quantile_matches_scipy() -> None:
    from scipy import stats

    for df in (1, 2, 3, 4, 7, 15, 30, 200):
        assert t_quantile(0.975, df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-7)


def test_summary_statistics() -> None:
    sums = np.array([10.0, 12.0, 11.0, 14.0])
    res = summarize(sums, tokens=4, sequences=2, order="random")
    means = sums / 4
    se = means.std(ddof=1) / 2
    assert res.nll == pytest.approx(means.mean()) and res.se == pytest.approx(se)
    from scipy import stats

    half = stats.t.ppf(0.975, 3) * se
    assert res.ci95 == pytest.approx((means.mean() - half, means.mean() + half))
    assert res.ppl_ci95 == pytest.approx((math.exp(res.ci95[0]), math.exp(res.ci95[1])))


# ------------------------------------------------------------------------------------ bad input
def test_bad_requests_are_user_errors() -> None:
    gpt, ao = tiny("gpt"), tiny("aogpt")
    data = torch.randint(0, 11, (2, 8))
    cases = [
        (ao, data, dict(num_orders=0), "number of orders"),
        (ao, data, dict(ensemble=0), "ensemble size"),
        (ao, data, dict(ensemble=2, ensemble_positions=0), "ensemble-positions"),
        (gpt, data, dict(order="random"), "left to right only"),
        (gpt, data, dict(ensemble=2), "ensembling"),
        (ao, torch.randint(0, 11, (2, 9)), {}, "exceed the model's context"),
        (ao, torch.full((2, 8), 11), {}, "another tokenizer"),
        (ao, data, dict(order="sideways"), "unknown order spec"),
    ]
    for model, d, kw, what in cases:
        with pytest.raises(AOGPTError, match=what):
            evaluate(model, d, **kw)


def test_a_new_family_plugs_in_with_one_registry_line() -> None:
    """A family registered for a new variant supplies its own order NLL and Monte-Carlo bound;
    evaluation asks the family, never the variant name."""

    class Dummy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(1))
            self.config = SimpleNamespace(variant="dummy", block_size=4, vocab_size=5)

        def forward_slots(self, *args, **kwargs):  # an aogpt-style model (never called here)
            raise AssertionError("the family scores it")

    calls = []

    class DummyFamily(ModelFamily):
        def order_nll(self, model, idx, order):
            calls.append("order")
            return torch.full(idx.shape, 2.0)

        def mc_bound(self, model, idx, generator):
            calls.append("mc")
            return torch.full((idx.shape[0],), 4.0 * idx.shape[1] + torch.rand(1, generator=generator).item())

    register(DummyFamily(name="dummy", summary="a test family", architecture={}, default_order="uniform",
                         any_order=True))
    try:
        data = torch.zeros(3, 4, dtype=torch.long)
        assert evaluate(Dummy(), data, order="l2r").nll == pytest.approx(2.0)
        res = evaluate(Dummy(), data, order="random", num_orders=3)
        assert 4.0 < res.nll < 4.25 and res.se is not None
        assert calls.count("mc") == 3 and calls.count("order") == 1
        with pytest.raises(AOGPTError, match="ensembling"):
            evaluate(Dummy(), data, ensemble=2)
    finally:
        FAMILIES.pop("dummy")


def test_encoder_kind_is_dispatched_and_exact_under_l2r() -> None:
    """The encoder-only MDM's family (aogpt.families.encoder) scores it; its l2r NLL equals n separate forwards,
    step i with the positions >= i masked."""
    torch.manual_seed(0)
    model = Transformer(model_config("encoder-mdm", n_layer=2, n_head=2, n_embd=16, block_size=6, vocab_size=11))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.4)
    model = model.double().eval().requires_grad_(False)
    data = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(1))
    total = 0.0
    for b in range(2):
        for i in range(6):
            tokens = torch.where(torch.arange(6) < i, data[b], -1)[None]
            logits = model.forward_slots(tokens, torch.arange(1, 7)[None])[0, i]
            total -= float(torch.log_softmax(logits, -1)[data[b, i]])
    assert evaluate(model, data, order="l2r").nll == pytest.approx(total / 12, abs=1e-10)
    res = evaluate(model, data, order="random", num_orders=3)
    assert res.num_orders == 3 and math.isfinite(res.nll) and res.se is not None
    with pytest.raises(AOGPTError, match="ensembling"):
        evaluate(model, data, ensemble=2)

