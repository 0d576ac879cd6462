"""Order samplers: their statistics and structure."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from aogpt.errors import AOGPTError
from aogpt.orders import (
    ORDER_SPECS,
    blockwise_order,
    check_permutation,
    decode_ranks,
    inversions,
    is_left_to_right,
    make_order_sampler,
    mallows_log_normalizer,
)


def draw(spec: str, batch: int = 4000, n: int = 6, seed: int = 0) -> torch.Tensor:
    return make_order_sampler(spec).sample(batch, n, "cpu", torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("spec", ["l2r", "uniform", "mixture", "mixture:0.5", "fixed-random:3", "blockwise",
                                  "blockwise:3:7", "mallows:0.5", "mallows:0", "mallows:inf", "window:3",
                                  "window:1000"])
def test_every_row_is_a_permutation(spec):
    orders = draw(spec, batch=64, n=10)
    assert orders.shape == (64, 10) and torch.equal(check_permutation(orders, 10), orders)


def test_uniform_marginals_and_all_orders_appear():
    n, batch = 4, 24000
    orders = draw("uniform", batch=batch, n=n)
    for step in range(n):  # every position equally likely at every step
        counts = torch.bincount(orders[:, step], minlength=n).numpy()
        assert stats.chisquare(counts).pvalue > 1e-3
    keys = (orders * torch.tensor([n**3, n**2, n, 1])).sum(1)  # all 24 permutations, equally often
    counts = torch.bincount(keys, minlength=n**4).numpy()
    counts = counts[counts > 0]
    assert len(counts) == math.factorial(n)
    assert stats.chisquare(counts).pvalue > 1e-3


def test_mixture_fraction_of_left_to_right_rows():
    batch, n, p = 20000, 8, 0.1
    orders = draw("mixture", batch=batch, n=n)
    l2r = (orders == torch.arange(n)).all(1).float().mean().item()
    expected = p + (1 - p) / math.factorial(n)
    assert abs(l2r - expected) < 5 * math.sqrt(expected * (1 - expected) / batch)
    assert make_order_sampler("mixture:0.25").spec == "mixture:0.25"


def test_fixed_random_is_constant_across_steps_and_seeded():
    sampler = make_order_sampler("fixed-random:5")
    a = sampler.sample(3, 12, "cpu", torch.Generator().manual_seed(0))
    b = sampler.sample(3, 12, "cpu", torch.Generator().manual_seed(99))
    assert torch.equal(a, b) and torch.equal(a[0], a[1])
    assert not torch.equal(a[0], torch.arange(12))
    assert torch.equal(make_order_sampler("fixed-random:5").sample(1, 12)[0], a[0])
    assert not torch.equal(make_order_sampler("fixed-random:6").sample(1, 12)[0], a[0])


def test_blockwise_structure_matches_the_paper_example():
    assert blockwise_order(8, 4).tolist() == [0, 2, 3, 1, 4, 6, 7, 5]
    order = blockwise_order(10, 4)  # a short last block keeps the permutation's relative order
    assert order.tolist() == [0, 2, 3, 1, 4, 6, 7, 5, 8, 9]
    for k, seed in [(3, 0), (5, 1), (6, 2)]:
        order = blockwise_order(4 * k, k, seed)
        blocks = order.view(4, k)
        inner = blocks[0]
        assert not torch.equal(inner, torch.arange(k))  # non-identity inside the block
        for b in range(4):  # blocks left to right, the same permutation inside each
            assert torch.equal(blocks[b], inner + b * k)


@pytest.mark.parametrize("spec", ["mixture:2", "mixture:x", "blockwise:1", "l2r:3", "fixed-random:a", "", "mallows",
                                  "mallows:-1", "mallows:nan", "mallows:1:2", "window", "window:0", "window:2.5"])
def test_bad_specs_are_user_errors(spec):
    with pytest.raises(AOGPTError):
        make_order_sampler(spec)


def test_random_is_an_alias_of_uniform_with_the_same_stream():
    a = make_order_sampler("random").sample(5, 9, "cpu", torch.Generator().manual_seed(3))
    b = make_order_sampler("uniform").sample(5, 9, "cpu", torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and make_order_sampler("random").spec == "uniform"


def test_left_to_right_is_answered_for_specs_samplers_and_tensors():
    assert is_left_to_right("l2r") and is_left_to_right(make_order_sampler("l2r")) and is_left_to_right(None)
    assert not is_left_to_right("random") and not is_left_to_right("blockwise:4")
    assert is_left_to_right(torch.arange(5).expand(3, 5))
    assert not is_left_to_right(torch.tensor([[0, 1, 2], [0, 2, 1]]))


@pytest.mark.parametrize("bad", [[0, 0, 1], [0, 1], [[0, 1, 2], [2, 1, 0], [0, 1, 2]], [0, 1, 3], "abc"])
def test_explicit_orders_must_be_permutations_of_the_right_shape(bad):
    with pytest.raises(AOGPTError):
        check_permutation(bad, 3, rows=2)


# ------------------------------------------------------------------ Mallows and window orders: exact laws
def all_permutations(n: int) -> torch.Tensor:
    return torch.tensor(list(itertools.permutations(range(n))))


def empirical_counts(orders: torch.Tensor, perms: torch.Tensor) -> np.ndarray:
    """How often each of `perms` occurs among `orders` (every order must be one of them)."""
    n = perms.shape[1]
    weights = n ** torch.arange(n - 1, -1, -1)
    index = {int(k): i for i, k in enumerate((perms * weights).sum(1))}
    keys = (orders * weights).sum(1).tolist()
    return np.bincount([index[k] for k in keys], minlength=len(perms))


def mallows_law(perms: torch.Tensor, theta: float) -> np.ndarray:
    """exp(-theta inv) / Z with the closed-form normaliser."""
    n = perms.shape[1]
    return np.exp(-theta * inversions(perms).double().numpy() - mallows_log_normalizer(n, theta))


def window_law(perms: torch.Tensor, width: int) -> np.ndarray:
    """Enumerated law of window:W, computed independently of the sampler: a permutation is possible
    iff every step reads one of the W leftmost unread positions; then its probability is
    prod_t 1 / min(W, n - t)."""
    n = perms.shape[1]
    law = []
    for perm in perms.tolist():
        unread, p = list(range(n)), 1.0
        for t, pos in enumerate(perm):
            allowed = unread[:width]
            if pos not in allowed:
                p = 0.0
                break
            p /= min(width, n - t)
            unread.remove(pos)
        law.append(p)
    return np.array(law)


@pytest.mark.parametrize("n", [1, 2, 5, 7])
@pytest.mark.parametrize("theta", [0.0, 0.3, 1.7])
def test_mallows_normaliser_is_the_sum_over_all_permutations(n, theta):
    brute = torch.logsumexp(-theta * inversions(all_permutations(n)).double(), 0).item()
    assert mallows_log_normalizer(n, theta) == pytest.approx(brute, rel=1e-12, abs=1e-12)


def test_inversions_count_pairs_against_the_text():
    assert inversions(torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0], [1, 0, 3, 2]])).tolist() == [0, 6, 2]


def test_decode_ranks_is_a_bijection_onto_the_permutations():
    n = 4
    codes = torch.tensor(list(itertools.product(*[range(n - t) for t in range(n)])))
    orders = decode_ranks(codes)
    assert len({tuple(o) for o in orders.tolist()}) == math.factorial(n)
    assert torch.equal(inversions(orders), codes.sum(1))  # a rank vector is the Lehmer code


@pytest.mark.parametrize("theta", [0.0, 0.7, 2.0])
def test_mallows_law_matches_the_closed_form(theta):
    n, batch = 4, 48000
    perms = all_permutations(n)
    counts = empirical_counts(draw(f"mallows:{theta}", batch=batch, n=n, seed=11), perms)
    expected = mallows_law(perms, theta) * batch
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    if theta > 0:  # power: the same draws clearly reject a nearby wrong dispersion
        wrong = mallows_law(perms, theta * 1.25) * batch
        assert stats.chisquare(counts, wrong).pvalue < 1e-6


def test_mallows_extremes_and_mean_inversions():
    n = 12
    assert torch.equal(draw("mallows:inf", batch=50, n=n), torch.arange(n).expand(50, n))
    assert torch.equal(draw("mallows:60", batch=50, n=n), torch.arange(n).expand(50, n))
    # E[inv] in closed form: sum over the Lehmer code of truncated geometric means
    theta, batch = 0.4, 20000
    q = math.exp(-theta)
    mean = sum(sum(k * q**k for k in range(m)) / sum(q**k for k in range(m)) for m in range(1, n + 1))
    inv = inversions(draw(f"mallows:{theta}", batch=batch, n=n, seed=5)).double()
    assert abs(inv.mean().item() - mean) < 5 * inv.std().item() / math.sqrt(batch)
    tiny = inversions(draw("mallows:1e-9", batch=batch, n=n, seed=6)).double().mean().item()
    assert abs(tiny - n * (n - 1) / 4) < 0.3  # theta -> 0 is uniform: n(n-1)/4 inversions on average


@pytest.mark.parametrize("width", [2, 3])
def test_window_law_matches_its_enumeration(width):
    n, batch = 5, 40000
    perms = all_permutations(n)
    law = window_law(perms, width)
    counts = empirical_counts(draw(f"window:{width}", batch=batch, n=n, seed=3), perms)
    support = law > 0
    assert counts[~support].sum() == 0  # nothing outside the window's reach
    assert stats.chisquare(counts[support], law[support] * batch).pvalue > 1e-3
    # power: a slightly biased sampler (ranks skewed towards the leftmost position) is rejected
    u = torch.rand(batch, n, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    skewed = decode_ranks(torch.floor(u**1.15 * torch.arange(n, 0, -1).clamp(max=width)).long())
    biased = empirical_counts(skewed, perms)
    assert biased[~support].sum() == 0
    assert stats.chisquare(biased[support], law[support] * batch).pvalue < 1e-6


def test_window_extremes():
    n = 9
    assert torch.equal(draw("window:1", batch=20, n=n), torch.arange(n).expand(20, n))
    perms = all_permutations(4)
    counts = empirical_counts(draw("window:4", batch=24000, n=4, seed=2), perms)
    assert stats.chisquare(counts).pvalue > 1e-3  # W >= n is uniform
    order = draw("window:3", batch=5000, n=30, seed=4)
    early = (order - torch.arange(30)).max().item()  # how far ahead of its left-to-right turn a position is read
    late = (torch.arange(30) - order).max().item()
    assert early == 2 and late > 2  # at most W - 1 steps early, but a position may wait longer


def test_new_specs_are_listed_and_named():
    assert "mallows:THETA" in ORDER_SPECS and "window:W" in ORDER_SPECS
    assert make_order_sampler("mallows:0.50").spec == "mallows:0.5"
    assert make_order_sampler("window:08").spec == "window:8"
    assert not make_order_sampler("mallows:1").is_fixed and not is_left_to_right("window:4")


# ---------------------------------------------------------------- curricula (training order schedules)


def test_infilling_orders_read_a_prefix_the_text_after_a_gap_then_the_gap():
    from aogpt.orders import INFILL_SPANS, identity_run

    n = 40
    orders = draw("infill", batch=500, n=n)
    assert torch.equal(check_permutation(orders, n), orders)
    lengths = set()
    for o in orders.tolist():
        run = next((i for i, p in enumerate(o) if p != i), n)
        rest = o[run:]
        if not rest:  # the gap ran to the end: the whole order is left to right
            continue
        k = rest.index(run)  # the gap starts where the prefix ends, and is read last
        suffix, gap = rest[:k], rest[k:]
        assert gap == list(range(run, run + len(gap))) and suffix == list(range(run + len(gap), n))
        lengths.add(len(gap))
    assert lengths <= {min(g, n) for g in INFILL_SPANS} | {0} and {8, 32} <= lengths
    fixed = draw("infill:5", batch=200, n=12)
    assert all(sorted(o[12 - 5:]) == o[12 - 5:] and o[-1] - o[-5] == 4 for o in fixed.tolist())
    assert (identity_run(fixed) >= 0).all() and make_order_sampler("infill:5").spec == "infill:5"


def test_a_blend_draws_each_order_kind_in_its_share():
    n, batch = 8, 20000
    orders = draw("uniform*0.7+l2r*0.3", batch=batch, n=n)
    l2r = (orders == torch.arange(n)).all(1).float().mean().item()
    expected = 0.3 + 0.7 / math.factorial(n)
    assert abs(l2r - expected) < 5 * math.sqrt(expected * (1 - expected) / batch)
    assert make_order_sampler("uniform*3+infill*1").spec == "uniform*0.75+infill*0.25"
    assert is_left_to_right("l2r*0.5+mallows:inf*0.5") and not is_left_to_right("l2r*0.5+uniform*0.5")
    for bad in ("uniform+infill", "uniform*-1+infill*1", "uniform*0+infill*0", "uniform*0.5", "uniform*0.5+nope*0.5"):
        with pytest.raises(AOGPTError):
            make_order_sampler(bad)


def test_the_gate_is_the_leading_identity_run_however_it_is_computed():
    from aogpt.config import model_config
    from aogpt.model import Transformer
    from aogpt.orders import gates, identity_run, left_to_right_slots, step_gates

    n = 9
    orders = draw("uniform*0.4+infill:3*0.4+l2r*0.2", batch=300, n=n)
    model = Transformer(model_config("aogpt", preset="tiny", vocab_size=11, block_size=n))
    tokens, pos, target = model.slots_for_order(torch.zeros(300, n, dtype=torch.long), orders)
    assert torch.equal(~left_to_right_slots(pos, target), gates(orders))
    run = identity_run(orders)
    rows = torch.arange(300)[:, None].expand(300, n)
    assert torch.equal(step_gates(run, rows, torch.arange(n).expand(300, n), pos, target), gates(orders))
    assert torch.equal(gates(orders).sum(1), n - run)
