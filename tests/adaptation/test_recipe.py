"""The `adapt` recipe on adapted tiny Llama and GPT-2 models (random weights, offline): the checkpoint
carries it, `train --init-from` alone picks it, and its order schedule and learning-rate roles apply."""

from __future__ import annotations

import pytest
import torch

from aogpt.adaptation import RECIPE, adapt
from aogpt.config import ADAPT_RECIPE, train_config
from aogpt.curriculum import make_curriculum
from aogpt.memory import training_bytes
from aogpt.train import RandomTokens, Trainer
from aogpt.train.planning import dry_run_report, plan
from aogpt.train.recipe import left_to_right_rows
from aogpt.train.throughput import flops_per_token


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_adapt_recipe_applies_to_an_adapted_model(hf_models, tmp_path, arch):
    adapted = adapt(hf_models[arch], "aogpt", tmp_path / "adapted")
    # what `aogpt train --init-from DIR` decides with no other flag: the carried recipe and variant
    p = plan(tmp_path / "run", init_from=str(tmp_path / "adapted"), dry_run=True)
    assert p.preset == RECIPE and p.model_cfg.variant == "aogpt" and "recipe: adapt" in p.recipe_why
    assert {k: getattr(p.train_cfg, k) for k in ADAPT_RECIPE} == ADAPT_RECIPE
    # the dry run counts the teacher: its fp32 weights, and a forward on the left-to-right share of the rows
    report = dry_run_report(p, 100.0)
    n, share = report["parameters"], ADAPT_RECIPE["replay_l2r"] + (1 - ADAPT_RECIPE["replay_l2r"]) * 0.1
    alone = training_bytes(p.model_cfg, p.train_cfg.batch_size, 1, False, params=n)
    assert report["memory per device (GiB)"] == round((alone + 4 * n) / 2**30, 2)
    assert float(report["training FLOPs per token"]) == pytest.approx(
        flops_per_token(p.model_cfg, p.model_cfg.block_size) * (1 + share / 3), rel=1e-3)
    cfg = train_config(RECIPE, "aogpt", init_from=str(tmp_path / "adapted"), batch_size=4, max_minutes=0.0,
                       weight_decay=0.0, max_steps=1000)
    t = Trainer(adapted.config, cfg, RandomTokens(250), None, show_progress=False)
    stages = make_curriculum(cfg.curriculum, cfg.order, steps=cfg.decay_steps)
    assert t.teacher is not None and t.replay_from == stages.stages[0][1]
    # the order schedule: left to right first (no replay needed), mixed orders once the curriculum is over
    assert bool(left_to_right_rows(t._global_batch()[1]).all())
    t.step = stages.length + 5
    assert not bool(left_to_right_rows(t._global_batch()[1]).all())
    t.step = 0
    # the rates: Adam's first move is the group's rate per weight (its gradient far above eps; no weight decay)
    before = {k: v.detach().clone() for k, v in t.raw.named_parameters()}
    t.train_step()
    rate = t.schedule.lr(0)
    target = set(t.raw.target_pathway())
    for name, p in t.raw.named_parameters():
        moved = (p.detach() - before[name]).abs().flatten()
        moved = moved[moved > 0]
        if moved.numel():
            want = rate * (cfg.target_lr_mult if name in target else cfg.backbone_lr_mult)
            assert float(moved.median()) == pytest.approx(want, rel=0.1), name
    checked = {n for n, p in t.raw.named_parameters() if not torch.equal(p, before[n])}
    assert checked & target and checked - target
    # at step 0 the model is its teacher: the distillation term adds nothing to the loss
    torch.testing.assert_close(t.teacher(torch.arange(8)[None])[0], adapted.model(torch.arange(8)[None])[0])
