"""Context-order ensembling against independent computations: the reference fixture's ensemble
vectors, full forwards per member, exact enumeration of position subsets."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from aogpt.evaluation.ensemble import ensemble_losses, ensemble_nll, ensemble_sequence_nll
from tests.helpers import prefix_conditional, random_model, reference_aogpt, reference_expected


@pytest.fixture(scope="module")
def fx() -> dict[str, np.ndarray]:
    return reference_expected()


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
    model = random_model("aogpt", n=n, seed=5)
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
    model = random_model("sigma", n=n, seed=9)
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
