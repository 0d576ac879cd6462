"""Options for where training starts on the target pathway: they change the initial weights as asked,
never the forward function, and the target pathway's learning-rate multiplier."""

from __future__ import annotations

import pytest
import torch

from aogpt.errors import AOGPTError
from tests.train.runs import make


def test_the_default_start_is_adaln_zero_and_the_options_change_only_what_they_name():
    base = make(None)
    for name, p in base.raw.target_pathway().items():
        if "adaLN" in name:
            assert not p.any(), name  # adaLN-Zero: every block starts as the identity
    opened = make(None, init_open_gates=True, init_target_std=1.0, init_modulation_std=0.05)
    d = opened.raw.config.n_embd
    for block in opened.raw.transformer.h:
        bias = block.adaLN[-1].bias
        assert torch.equal(bias[2 * d:3 * d], torch.ones(d)) and torch.equal(bias[5 * d:6 * d], torch.ones(d))
        assert not bias[:2 * d].any() and 0.03 < block.adaLN[-1].weight.std().item() < 0.07
    assert 0.8 < opened.raw.transformer.wtpe.weight.std().item() < 1.2
    changed = {k for k, v in opened.raw.state_dict().items() if not torch.equal(v, base.raw.state_dict()[k])}
    wanted = {k for k in base.raw.state_dict() if "wtpe" in k or k.endswith("adaLN.1.weight")
              or k.endswith("adaLN_final.1.weight") or k.endswith(".adaLN.1.bias")}
    assert changed == wanted  # the rest of the model starts exactly where it would have
    assert torch.equal(opened.ema.model.transformer.wtpe.weight, opened.raw.transformer.wtpe.weight)  # EMA starts there


def test_the_target_pathway_runs_at_its_own_learning_rate():
    t = make(None, target_lr_mult=10.0, max_steps=3)
    t.train_step()
    target = {id(p) for p in t.raw.target_pathway().values()}
    for group in t.optimizer.param_groups:
        inside = {id(p) in target for p in group["params"]}
        assert len(inside) == 1  # a group is all target pathway or none of it
        scale = 10.0 if inside == {True} else 1.0
        assert group["lr_scale"] == scale and group["lr"] == pytest.approx(scale * t.schedule.lr(0))


def test_options_a_model_cannot_take_are_refused():
    with pytest.raises(AOGPTError, match="no target pathway"):
        make(None, variant="gpt", init_target_std=1.0)
    with pytest.raises(AOGPTError, match="no adaLN modulation"):
        make(None, variant="sigma", init_open_gates=True)
