"""`aogpt bench adapt`'s candidates: every one a valid recipe, the `adapt` preset the measured one, the gated
ones needing no fitting to F."""

from __future__ import annotations

from aogpt.bench.training.adapt_candidates import BASE, CANDIDATES, GATED, MEASURED, _plain, fitted_to
from aogpt.config import ADAPT_RECIPE, GATED_RECIPE, train_config


def test_every_candidate_is_a_valid_adapt_recipe():
    for name, fields in CANDIDATES.items():
        cfg = train_config("adapt", "aogpt", **fields(300), max_steps=300, init_from="x")
        assert cfg.max_steps == 300, name
    plain = train_config("adapt", "aogpt", **_plain(300))
    assert plain.backbone_lr_mult == 1.0 and plain.replay_l2r == 0.0 and plain.distill_l2r == 0.0
    quick = train_config("quickstart", "aogpt")
    assert (plain.lr, plain.min_lr, plain.warmup_steps) == (quick.lr, quick.min_lr, quick.warmup_steps)
    assert plain.curriculum != ADAPT_RECIPE["curriculum"] and plain.target_lr_mult == 10.0


def test_the_adapt_preset_is_the_measured_candidate():
    assert {**BASE, **CANDIDATES[MEASURED](300)} == ADAPT_RECIPE


def test_gated_candidates_are_valid_recipes_and_need_no_fitting():
    for name, (rank, change) in GATED.items():
        cfg = train_config("adapt-gated", "aogpt", **{**GATED_RECIPE, **change(500), "max_steps": 500,
                                                       "init_from": "x"})
        assert cfg.replay_l2r == 0.0 and cfg.distill_l2r == 0.0 and rank >= 0, name
    for name in ("gated-r8", "gated-r32", "gated-full"):  # the same fields at every F: branches are exact runs
        assert fitted_to(name, (500, 1000, 2000)) == 0
    assert fitted_to("plain", (500, 1000, 2000)) == 500


def test_a_candidate_fitted_to_its_steps_is_fitted_to_them_alone():
    assert fitted_to("plain", (500,)) == 500 and fitted_to("recipe-slow-ramp", (500,)) == 500
    assert fitted_to("gated-full", (500,)) == 0
