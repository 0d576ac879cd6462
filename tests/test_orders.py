"""Order samplers: their statistics and structure."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from aogpt.errors import AOGPTError
from aogpt.orders import blockwise_order, check_permutation, is_left_to_right, make_order_sampler


def draw(spec: str, batch: int = 4000, n: int = 6, seed: int = 0) -> torch.Tensor:
    return make_order_sampler(spec).sample(batch, n, "cpu", torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("spec", ["l2r", "uniform", "mixture", "mixture:0.5", "fixed-random:3", "blockwise",
                                  "blockwise:3:7"])
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


@pytest.mark.parametrize("spec", ["mixture:2", "mixture:x", "blockwise:1", "l2r:3", "fixed-random:a", ""])
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
