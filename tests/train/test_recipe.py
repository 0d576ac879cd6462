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


# ---------------------------------------------------------------- the hold: how replay and distillation let go


def _ranks(order: list[int]) -> list[int]:
    """By definition: at step t, how many positions not yet read lie left of the one read."""
    return [sum(1 for s in order[t + 1:] if s < order[t]) for t in range(len(order))]


def _brute_leftmost_share(law: dict[tuple[int, ...], float]) -> float:
    return sum(p * _ranks(list(perm)).count(0) / len(perm) for perm, p in law.items())


def _laws(n: int) -> dict[str, dict[tuple[int, ...], float]]:
    import itertools
    import math

    perms = list(itertools.permutations(range(n)))
    inv = {p: sum(r for r in _ranks(list(p))) for p in perms}

    def mallows(theta):
        w = {p: math.exp(-theta * inv[p]) for p in perms}
        z = sum(w.values())
        return {p: v / z for p, v in w.items()}

    def window(width):  # each step draws one of the `width` leftmost unread positions uniformly
        law = {}
        for p in perms:
            r = _ranks(list(p))
            ok = all(r[t] < min(width, n - t) for t in range(n))
            law[p] = math.prod(1 / min(width, n - t) for t in range(n)) if ok else 0.0
        return law

    uniform = {p: 1 / len(perms) for p in perms}
    ident = tuple(range(n))
    mixture = {p: 0.7 * v + (0.3 if p == ident else 0.0) for p, v in uniform.items()}
    return {"uniform": uniform, "mallows:0.7": mallows(0.7), "mallows:3": mallows(3.0), "window:2": window(2),
            "mixture:0.3": mixture, "l2r": {ident: 1.0}, "mallows:0": uniform}


@pytest.mark.parametrize("spec", ["uniform", "mallows:0.7", "mallows:3", "mallows:0", "window:2", "mixture:0.3",
                                  "l2r"])
def test_the_leftmost_share_equals_the_enumerated_law(spec):
    from aogpt.orders import make_order_sampler

    n = 6
    exact = _brute_leftmost_share(_laws(n)[spec])
    assert recipe.leftmost_share(make_order_sampler(spec), n) == pytest.approx(exact, rel=1e-9)


def test_the_leftmost_share_of_fixed_orders_counts_their_own_steps():
    from aogpt.orders import make_order_sampler

    for spec in ("blockwise:4", "fixed-random:3", "blockwise:3:1"):
        sampler = make_order_sampler(spec)
        perm = sampler.permutation(10).tolist()
        assert recipe.leftmost_share(sampler, 10) == _ranks(perm).count(0) / 10
    # 0 2 3 1 | 4 6 7 5: ranks 0, 1, 1, 0 in each block
    assert recipe.leftmost_share(make_order_sampler("blockwise:4"), 8) == 4 / 8


def _hold_cfg(**over):
    from aogpt.config import train_config

    return train_config(None, "aogpt", **{"max_steps": 100, "order": "mixture", "replay_l2r": 0.5,
                                          "curriculum": "l2r@10%,mallows:4..0.05@40%", "hold_floor": 0.2, **over})


def test_the_hold_at_the_stage_boundaries_and_its_floor():
    from aogpt.orders import Mallows, make_order_sampler

    n = 16
    hold = recipe.Hold(_hold_cfg(), n)
    final = recipe.leftmost_share(make_order_sampler("mixture"), n)

    def expected(theta):
        share = recipe.leftmost_share(Mallows(theta), n)
        return 0.2 + 0.8 * min(1.0, max(0.0, (share - final) / (1 - final)))

    assert [hold(s) for s in range(10)] == [1.0] * 10  # the left-to-right opening: full weight
    assert hold(10) == pytest.approx(expected(4.0)) and 0.9 < hold(10) < 1.0  # the ramp's first step
    assert hold(39) == pytest.approx(expected(0.05))  # its last
    assert all(hold(s) == 0.2 for s in range(40, 100))  # the run's own orders: the floor
    ramp = [hold(s) for s in range(10, 40)]
    assert all(a >= b for a, b in zip(ramp, ramp[1:], strict=False)) and ramp[0] > ramp[-1]
    assert recipe.Hold(_hold_cfg(hold_floor=1.0), n)(50) == 1.0  # the default: a constant weight
    assert recipe.Hold(_hold_cfg(hold_floor=0.0), n)(50) == 0.0
    assert recipe.Hold(_hold_cfg(order="l2r"), n)(50) == 1.0  # a run that reads left to right lets nothing go
    # scaled with the run: the same spec in a run twice as long keeps full weight twice as long
    assert recipe.Hold(_hold_cfg(max_steps=200), n)(19) == 1.0 and recipe.Hold(_hold_cfg(max_steps=200), n)(79) < 1


def test_the_hold_climbs_back_over_the_learning_rates_decay():
    """hold_anneal: from the floor at the decay's start (step 80 of 100, decay_share 0.2) linearly to the anneal
    weight at its end, as the rate goes to min_lr; before the decay the curriculum's hold alone; under a time
    budget, where the schedule placed the decay."""
    from aogpt.train import LRSchedule

    n = 16
    cfg = _hold_cfg(hold_floor=0.1, hold_anneal=0.9, lr_schedule="wsd", decay_share=0.2)
    hold, plain = recipe.Hold(cfg, n), recipe.Hold(_hold_cfg(hold_floor=0.1), n)
    assert [hold(s) for s in range(80)] == [plain(s) for s in range(80)]
    # step for step with the rate: the decay's first step (80) has 1/20 of it, its last (99) all of it
    assert hold(80) == pytest.approx(0.1 + 0.8 / 20) and hold(89) == pytest.approx(0.1 + 0.8 * 0.5)
    assert hold(99) == pytest.approx(0.9) and hold(150) == pytest.approx(0.9)
    lr = recipe.Hold(cfg, n).schedule
    decayed = [(lr.lr(s) - cfg.lr) / (cfg.min_lr - cfg.lr) for s in range(80, 100)]
    assert [(hold(s) - 0.1) / 0.8 for s in range(80, 100)] == pytest.approx(decayed)
    assert recipe.Hold(_hold_cfg(hold_floor=0.5, hold_anneal=0.2), n)(99) == 0.5  # below the floor: no effect
    timed = LRSchedule(_hold_cfg(lr_schedule="wsd", max_minutes=1.0, max_steps=10**6))
    timed.decay_start, timed.decay_steps = 50, 10  # as `observe` decides from the clock (and a resume restores)
    late = recipe.Hold(_hold_cfg(hold_floor=0.1, hold_anneal=0.9, lr_schedule="wsd", max_minutes=1.0,
                                 max_steps=10**6, curriculum="l2r@5"), n, timed)
    assert late(49) == pytest.approx(0.1) and late(54) == pytest.approx(0.5) and late(59) == pytest.approx(0.9)


def test_replay_and_distillation_follow_the_hold_in_training(monkeypatch):
    """Once the orders are the run's own, the replayed share is replay_l2r x the floor (chi-square, with
    power against the unheld share), and the KL weight handed to the loss is distill_l2r x the hold."""
    t = make(None, order="uniform", curriculum="l2r@3,mallows:1..0.5@6", replay_l2r=0.5, hold_floor=0.4,
             batch_size=8, max_steps=1000)
    counts = np.zeros(9)
    for step in range(6, 406):
        t.step = step
        counts[int(recipe.left_to_right_rows(t._global_batch()[1]).sum())] += 1
    assert _pvalue(counts, _binomial(8, 0.2)) > 1e-3
    assert _pvalue(counts, _binomial(8, 0.5)) < 1e-6

    from aogpt.train import step as step_module

    weights = []
    monkeypatch.setattr(step_module, "distilled_loss",
                        lambda model, teacher, idx, order, weight, gen: weights.append(weight) or
                        model(idx, order)[1].mean())
    t = make(None, order="uniform", curriculum="l2r@3,mallows:1..0.5@6", max_steps=10, hold_floor=0.4)
    t.optimizer_step.teacher, t.cfg.distill_l2r = object(), 2.0  # any teacher: the loss is replaced above
    for _ in range(10):
        t.train_step()
    assert weights == pytest.approx([2.0 * t.hold(s) for s in range(10)])
    assert weights[:3] == [2.0] * 3 and weights[6:] == pytest.approx([0.8] * 4)


def test_the_hold_travels_in_checkpoints_and_a_resumed_run_follows_it(tmp_path):
    """A run letting go, cut in the middle of its ramp and resumed from the checkpoint, trains exactly as the
    uninterrupted one (the same records and weights); the checkpoint's config carries the floor, and a
    config written before the hold existed reads as a constant weight."""
    import json

    from aogpt.checkpoint import list_checkpoints, read_config
    from aogpt.config import TrainConfig, apply_overrides
    from tests.train.runs import records, stop_after

    source = tmp_path / "source"
    source.mkdir()
    make(source, max_steps=2, ckpt_interval=2).fit()
    over = dict(curriculum="l2r@2,mallows:2..0.1@8", replay_l2r=0.5, distill_l2r=1.0, hold_floor=0.3, hold_anneal=0.8,
                lr_schedule="wsd", decay_share=0.25, init_from=str(source), max_steps=12)
    (tmp_path / "full").mkdir()
    make(tmp_path / "full", **over).fit()
    (tmp_path / "cut").mkdir()
    first = make(tmp_path / "cut", **over)
    stop_after(first, 6)
    first.fit()
    saved = read_config(list_checkpoints(tmp_path / "cut")[-1])["train"]
    assert (saved["hold_floor"], saved["hold_anneal"]) == (0.3, 0.8)
    second = make(tmp_path / "cut", **over)
    second.resume(list_checkpoints(tmp_path / "cut")[-1])
    assert second.step == 6 and second.hold(6) == first.hold(6) < 1
    second.fit()
    assert records(tmp_path / "cut") == records(tmp_path / "full")
    holds = {r["step"]: r["hold"] for r in records(tmp_path / "full") if r["kind"] == "train"}
    # the weight of each logged step's last update (step - 1): the opening (1), the floor (7), the climb (9-11)
    assert holds[2] == 1.0 and holds[8] == pytest.approx(0.3) and holds[10] == pytest.approx(0.3 + 0.5 * 1 / 3)
    assert holds[12] == pytest.approx(0.8)
    a = torch.load(list_checkpoints(tmp_path / "full")[-1] / "trainer.pt", weights_only=True)
    b = torch.load(list_checkpoints(tmp_path / "cut")[-1] / "trainer.pt", weights_only=True)
    assert torch.equal(a["order_gen"], b["order_gen"])
    from aogpt.checkpoint import read_weights

    wa, wb = read_weights(list_checkpoints(tmp_path / "full")[-1]), read_weights(list_checkpoints(tmp_path / "cut")[-1])
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    older = {k: v for k, v in saved.items() if k != "hold_floor"}
    assert apply_overrides(TrainConfig(), json.loads(json.dumps(older)), "train config").hold_floor == 1.0
