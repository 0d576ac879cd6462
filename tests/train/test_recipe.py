"""The adaptation recipe's parts (`aogpt.train.recipe`): replay's law, distillation's KL, the rates of
the parameter roles."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from scipy import stats

from aogpt.train import recipe
from tests.helpers import random_model
from tests.train.runs import make


def _binomial(n: int, p: float) -> np.ndarray:
    return stats.binom.pmf(np.arange(n + 1), n, p)


def _pvalue(counts: np.ndarray, law: np.ndarray) -> float:
    """Chi-square of `counts` against `law`, the cells expected fewer than 5 times lumped into one."""
    expected = law * counts.sum()
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    return stats.chisquare(obs, exp).pvalue


def test_replay_rows_follow_a_binomial_law_and_keep_the_other_rows():
    B, n, share, batches = 8, 12, 0.25, 3000
    g = torch.Generator().manual_seed(0)
    counts = np.zeros(B + 1)
    for _ in range(batches):
        order = torch.stack([torch.randperm(n, generator=g) for _ in range(B)])
        out = recipe.replay_rows(order, share, g)
        l2r = recipe.left_to_right_rows(out)
        assert torch.equal(out[~l2r], order[~l2r])  # the rest untouched
        assert not recipe.left_to_right_rows(order).any()  # (a uniform order is l2r with chance 1/12!)
        counts[int(l2r.sum())] += 1
    assert _pvalue(counts, _binomial(B, share)) > 1e-3
    assert _pvalue(counts, _binomial(B, share + 0.05)) < 1e-6  # power: the same draws reject a share 0.05 away


def test_replay_starts_after_the_left_to_right_stages_and_its_share_holds_in_training():
    t = make(None, order="uniform", curriculum="l2r@3,mallows:0.2..0.1@5", replay_l2r=0.5, batch_size=8)
    assert t.replay_from == 3
    counts = np.zeros(9)
    for step in range(3, 403):
        t.step = step
        _, order = t._global_batch()
        counts[int(recipe.left_to_right_rows(order).sum())] += 1
    assert _pvalue(counts, _binomial(8, 0.5)) > 1e-3
    assert _pvalue(counts, _binomial(8, 0.4)) < 1e-6
    # before replay begins the streams are those of a run without it; at its first step the rows not
    # replayed are that run's rows
    plain = make(None, order="uniform", curriculum="l2r@3", batch_size=8)
    replayed = make(None, order="uniform", curriculum="l2r@3", batch_size=8, replay_l2r=0.5)
    for step in range(4):
        plain.step = replayed.step = step
        a, b = plain._global_batch()[1], replayed._global_batch()[1]
        kept = ~recipe.left_to_right_rows(b)
        assert torch.equal(a[kept], b[kept]) and (step < 3 or 0 < int(kept.sum()) < 8)


def test_the_kl_term_is_zero_for_the_source_itself_and_exact_otherwise():
    model = random_model("aogpt", n=8, vocab=11, seed=0).train()
    idx = torch.randint(0, 11, (4, 8), generator=torch.Generator().manual_seed(1))
    order = torch.stack([torch.randperm(8, generator=torch.Generator().manual_seed(i)) for i in range(4)])
    order[1] = torch.arange(8)
    order[3] = torch.arange(8)
    g = torch.Generator()
    plain = model(idx, order)[1].mean()
    same = recipe.distilled_loss(model, copy.deepcopy(model), idx, order, 3.0, g)
    torch.testing.assert_close(same, plain, atol=1e-6, rtol=0)
    student = random_model("aogpt", n=8, vocab=11, seed=5).train()
    got = recipe.distilled_loss(student, model, idx, order, 3.0, g) - student(idx, order)[1].mean()
    # independently: each left-to-right row read alone, KL of torch.distributions, token by token
    kls = []
    for b in (1, 3):
        t_logits, s_logits = model(idx[b : b + 1])[0][0], student(idx[b : b + 1])[0][0]
        for i in range(8):
            p, q = (torch.distributions.Categorical(logits=x[i].double()) for x in (t_logits, s_logits))
            kls.append(float(torch.distributions.kl_divergence(p, q)))
    assert got.item() == pytest.approx(3.0 * sum(kls) / len(kls), rel=1e-4)
    assert got.item() > 0.01


def _first_step_moves(t) -> dict[str, float]:
    """Adam's first update is lr * g / (|g| + eps): each weight moves by its group's rate (where its gradient
    is well above eps), whatever the gradient. The median move per parameter, after one step."""
    before = {k: p.detach().clone() for k, p in t.raw.named_parameters()}
    t.train_step()
    moves = {}
    for k, p in t.raw.named_parameters():
        d = (p.detach() - before[k]).abs().flatten()
        d = d[d > 0]
        if d.numel():
            moves[k] = float(d.median())
    return moves


def test_parameter_roles_get_their_rates():
    t = make(None, lr=1e-3, warmup_steps=0, weight_decay=0.0, backbone_lr_mult=0.1, target_lr_mult=5.0,
             lr_schedule="cosine", max_steps=100)
    target = set(t.raw.target_pathway())
    assert target and {id(p) for g in t.optimizer.param_groups for p in g["params"]} == \
        {id(p) for p in t.raw.parameters()}
    moves = _first_step_moves(t)
    assert moves
    for name, move in moves.items():
        want = 5e-3 if name in target else 1e-4
        assert move == pytest.approx(want, rel=0.05), name
