"""Configs, presets and overrides."""

from __future__ import annotations

import pytest
import torch

from aogpt.config import TrainConfig, apply_overrides, load_config_file, model_config, train_config
from aogpt.errors import AOGPTError
from aogpt.model import Transformer


def test_paper_presets_have_the_released_parameter_counts():
    with torch.device("meta"):
        assert Transformer(model_config("aogpt", preset="gpt2-small")).num_params() == 170_605_952
        assert Transformer(model_config("sigma", preset="gpt2-small")).num_params() == 125_263_872
        assert Transformer(model_config("aogpt", preset="gpt2-medium")).num_params() == 425_804_928


def test_variant_defaults_and_overrides():
    cfg = model_config("sigma", preset="tiny", target="input-concat")
    assert cfg.norm == "layernorm" and cfg.tie_head and cfg.target == "input-concat"
    assert train_config("tiny", "aogpt").order == "mixture"
    assert train_config(None, "gpt").order == "l2r"


@pytest.mark.parametrize("kwargs,match", [
    (dict(variant="bert"), "unknown variant"),
    (dict(variant="aogpt", target="sideways"), "unknown target"),
    (dict(variant="gpt", target="adaln"), "takes no target"),
    (dict(variant="aogpt", n_head=3), "not divisible"),
    (dict(variant="aogpt", n_layer="4"), "must be int"),
    (dict(variant="aogpt", colour=1), "unknown key"),
])
def test_bad_model_configs(kwargs, match):
    with pytest.raises(AOGPTError, match=match):
        model_config(kwargs.pop("variant"), preset="tiny", **kwargs)


def test_train_overrides_check_types():
    assert apply_overrides(TrainConfig(), {"lr": 1}, "x").lr == 1.0
    with pytest.raises(AOGPTError, match="must be bool"):
        apply_overrides(TrainConfig(), {"fsdp": 1}, "x")
    with pytest.raises(AOGPTError, match="compile must be str"):
        apply_overrides(TrainConfig(), {"compile": 1}, "x")
    # the flag's old boolean form, as older run configs hold it, reads as today's words
    assert apply_overrides(TrainConfig(), {"compile": True}, "x").compile == "on"
    assert apply_overrides(TrainConfig(), {"compile": False}, "x").compile == "off"
    with pytest.raises(AOGPTError, match="compile"):
        train_config(compile="sometimes")
    with pytest.raises(AOGPTError, match="unknown preset"):
        train_config("huge")


def test_config_files(tmp_path):
    good = tmp_path / "c.toml"
    good.write_text('preset = "tiny"\n[model]\nn_layer = 3\n[train]\nlr = 0.01\n')
    assert load_config_file(good)["model"]["n_layer"] == 3
    bad = tmp_path / "bad.json"
    bad.write_text('{"modle": {"n_layer": 3}}')
    with pytest.raises(AOGPTError, match="unknown section"):
        load_config_file(bad)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(AOGPTError, match="does not parse"):
        load_config_file(broken)


def test_the_any_order_start_ramps_from_left_to_right_to_the_runs_order():
    from aogpt.config import any_order_start
    from aogpt.curriculum import make_curriculum

    start = any_order_start("uniform", 1800)
    assert start == {"curriculum": "l2r@100,mallows:4..0.05@600", "l2r_first_steps": 0, "target_lr_mult": 10.0,
                     "init_open_gates": True}
    assert make_curriculum(start["curriculum"], "uniform").at(599).spec == "mallows:0.05"
    assert any_order_start("mallows:0.3", 1800, target="input")["curriculum"] == "l2r@100,mallows:4..0.3@600"
    assert "init_open_gates" not in any_order_start("mixture:0.1", 90, target="input")
    assert any_order_start("mallows:10", 1800)["curriculum"] == "l2r@100"  # nearly left to right already
    for order in ("l2r", "fixed-random:3", "blockwise:4", "mallows:inf"):
        assert any_order_start(order, 1800) == {}  # the target follows from the slot: nothing to learn
    train_config(None, "aogpt", **any_order_start("uniform", 24))  # short runs get a valid curriculum


def test_a_presets_orders_apply_to_any_order_decoders_only():
    """The quickstart preset's orders and curriculum are AO-GPT's recipe: a GPT or an encoder trained with
    the same preset keeps its own order and no curriculum (a GPT must never read a Mallows ramp)."""
    ao = train_config("quickstart", "aogpt")
    assert ao.order == "mixture:0.3" and ao.curriculum.startswith("l2r@")
    sigma = train_config("quickstart", "sigma")
    assert sigma.curriculum == ao.curriculum
    for variant, order in (("gpt", "l2r"), ("encoder-mdm", "uniform")):
        cfg = train_config("quickstart", variant)
        assert cfg.order == order and not cfg.curriculum
        assert cfg.lr == ao.lr and cfg.lr_schedule == ao.lr_schedule  # the rest of the preset applies
    assert train_config("quickstart", "gpt", order="l2r", curriculum="l2r@5").curriculum == "l2r@5"  # asked for
