"""The order curriculum (`aogpt.curriculum`): stages then the run's order, Mallows ramps drawing their
step's exact law, stage ends in steps or as shares of the run, and malformed specs refused."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from aogpt.curriculum import make_curriculum
from aogpt.errors import AOGPTError
from tests.test_orders import all_permutations, empirical_counts, mallows_law


def curriculum_draws(spec: str, final: str, step: int, batch: int, n: int, seed: int) -> torch.Tensor:
    return make_curriculum(spec, final).sample(step, batch, n, "cpu", torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("step, theta", [(10, 3.0), (15, 3.0 * (0.3 / 3.0) ** 0.5), (20, 0.3)])
def test_a_mallows_ramp_draws_the_closed_form_law_of_its_step(step, theta):
    """l2r@10,mallows:3..0.3@21: steps 10..20 ramp the dispersion geometrically from 3 to 0.3; each
    step's draws follow Mallows(theta(step)) exactly, and reject the law of another step of the ramp."""
    n, batch = 4, 40000
    perms = all_permutations(n)
    counts = empirical_counts(curriculum_draws("l2r@10,mallows:3..0.3@21", "uniform", step, batch, n, 7), perms)
    assert stats.chisquare(counts, mallows_law(perms, theta) * batch).pvalue > 1e-3
    other = 0.3 if step != 20 else 3.0 * (0.3 / 3.0) ** 0.8  # power: a neighbouring step's law is rejected
    assert stats.chisquare(counts, mallows_law(perms, other) * batch).pvalue < 1e-6


def test_curriculum_stages_then_the_runs_order():
    cur = make_curriculum("l2r@5,window:2@9", "mixture:0.3")
    assert cur.length == 9 and cur.at(0).left_to_right and cur.at(4).left_to_right
    assert cur.at(5).spec == "window:2" and cur.at(8).spec == "window:2" and cur.at(9).spec == "mixture:0.3"
    n, batch = 4, 24000
    perms = all_permutations(n)
    counts = empirical_counts(curriculum_draws("l2r@5", "uniform", 5, batch, n, 1), perms)
    assert stats.chisquare(counts).pvalue > 1e-3  # after the stage: uniform
    assert torch.equal(curriculum_draws("l2r@5", "uniform", 4, 8, n, 1), torch.arange(n).expand(8, n))


def test_left_to_right_stages_keep_the_runs_order_stream():
    """A left-to-right stage draws (and discards) the run's own orders: the stream after it does not
    depend on its length, and `l2r_first_steps` is the curriculum l2r@N."""
    def stream(spec, l2r_first=0):
        cur, gen = make_curriculum(spec, "uniform", l2r_first), torch.Generator().manual_seed(3)
        return [cur.sample(s, 2, 6, "cpu", gen) for s in range(6)]

    short, long, legacy = stream("l2r@2"), stream("l2r@4"), stream("", l2r_first=4)
    assert all(torch.equal(a, b) for a, b in zip(short[4:], long[4:], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(long, legacy, strict=True))


@pytest.mark.parametrize("spec, words", [
    ("l2r", "no end step"), ("l2r@0", "end step"), ("l2r@5,uniform@5", "above 5"), ("mallows:0..2@9", "above 0"),
    ("mallows:3..inf@9", "above 0"), ("zigzag@9", "unknown order"), ("l2r@x", "whole number"),
])
def test_malformed_curricula_are_refused(spec, words):
    with pytest.raises(AOGPTError, match=words):
        make_curriculum(spec, "uniform")


def test_a_curriculum_and_l2r_first_steps_together_are_refused():
    with pytest.raises(AOGPTError, match="both"):
        make_curriculum("l2r@5", "uniform", l2r_first_steps=5)


def test_stage_ends_as_shares_of_the_run_scale_with_its_length():
    for steps, resolved in ((1000, "l2r@10,mallows:4..0.05@300"), (2000, "l2r@20,mallows:4..0.05@600"),
                            (50, "l2r@1,mallows:4..0.05@15"), (150, "l2r@2,uniform@3,mallows:4..0.05@45")):
        spec = "l2r@1%,uniform@2%,mallows:4..0.05@30%" if steps == 150 else "l2r@1%,mallows:4..0.05@30%"
        cur = make_curriculum(spec, "mixture", steps=steps)
        assert cur.resolved == resolved, steps
        assert cur.length == int(resolved.rpartition("@")[2]) and cur.at(cur.length).spec == "mixture:0.1"
    # at least one step per stage, also when a share rounds to the step before; shares and steps mix
    assert make_curriculum("l2r@1%,window:2@2%", "uniform", steps=10).resolved == "l2r@1,window:2@2"
    assert make_curriculum("l2r@7,mallows:1..0.5@100%", "uniform", steps=40).resolved == "l2r@7,mallows:1..0.5@40"
    assert make_curriculum("l2r@5", "uniform").resolved == "l2r@5"  # steps only: no length needed


@pytest.mark.parametrize("spec, steps, words", [
    ("l2r@10%", None, "share of the run"), ("l2r@0%", 100, r"\(0, 100\]"), ("l2r@150%", 100, r"\(0, 100\]"),
    ("l2r@x%", 100, r"\(0, 100\]"), ("l2r@50%,uniform@20", 100, "above 50"),
])
def test_malformed_shares_are_refused(spec, steps, words):
    with pytest.raises(AOGPTError, match=words):
        make_curriculum(spec, "uniform", steps=steps)


def test_a_run_resolves_shares_against_its_horizon():
    from aogpt.config import train_config

    cfg = train_config(None, "aogpt", curriculum="l2r@10%,mallows:4..0.5@50%", max_steps=200)
    assert make_curriculum(cfg.curriculum, cfg.order, steps=cfg.decay_steps).resolved == "l2r@20,mallows:4..0.5@100"
    extended = train_config(None, "aogpt", curriculum="l2r@10%", max_steps=400, schedule_steps=200)
    assert make_curriculum(extended.curriculum, extended.order, steps=extended.decay_steps).resolved == "l2r@20"
