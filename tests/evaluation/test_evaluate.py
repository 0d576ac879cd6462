"""Likelihood evaluation against independent computations: per-prefix forwards, brute force over all
n! orders, the reference fixture's ensemble vectors, exact enumeration of position subsets."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from aogpt.config import model_config
from aogpt.errors import AOGPTError
from aogpt.evaluation.ensemble import ensemble_losses, ensemble_sequence_nll
from aogpt.evaluation.evaluate import conditional_logprobs, evaluate, summarize
from aogpt.families import FAMILIES, family_of, register
from aogpt.families.base import ModelFamily
from aogpt.model import Transformer
from aogpt.seeds import draw_seed
from tests.helpers import prefix_conditional, random_model


# ------------------------------------------------------------------------------------ exact orders
@pytest.mark.parametrize("variant", ["gpt", "sigma", "aogpt"])
def test_l2r_nll_is_the_sum_of_separate_prefix_conditionals(variant: str) -> None:
    model = random_model(variant)
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
    model = random_model(variant, n=n, seed=3)
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
    assert lo < res.nll < hi and hi - lo == pytest.approx(2 * stats.t.ppf(0.975, K - 1) * res.se)


def test_fixed_orders_are_deterministic_and_batching_does_not_matter() -> None:
    model = random_model("aogpt")
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


def test_evaluate_with_ensemble_matches_the_per_sequence_computation() -> None:
    model = random_model("aogpt", seed=12)
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
def test_summary_statistics() -> None:
    sums = np.array([10.0, 12.0, 11.0, 14.0])
    res = summarize(sums, tokens=4, sequences=2, order="random")
    means = sums / 4
    se = means.std(ddof=1) / 2
    assert res.nll == pytest.approx(means.mean()) and res.se == pytest.approx(se)

    half = stats.t.ppf(0.975, 3) * se
    assert res.ci95 == pytest.approx((means.mean() - half, means.mean() + half))
    assert res.ppl_ci95 == pytest.approx((math.exp(res.ci95[0]), math.exp(res.ci95[1])))


# ------------------------------------------------------------------------------------ bad input
def test_bad_requests_are_user_errors() -> None:
    gpt, ao = random_model("gpt"), random_model("aogpt")
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
            return torch.full((idx.shape[0],), 4.0 * idx.shape[1] + torch.rand(1, generator=generator).item()), None

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



# ------------------------------------------------------------------------------------ explicit orders, per sequence
def test_explicit_orders_and_per_sequence_results_equal_separate_prefix_forwards() -> None:
    model = random_model("aogpt", n=6, seed=4)
    data = torch.randint(0, 11, (5, 6), generator=torch.Generator().manual_seed(8))
    orders = torch.stack([torch.randperm(6, generator=torch.Generator().manual_seed(s)) for s in range(5)])
    res = evaluate(model, data, order=orders, batch_size=2, per_sequence=True, num_orders=3)
    assert res.num_orders == 1 and res.order == "given"  # explicit orders are deterministic
    want = [sum(prefix_conditional(model, data[b:b + 1], orders[b].tolist(), i) for i in range(6)) for b in range(5)]
    np.testing.assert_allclose(res.sequence_nlls[0], want, atol=1e-10)
    assert res.orders[0] == orders.tolist()
    one = evaluate(model, data, order=orders[2], per_sequence=True)  # one order for every sequence
    for b in range(5):
        assert one.sequence_nlls[0][b] == pytest.approx(
            sum(prefix_conditional(model, data[b:b + 1], orders[2].tolist(), i) for i in range(6)), abs=1e-10)
    drawn = evaluate(model, data, order="random", num_orders=2, per_sequence=True, seed=3)
    for k in range(2):  # the orders reported are the ones scored
        again = evaluate(model, data, order=torch.tensor(drawn.orders[k]), per_sequence=True)
        np.testing.assert_allclose(again.sequence_nlls[0], drawn.sequence_nlls[k], atol=1e-10)
    with pytest.raises(AOGPTError, match="permutation"):
        evaluate(model, data, order=[0, 0, 1, 2, 3, 4])
    with pytest.raises(AOGPTError, match="more sequences"):
        evaluate(model, data, order=orders[:3])
    with pytest.raises(AOGPTError, match="left to right"):
        evaluate(random_model("gpt", n=6), data, order=orders)


@pytest.mark.parametrize("variant", ["sigma", "aogpt"])
def test_conditional_logprobs_equal_their_own_prefix_forward(variant: str) -> None:
    model = random_model(variant, n=7, seed=2)
    x = torch.randint(0, 11, (7,), generator=torch.Generator().manual_seed(5))
    context, targets = [5, 1, 3], [0, 6, 2, 4]
    got = conditional_logprobs(model, x, context, targets)
    assert got.shape == (4, 11)
    for r, t in enumerate(targets):
        want = -prefix_conditional(model, x[None], context + [t], 3)
        assert float(got[r, x[t]]) == pytest.approx(want, abs=1e-10)
    torch.testing.assert_close(got.exp().sum(-1), torch.ones(4, dtype=got.dtype))
    empty = conditional_logprobs(model, x, [], [4])  # no context: the start slot alone
    assert float(empty[0, x[4]]) == pytest.approx(-prefix_conditional(model, x[None], [4], 0), abs=1e-10)
    batch = conditional_logprobs(model, x.expand(2, 7), torch.tensor([context, [0, 1, 2]]), torch.tensor([[6], [3]]))
    torch.testing.assert_close(batch[0, 0], got[1])


def test_conditional_logprobs_for_gpt_and_the_encoder() -> None:
    gpt = random_model("gpt", n=6, seed=1)
    x = torch.randint(0, 11, (6,), generator=torch.Generator().manual_seed(2))
    got = conditional_logprobs(gpt, x, [0, 1, 2], [3])
    assert float(got[0, x[3]]) == pytest.approx(-prefix_conditional(gpt, x[None], [0, 1, 2, 3], 3), abs=1e-10)
    with pytest.raises(AOGPTError, match="next position"):
        conditional_logprobs(gpt, x, [0, 1, 2], [5])
    with pytest.raises(AOGPTError, match="left to right"):
        conditional_logprobs(gpt, x, [1, 0, 2], [3])
    enc = random_model("encoder-mdm", n=6, seed=3)
    got = conditional_logprobs(enc, x, [4, 0], [1, 5])
    masked = torch.full((1, 6), -1, dtype=torch.long)
    masked[0, [0, 4]] = x[[0, 4]]
    want = torch.log_softmax(enc.forward_slots(masked, torch.arange(1, 7)[None])[0, [1, 5]], -1)
    torch.testing.assert_close(got, want)
    with pytest.raises(AOGPTError, match="positions"):
        conditional_logprobs(enc, x, [9], [1])
