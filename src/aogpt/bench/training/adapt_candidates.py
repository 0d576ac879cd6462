"""The candidates of `aogpt bench adapt` (`aogpt.bench.training.adapt`): fine-tuning recipes for a model
adapted with a shared pathway (changes to `BASE`), and gated pathways (a delta rank and changes to
`aogpt.config.GATED_RECIPE`), each a function of the fine-tuning length F."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aogpt.config import any_order_start, train_config

PRESET = "quickstart"
ORDER = "mixture"  # AO-GPT's own mixture (10% left to right): scratch's order and the candidates' final one
RATES = ("lr", "min_lr", "warmup_steps", "target_lr_mult", "lr_schedule", "decay_share", "ema_decay")


def _plain(steps: int) -> dict[str, Any]:
    """The fine-tuning before any recipe: the quickstart rates for every weight (target pathway x10), no
    replay, no distillation, the any-order start fitted to the run."""
    quick = train_config(PRESET, "aogpt")
    return {**{k: getattr(quick, k) for k in RATES}, "order": ORDER, "backbone_lr_mult": 1.0, "replay_l2r": 0.0,
            "distill_l2r": 0.0, **any_order_start(ORDER, steps)}


FAST = {"curriculum": "l2r@10,mallows:4..0.05@60"}  # a short ramp: near uniform orders after 60 steps
SCALED = {"curriculum": "l2r@1%,mallows:4..0.05@30%"}  # the stages as shares of F (aogpt.curriculum.Curriculum)


def _ramp(steps: int) -> dict[str, Any]:
    return {"curriculum": f"l2r@10,mallows:4..0.05@{max(11, steps)}"}


# The recipe the candidates change (the `adapt` preset as it was when the first screening began; kept here so
# a later preset does not change what a kept result means). `MEASURED` is the candidate the preset now is (the
# test tests/bench/training/test_adapt.py holds them equal, the step budget aside).
BASE: dict[str, Any] = dict(
    batch_size=16, max_steps=100_000, max_minutes=10.0, lr=3e-3, min_lr=3e-4, warmup_steps=10,
    backbone_lr_mult=0.1, target_lr_mult=1.0, replay_l2r=0.25, distill_l2r=1.0, order="mixture",
    curriculum="l2r@10,mallows:4..0.05@200", lr_schedule="wsd", decay_share=0.2, eval_interval=250,
    eval_batches=8, log_interval=10, ckpt_interval=1000, ema_decay=0.99)

# The second screening's base: target pathway at 10x, the stages scaled to F, and replay and distillation
# letting go as the orders leave left to right, down to a fifth (aogpt.train.recipe.Hold).
LETGO: dict[str, Any] = {"target_lr_mult": 10.0, **SCALED, "hold_floor": 0.2}

# The third: the backbone at the full rate, replay and distillation let go entirely once the orders are the
# run's own, and climbing back to full weight over the learning rate's decay.
RETURN: dict[str, Any] = {**LETGO, "backbone_lr_mult": 1.0, "hold_floor": 0.0, "hold_anneal": 1.0}

MEASURED = "recipe-fast"  # the candidate the `adapt` preset is (aogpt.config.ADAPT_RECIPE); no later one met both goals

# Fine-tuning recipes: changes to `BASE` (a function of the run's steps F).
CANDIDATES: dict[str, Callable[[int], dict[str, Any]]] = {
    "plain": _plain,
    "recipe": lambda f: {},
    "roles": lambda f: {"replay_l2r": 0.0, "distill_l2r": 0.0},
    "roles+replay": lambda f: {"distill_l2r": 0.0},
    "recipe-replay0.5": lambda f: {"replay_l2r": 0.5},
    "recipe-distill0": lambda f: {"distill_l2r": 0.0, "replay_l2r": 0.5},
    "recipe-kl3": lambda f: {"distill_l2r": 3.0},
    "recipe-backbone0.3": lambda f: {"backbone_lr_mult": 0.3},
    "recipe-backbone1": lambda f: {"backbone_lr_mult": 1.0},
    "recipe-target3": lambda f: {"target_lr_mult": 3.0},
    "recipe-backbone0.03": lambda f: {"backbone_lr_mult": 0.03},
    "recipe-slow-ramp": _ramp,
    "recipe-no-ramp": lambda f: {"curriculum": "l2r@10"},
    "pathway-only": lambda f: {"freeze_backbone_steps": f},
    "recipe-target10": lambda f: {"target_lr_mult": 10.0},
    "recipe-fast": lambda f: {"target_lr_mult": 10.0, **FAST},
    "recipe-fast-backbone0.3": lambda f: {"target_lr_mult": 10.0, "backbone_lr_mult": 0.3, **FAST},
    "recipe-fast-backbone1": lambda f: {"target_lr_mult": 10.0, "backbone_lr_mult": 1.0, **FAST},
    # the second screening (stages scaled to F; the hold)
    "scaled": lambda f: {"target_lr_mult": 10.0, **SCALED},
    "scaled-roles": lambda f: {"target_lr_mult": 10.0, **SCALED, "replay_l2r": 0.0, "distill_l2r": 0.0},
    "letgo": lambda f: dict(LETGO),
    "letgo-floor0.5": lambda f: {**LETGO, "hold_floor": 0.5},
    "letgo-floor0.05": lambda f: {**LETGO, "hold_floor": 0.05},
    "letgo-backbone0.3": lambda f: {**LETGO, "backbone_lr_mult": 0.3},
    "letgo-backbone1": lambda f: {**LETGO, "backbone_lr_mult": 1.0},
    "letgo-target3": lambda f: {**LETGO, "target_lr_mult": 3.0},
    "letgo-target30": lambda f: {**LETGO, "target_lr_mult": 30.0},
    "letgo-ramp50": lambda f: {**LETGO, "curriculum": "l2r@1%,mallows:4..0.05@50%"},
    "letgo-ramp15": lambda f: {**LETGO, "curriculum": "l2r@1%,mallows:4..0.05@15%"},
    "scaled-backbone1": lambda f: {"target_lr_mult": 10.0, **SCALED, "backbone_lr_mult": 1.0},
    "letgo-floor0.5-backbone1": lambda f: {**LETGO, "hold_floor": 0.5, "backbone_lr_mult": 1.0},
    "letgo-kl3-backbone1": lambda f: {**LETGO, "distill_l2r": 3.0, "backbone_lr_mult": 1.0},
    # the hold climbs back to full weight over the learning rate's decay
    "return-backbone1": lambda f: {**LETGO, "backbone_lr_mult": 1.0, "hold_anneal": 1.0},
    "return-floor0-backbone1": lambda f: {**LETGO, "backbone_lr_mult": 1.0, "hold_floor": 0.0, "hold_anneal": 1.0},
    "return-strong": lambda f: {**RETURN, "replay_l2r": 0.5, "distill_l2r": 3.0},
    "return-long": lambda f: {**RETURN, "decay_share": 0.4},
    "return-strong-long": lambda f: {**RETURN, "replay_l2r": 0.5, "distill_l2r": 3.0, "decay_share": 0.4},
    "return-backbone0.3": lambda f: {**RETURN, "backbone_lr_mult": 0.3},
    "return-strong-xlong": lambda f: {**RETURN, "replay_l2r": 0.5, "distill_l2r": 3.0, "decay_share": 0.6},
    "return-kl10-long": lambda f: {**RETURN, "replay_l2r": 0.5, "distill_l2r": 10.0, "decay_share": 0.4},
}


# Gated pathways (`aogpt.pathway`): name -> (the delta's rank, 0 for full; changes to `GATED_RECIPE`, a function of F).
# The first three are the study's; the others screen the order mixture (docs/adapt.md, "The gated pathway").
GATED: dict[str, tuple[int, Callable[[int], dict[str, Any]]]] = {
    "gated-r8": (8, lambda f: {}),
    "gated-r32": (32, lambda f: {}),
    "gated-full": (0, lambda f: {}),
    # the screening of the orders (seed 0, F = 1000; docs/adapt.md): the recipe is gated-full-ramp150-infill50
    "gated-full-noramp": (0, lambda f: {"curriculum": ""}),
    "gated-full-ramp150": (0, lambda f: {"order": "uniform*0.75+infill*0.25"}),
    "gated-full-ramp150-infill50": (0, lambda f: {}),
}
STUDY = ("plain", "gated-r8", "gated-r32", "gated-full")  # the candidates of the gated pathway's study


def _known(name: str) -> bool:
    return name in CANDIDATES or name in GATED


def fitted_to(name: str, budgets: tuple[int, ...]) -> int:
    """The F a candidate's F-dependent fields are fitted to when its budgets share a trunk: the shortest, or 0
    when its fields are the same for every budget (then each branch is exactly the run budgeted for its F).
    One budget: the fields are fitted to it (0 when they would be the same at twice it)."""
    change = GATED[name][1] if name in GATED else CANDIDATES[name]
    tried = budgets if len(budgets) > 1 else (budgets[0], 2 * budgets[0])
    return 0 if len({json.dumps(change(b), sort_keys=True) for b in tried}) == 1 else min(budgets)


__all__ = ["BASE", "CANDIDATES", "GATED", "LETGO", "MEASURED", "ORDER", "PRESET", "RATES", "STUDY", "fitted_to"]
