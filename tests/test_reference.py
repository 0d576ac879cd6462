"""The paper's released checkpoints: conformance with the reference implementation's vectors.

Every expected number comes from ../shared/fixtures/reference-checkpoints (produced by running the
reference code; its README describes the arrays), never from our own code.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import aogpt
from aogpt.checkpoint import save_checkpoint
from aogpt.config import model_config, to_dict
from aogpt.errors import AOGPTError
from aogpt.model import Kernels, Transformer
from aogpt.reference import (
    export_reference,
    import_reference,
    load_reference,
    parameter_names,
    read_reference,
    reference_config,
)
from tests.helpers import REFERENCE

FIX = REFERENCE
EXP = np.load(FIX / "expected.npz")
IDX, ORDERS = torch.from_numpy(EXP["idx"]), torch.from_numpy(EXP["orders"])
CKPT = {"ao": FIX / "ckpt_aogpt.pt", "sg": FIX / "ckpt_sigmagpt.pt"}
SUMMARY = json.loads((FIX / "summary.json").read_text())
SHAPES = json.loads((FIX / "reference_shapes.json").read_text())
TOL = {torch.float32: ("f32", 1e-5), torch.float64: ("f64", 1e-10)}
# every (architecture, weights, dtype) the fixture has vectors for (raw weights: float32 only)
CASES = [(a, w, d) for a in CKPT for w in ("ema", "raw") for d in TOL if f"{a}_{w}_logits_{TOL[d][0]}" in EXP]


def assert_matches_reference(model: Transformer, arch: str, weights: str, dtype: torch.dtype) -> None:
    """Logits of all 33 slots, per-token losses and their mean equal the reference's."""
    suffix, atol = TOL[dtype]
    key = f"{arch}_{weights}"
    with torch.no_grad():
        logits, losses = model(IDX, ORDERS, with_last_slot=True)
    assert logits.dtype == dtype
    torch.testing.assert_close(logits, torch.from_numpy(EXP[f"{key}_logits_{suffix}"]), atol=atol, rtol=0)
    want_losses = torch.from_numpy(EXP[f"{key}_loss_tok_{suffix}"]).to(losses.dtype)
    torch.testing.assert_close(losses, want_losses, atol=atol, rtol=0)
    assert abs(losses.double().mean().item() - float(EXP[f"{key}_loss_mean_{suffix}"])) < atol


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both fixture checkpoints imported (raw and EMA stored) into our checkpoint format."""
    out = tmp_path_factory.mktemp("imported")
    return {a: Path(import_reference(CKPT[a], out / a, warn=lambda m: None)["out"]) for a in CKPT}


@pytest.mark.parametrize("arch,weights,dtype", CASES, ids=str)
def test_load_reference_matches_reference_logits_and_losses(arch, weights, dtype):
    model, cfg = load_reference(CKPT[arch], weights=weights, dtype=dtype)
    assert cfg.variant == {"ao": "aogpt", "sg": "sigma"}[arch]
    assert_matches_reference(model, arch, weights, dtype)


@pytest.mark.parametrize("arch,weights,dtype", CASES, ids=str)
def test_imported_directory_loads_and_matches_reference(imported, arch, weights, dtype):
    loaded = aogpt.load(imported[arch], weights=weights, dtype=dtype)
    assert loaded.step == 20 and loaded.tokenizer is None  # vocab 101 is not GPT-2's: no tokenizer recorded
    assert_matches_reference(loaded.model, arch, weights, dtype)


def test_ema_and_raw_weights_differ_enough_to_tell_apart():
    """Guards the tests above: loading the wrong weight set would fail them."""
    for arch in CKPT:
        gap = np.abs(EXP[f"{arch}_ema_logits_f32"] - EXP[f"{arch}_raw_logits_f32"]).max()
        assert gap > 1e-3


@pytest.mark.parametrize("by_target", [False, True], ids=["slot layout", "target layout"])
def test_aogpt_intermediate_activations_match_reference(by_target):
    """Every block's output matches the reference's, in the slot layout (SDPA, the reference's own
    arrangement) and in the layout by target position that training uses (its rows are the slots
    permuted, so they are put back in slot order to compare)."""
    model, _ = load_reference(CKPT["ao"], dtype=torch.float32)
    model.kernels = Kernels(by_target=True) if by_target else Kernels.reference()
    seen: dict[str, torch.Tensor] = {}

    def keep(name):
        return lambda module, args, out: seen.__setitem__(name, (args, out))

    tr = model.transformer
    hooks = [
        # block 0's input: the embedding (dropout is skipped in evaluation, so no module returns it)
        tr.h[0].register_forward_pre_hook(lambda module, args: seen.__setitem__("x0", (args, args[0]))),
        tr.h[0].adaLN.register_forward_hook(keep("adaLN0")),
        tr.final_layer.register_forward_hook(keep("final_layer_out")),
    ]
    hooks += [block.register_forward_hook(keep(f"block{i}_out")) for i, block in enumerate(tr.h)]
    with torch.no_grad():
        model(IDX, ORDERS, with_last_slot=True)
    for h in hooks:
        h.remove()
    n = IDX.shape[1]
    slot_rows = torch.cat([ORDERS, torch.full((ORDERS.shape[0], 1), n)], dim=1)  # slot t is row order[t]
    for name in ("x0", "block0_out", "block1_out", "final_layer_out"):
        out = seen[name][1]
        if by_target:
            out = out.expand(IDX.shape[0], -1, -1).gather(1, slot_rows[..., None].expand(-1, -1, out.shape[-1]))
        torch.testing.assert_close(out, torch.from_numpy(EXP[f"ao_ema_{name}_f32"]), atol=1e-5, rtol=0)
    if by_target:
        return
    # adaLN sees the (padded) target table; the per-slot condition is its row for each slot's target
    table = seen["adaLN0"][0][0]
    _, _, target = model.slots_for_order(IDX, ORDERS, with_last_slot=True)
    torch.testing.assert_close(table[target], torch.from_numpy(EXP["ao_ema_cond_f32"]), atol=1e-6, rtol=0)
    assert table[target][:, -1].abs().max() == 0  # the last slot has no target: zero condition


@pytest.mark.parametrize("arch", CKPT)
def test_left_to_right_loss_matches_reference(arch):
    model, _ = load_reference(CKPT[arch])
    with torch.no_grad():
        _, losses = model(IDX)  # default order: left to right for both rows
    assert abs(losses.mean().item() - float(EXP[f"{arch}_ema_loss_ar_mode_f32"])) < 1e-5


@pytest.mark.parametrize("dtype", TOL, ids=str)
def test_generator_on_imported_checkpoint_reproduces_reference(imported, dtype):
    """Reference `count`/linear schedule, 5 steps over 32 tokens, teacher-forced: same logits."""
    suffix, atol = TOL[dtype]
    loaded = aogpt.load(imported["ao"], dtype=dtype)
    res = loaded.generate(
        num_samples=2,
        length=32,
        steps=5,
        policy="count",
        schedule="linear",
        order=ORDERS,
        teacher_tokens=IDX,
        record_logits=True,
        seed=0,
    )
    assert res.step_counts.tolist() == [EXP["gen_step_sizes"].tolist()] * 2
    assert torch.equal(res.tokens, IDX) and torch.equal(res.orders, ORDERS)
    torch.testing.assert_close(res.logits, torch.from_numpy(EXP[f"gen_logits_{suffix}"]), atol=atol, rtol=0)


def test_context_order_ensemble_on_imported_checkpoint_reproduces_reference(imported):
    from aogpt.evaluation.ensemble import ensemble_losses, ensemble_nll

    model = aogpt.load(imported["ao"]).model
    members = torch.from_numpy(EXP["ens_orders"])[None]  # (1, n, M-1, n)
    losses = ensemble_losses(model, IDX[1:2], ORDERS[1:2], 4, member_orders=members)[0]
    torch.testing.assert_close(losses, torch.from_numpy(EXP["ens_loss_f64"]), atol=1e-5, rtol=0)
    k2, k4 = EXP["ens_nll_K2_K4"]
    assert abs(ensemble_nll(losses[None, :, :2]).mean().item() - k2) < 1e-5
    assert abs(ensemble_nll(losses[None]).mean().item() - k4) < 1e-5
    assert abs(losses[:, 0].mean().item() - float(EXP["ens_nll_base"])) < 1e-5


@pytest.mark.parametrize("arch,name", [("ao", "aogpt"), ("sg", "sigmagpt")])
def test_ema_shadow_params_are_named_in_reference_parameters_order(arch, name):
    """Map shadow_params by the reference's own name list (summary.json), independently of our code."""
    ref_names = SUMMARY[name]["param_names_in_parameters_order"]
    raw = torch.load(CKPT[arch], map_location="cpu", weights_only=True)
    shadow = dict(zip(ref_names, raw["ema_model"]["shadow_params"], strict=True))
    model, cfg = load_reference(CKPT[arch], weights="ema")
    assert parameter_names(cfg) == ref_names
    assert len(shadow) == SUMMARY[name]["n_shadow"] and len(model.state_dict()) == SUMMARY[name]["n_state_dict"]
    for key, value in model.state_dict().items():
        want = shadow["transformer.wte.weight" if key == "lm_head.weight" and cfg.tie_head else key]
        assert torch.equal(value, want), key


@pytest.mark.parametrize("release", list(SHAPES))
def test_presets_produce_the_released_keys_shapes_and_order(release):
    spec = SHAPES[release]
    variant = "aogpt" if release.startswith("aogpt") else "sigma"
    preset = "gpt2-small" if "small" in release else "gpt2-medium"
    cfg = model_config(variant, preset=preset)
    with torch.device("meta"):
        model = Transformer(cfg)
    assert [(k, list(v.shape)) for k, v in model.state_dict().items()] == list(spec["state_dict"].items())
    assert [k for k, _ in model.named_parameters()] == spec["parameters_order"]
    assert model.num_params() == spec["n_params_total"]
    # and a release's shapes + model_args import as exactly this preset
    with torch.device("meta"):
        state = {k: torch.empty(shape) for k, shape in spec["state_dict"].items()}
    assert reference_config(state, spec["model_args"]) == cfg


def test_released_sizes():
    assert SHAPES["aogpt_small_124M"]["n_params_total"] == 170_605_952  # the "124M" AO-GPT
    assert SHAPES["sigmagpt_small_124M"]["n_params_total"] == 125_263_872


def _file_with(tmp_path: Path, arch: str, edit) -> Path:
    obj = torch.load(CKPT[arch], map_location="cpu", weights_only=True)
    edit(obj)
    path = tmp_path / f"edited_{arch}.pt"
    torch.save(obj, path)
    return path


def test_compiled_prefix_and_mask_buffers_are_handled(tmp_path):
    def compiled(obj):
        obj["model"] = {f"_orig_mod.{k}": v for k, v in obj["model"].items()}
        obj["model"]["_orig_mod.transformer.h.0.attn.bias"] = torch.ones(1, 1, 32, 32).tril()

    path = _file_with(tmp_path, "ao", compiled)
    model, _ = load_reference(path)
    assert_matches_reference(model, "ao", "ema", torch.float32)
    summary = import_reference(path, tmp_path / "out", warn=lambda m: None)
    assert summary["ignored_keys"] == ["transformer.h.0.attn.bias"]


@pytest.mark.parametrize("arch", CKPT)
def test_export_of_imported_fixture_reproduces_the_file(tmp_path, arch):
    import_reference(CKPT[arch], tmp_path / "ckpt", warn=lambda m: None)
    export_reference(tmp_path / "ckpt", tmp_path / "back.pt")
    a = torch.load(CKPT[arch], map_location="cpu", weights_only=True)
    b = torch.load(tmp_path / "back.pt", map_location="cpu", weights_only=True)
    assert list(b["model"]) == list(a["model"])
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    sa, sb = a["ema_model"]["shadow_params"], b["ema_model"]["shadow_params"]
    assert len(sa) == len(sb) and all(torch.equal(x, y) for x, y in zip(sa, sb, strict=True))
    assert b["model_args"] == a["model_args"] and b["iter_num"] == a["iter_num"]
    assert (b["ema_model"]["decay"], b["ema_model"]["num_updates"]) == (a["ema_model"]["decay"], 20)
    assert b["config"]["train_mode"] == a["config"]["train_mode"]  # the reference's own config travels along


def _random_checkpoint(directory: Path, variant: str, seed: int) -> Path:
    torch.manual_seed(seed)
    extra = {"target_dim": 8} if variant == "aogpt" else {}  # sigma has no use for target_dim
    cfg = model_config(variant, n_layer=2, n_head=2, n_embd=16, block_size=12, vocab_size=37, **extra)
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    ema = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    return save_checkpoint(directory, model, config={"model": to_dict(cfg), "step": 7}, ema=ema)


@pytest.mark.parametrize("variant", ["aogpt", "sigma"])
def test_import_of_export_is_exact(tmp_path, variant):
    src = _random_checkpoint(tmp_path / "src", variant, seed=3)
    summary = export_reference(src, tmp_path / "x.pt")
    names = parameter_names(aogpt.load(src).config)
    assert summary["shadow_params"] == len(names) == summary["keys"] - (variant == "sigma")
    exported = torch.load(tmp_path / "x.pt", map_location="cpu", weights_only=True)
    if variant == "sigma":  # the reference's state dict lists the tied head, sharing wte's storage
        head, wte = exported["model"]["lm_head.weight"], exported["model"]["transformer.wte.weight"]
        assert head.untyped_storage().data_ptr() == wte.untyped_storage().data_ptr()
    import_reference(tmp_path / "x.pt", tmp_path / "back", warn=lambda m: None)
    a, b = load_file(str(src / "model.safetensors")), load_file(str(tmp_path / "back/model.safetensors"))
    assert sorted(a) == sorted(b) and any(k.startswith("ema.") for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert aogpt.load(tmp_path / "back").config == aogpt.load(src).config


def test_export_weights_choices(tmp_path):
    src = _random_checkpoint(tmp_path / "src", "aogpt", seed=4)
    tensors = load_file(str(src / "model.safetensors"))
    export_reference(src, tmp_path / "raw.pt", weights="raw")
    export_reference(src, tmp_path / "ema.pt", weights="ema")
    raw = torch.load(tmp_path / "raw.pt", weights_only=True)
    ema = torch.load(tmp_path / "ema.pt", weights_only=True)
    assert "ema_model" not in raw and "ema_model" not in ema
    key = "transformer.wte.weight"
    assert torch.equal(raw["model"][key], tensors[f"raw.{key}"]) and torch.equal(
        ema["model"][key], tensors[f"ema.{key}"]
    )


@pytest.mark.parametrize(
    "overrides,why",
    [
        (dict(variant="gpt"), "variant gpt"),
        (dict(variant="encoder-mdm"), "variant encoder-mdm"),
        (dict(variant="sigma", target="input-concat"), "target='input-concat'"),
        (dict(variant="aogpt", norm="layernorm"), "norm='layernorm'"),
        (dict(variant="sigma", norm_eps=1e-6), "norm_eps=1e-06"),
    ],
)
def test_export_refuses_other_architectures(tmp_path, overrides, why):
    variant = overrides.pop("variant")
    cfg = model_config(variant, n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=11, target_dim=4, **overrides)
    save_checkpoint(tmp_path / "c", Transformer(cfg), config={"model": to_dict(cfg)})
    with pytest.raises(AOGPTError, match="not a reference architecture") as err:
        export_reference(tmp_path / "c", tmp_path / "x.pt")
    assert why in str(err.value)
    assert not (tmp_path / "x.pt").exists()


def test_import_raw_stores_raw_weights_only(tmp_path):
    import_reference(CKPT["ao"], tmp_path / "raw", weights="raw", warn=lambda m: None)
    assert not any(k.startswith("ema.") for k in load_file(str(tmp_path / "raw/model.safetensors")))
    assert_matches_reference(aogpt.load(tmp_path / "raw", weights="raw").model, "ao", "raw", torch.float32)
    with pytest.raises(AOGPTError, match="no ema weights"):
        aogpt.load(tmp_path / "raw")


def test_import_records_tokenizer_and_source(tmp_path):
    warnings: list[str] = []
    summary = import_reference(CKPT["sg"], tmp_path / "a", warn=warnings.append)
    assert summary["tokenizer"] is None and "not GPT-2's" in warnings[0]
    meta = json.loads((tmp_path / "a/config.json").read_text())
    assert meta["source"]["weights"] == "ema" and meta["source"]["ema_num_updates"] == 20
    assert meta["source"]["sha256"] == summary["sha256"] and len(summary["sha256"]) == 64
    with pytest.raises(AOGPTError, match="has 257 ids but the model only 101"):
        import_reference(CKPT["sg"], tmp_path / "b", tokenizer="bytes")


def test_gpt2_vocabulary_records_the_gpt2_tokenizer(tmp_path):
    cfg = model_config("sigma", n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=50304)
    model = Transformer(cfg)
    path = tmp_path / "gpt2vocab.pt"
    args = {"n_layer": 1, "n_head": 2, "n_embd": 8, "block_size": 8, "bias": True, "vocab_size": 50304, "dropout": 0.1}
    torch.save({"model": model.state_dict(), "model_args": args, "iter_num": 5}, path)
    summary = import_reference(path, tmp_path / "out", weights="raw")
    assert summary["tokenizer"] == "gpt2"
    loaded = aogpt.load(tmp_path / "out", weights="raw")
    assert loaded.tokenizer.encode("Hello world") == [15496, 995] and loaded.config.dropout == 0.0


@pytest.mark.parametrize(
    "arch,edit,message",
    [
        ("sg", lambda o: o["model"].__setitem__("lm_head.weight", o["model"]["lm_head.weight"] + 1), "ties them"),
        ("ao", lambda o: o["ema_model"]["shadow_params"].pop(), "holds 36 tensors"),
        ("sg", lambda o: o["ema_model"]["shadow_params"].append(torch.zeros(1)), "holds 31 tensors"),
        ("ao", lambda o: o["ema_model"]["shadow_params"].__setitem__(2, torch.zeros(32, 64)), "#2 transformer.wtpe"),
        ("ao", lambda o: o["model_args"].__setitem__("n_embd", 48), "model_args says n_embd=48"),
        ("sg", lambda o: o["model_args"].pop("n_head"), "no n_head"),
        ("ao", lambda o: o["model"].pop("transformer.wte.weight"), "missing tensor transformer.wte.weight"),
        (
            "ao",
            lambda o: o["model"].__setitem__("transformer.ln_f.weight", torch.ones(24)),
            "unexpected: transformer.ln_f",
        ),
        ("sg", lambda o: o["model"].__setitem__("transformer.h.0.adaLN.1.bias", torch.ones(6)), "mixes AO-GPT keys"),
        ("sg", lambda o: o["model"].__setitem__("transformer.wtpe.weight", torch.ones(32, 12)), "12 wide"),
        ("sg", lambda o: o["model"].pop("transformer.wtpe.weight"), "no target-position table"),
        ("ao", lambda o: o["model"].__setitem__("transformer.h.0.mlp.c_fc.weight", 3), "is a int, not a tensor"),
    ],
)
def test_inconsistent_files_are_refused_by_name(tmp_path, arch, edit, message):
    path = _file_with(tmp_path, arch, edit)
    with pytest.raises(AOGPTError) as err:
        read_reference(path)
    assert message in str(err.value)


def test_missing_and_misshapen_tensors_are_all_named(tmp_path):
    def edit(obj):
        for key in ("transformer.h.1.mlp.c_fc.weight", "transformer.h.0.attn.q_norm.weight"):
            del obj["model"][key]
        obj["model"]["transformer.h.0.attn.c_proj.weight"] = torch.zeros(24, 23)
        obj["model"]["transformer.h.0.attn.extra"] = torch.zeros(24)

    with pytest.raises(AOGPTError) as err:
        read_reference(_file_with(tmp_path, "ao", edit))
    text = str(err.value)
    for name in (
        "transformer.h.1.mlp.c_fc.weight",
        "transformer.h.0.attn.q_norm.weight",
        "transformer.h.0.attn.c_proj.weight (24, 23) (expected (24, 24))",
        "transformer.h.0.attn.extra",
    ):
        assert name in text
    assert "missing" in text and "unexpected" in text and "wrong shape" in text


def test_half_precision_file_is_stored_in_float32(tmp_path):
    def to_bf16(obj):
        obj["model"] = {k: v.bfloat16() for k, v in obj["model"].items()}
        obj["ema_model"]["shadow_params"] = [t.bfloat16() for t in obj["ema_model"]["shadow_params"]]

    path = _file_with(tmp_path, "ao", to_bf16)
    import_reference(path, tmp_path / "out", warn=lambda m: None)
    stored = load_file(str(tmp_path / "out/model.safetensors"))
    assert {t.dtype for t in stored.values()} == {torch.float32}
    original = torch.load(path, weights_only=True)
    assert torch.equal(stored["raw.lm_head.bias"], original["model"]["lm_head.bias"].float())
    assert torch.equal(stored["ema.transformer.wte.weight"], original["ema_model"]["shadow_params"][0].float())
