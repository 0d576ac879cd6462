"""`aogpt import` / `aogpt export` end to end through `aogpt.cli.main` (conftest `cli`): success, --json, errors."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest
import torch

import aogpt
from aogpt.checkpoint import save_checkpoint
from aogpt.config import model_config, to_dict
from aogpt.model import Transformer
from tests.helpers import REFERENCE

FIX = REFERENCE
AO, SG = FIX / "ckpt_aogpt.pt", FIX / "ckpt_sigmagpt.pt"


def error_lines(err: str) -> list[str]:
    """`error:` lines on stderr (progress bars redraw with carriage returns, so split on those too)."""
    return [seg for seg in re.split(r"[\r\n]", err) if seg.startswith("error:")]


def logits_of(path: Path, weights: str = "ema") -> torch.Tensor:
    model = aogpt.load(path, weights=weights).model
    idx = torch.arange(32).remainder(101)[None]
    order = torch.randperm(32, generator=torch.Generator().manual_seed(0))[None]
    with torch.no_grad():
        return model(idx, order, with_last_slot=True)[0]


def test_import_export_import_through_the_cli(tmp_path, cli):
    res = cli("import", AO, "--out", tmp_path / "a", "--json")
    assert res.code == 0
    summary = res.json  # the JSON summary is the last stdout line
    assert summary["command"] == "import" and summary["variant"] == "aogpt" and summary["params"] == 67_629
    assert summary["ema_stored"] and summary["step"] == 20 and "warning: " in res.err  # vocab 101: no tokenizer

    res = cli("export", tmp_path / "a", "--format", "reference", "--out", tmp_path / "a.pt", "--json")
    assert res.code == 0
    assert res.json["command"] == "export" and res.json["keys"] == 37 and res.json["shadow_params"] == 37

    assert cli("import", tmp_path / "a.pt", "--out", tmp_path / "b", "--tokenizer", "none").code == 0
    for weights in ("ema", "raw"):
        assert torch.equal(logits_of(tmp_path / "a", weights), logits_of(tmp_path / "b", weights))
    assert not torch.equal(logits_of(tmp_path / "a", "ema"), logits_of(tmp_path / "a", "raw"))


def test_import_raw_weights_and_overwrite(tmp_path, cli):
    out = tmp_path / "s"
    res = cli("import", SG, "--out", out, "--weights", "raw")
    assert res.code == 0 and "raw weights" in res.out
    res = cli("import", SG, "--out", out)  # exists
    assert res.code == 2 and "already exists" in error_lines(res.err)[0]
    assert cli("import", SG, "--out", out, "--overwrite").code == 0
    assert aogpt.load(out).weights == "ema"  # now with the EMA stored


@pytest.mark.parametrize("command", ["import", "export"])
def test_help(command, cli):
    res = cli(command, "--help")
    assert res.code == 0
    assert "--weights" in res.out and "--json" in res.out and "--seed" in res.out


def _edited(tmp_path: Path, source: Path, edit) -> Path:
    obj = torch.load(source, map_location="cpu", weights_only=True)
    edit(obj)
    path = tmp_path / "edited.pt"
    torch.save(obj, path)
    return path


class Opaque:  # a pickled class instance: weights_only must refuse it
    pass


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    (tmp_path / name).write_bytes(data)
    return tmp_path / name


BAD_FILES = {
    "text file": (lambda t: _write(t, "notes.txt", b"hello, not a checkpoint\n"), "is not a PyTorch checkpoint"),
    "empty file": (lambda t: _write(t, "empty.pt", b""), "is not a PyTorch checkpoint"),
    "plain pickle of a list": (lambda t: _write(t, "list.pkl", pickle.dumps([1, 2, 3])), "not a readable PyTorch"),
    "torch file holding a list": (lambda t: (torch.save([1, 2], t / "l.pt"), t / "l.pt")[1], "holds a list, not"),
    "pickled object": (
        lambda t: (torch.save({"model": Opaque()}, t / "o.pt"), t / "o.pt")[1],
        "pickled objects other than tensors",
    ),
    "dict without model": (lambda t: (torch.save({"x": 1}, t / "d.pt"), t / "d.pt")[1], "no `model` state dict"),
    "missing tensor": (
        lambda t: _edited(t, AO, lambda o: o["model"].pop("transformer.h.1.mlp.c_fc.weight")),
        "missing: transformer.h.1.mlp.c_fc.weight",
    ),
    "wrong shape": (
        lambda t: _edited(
            t, SG, lambda o: o["model"].__setitem__("transformer.h.0.attn.c_proj.weight", torch.zeros(24, 25))
        ),
        "wrong shape: transformer.h.0.attn.c_proj.weight (24, 25) (expected (24, 24))",
    ),
    "unknown architecture": (
        lambda t: _edited(t, SG, lambda o: o["model"].pop("transformer.wtpe.weight")),
        "unknown architecture",
    ),
    "ema on a file without EMA": (lambda t: _edited(t, AO, lambda o: o.pop("ema_model")), "has no EMA weights"),
    "EMA of the wrong length": (
        lambda t: _edited(t, SG, lambda o: o["ema_model"]["shadow_params"].pop()),
        "shadow_params holds 29 tensors",
    ),
    "no such file": (lambda t: t / "absent.pt", "does not exist"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, cli, case):
    make, message = BAD_FILES[case]
    res = cli("import", make(tmp_path), "--out", tmp_path / "out")
    lines = error_lines(res.err)
    assert res.code == 2 and len(lines) == 1 and message in lines[0], res.err
    assert "Traceback" not in res.err
    assert not (tmp_path / "out").exists()


def test_export_refuses_a_left_to_right_gpt(tmp_path, cli):
    cfg = model_config("gpt", n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=11)
    save_checkpoint(tmp_path / "gpt", Transformer(cfg), config={"model": to_dict(cfg)})
    res = cli("export", tmp_path / "gpt", "--out", tmp_path / "g.pt")
    lines = error_lines(res.err)
    assert res.code == 2 and len(lines) == 1 and "not a reference architecture: variant gpt" in lines[0]
    assert not (tmp_path / "g.pt").exists()


def test_export_without_ema_asks_for_raw(tmp_path, cli):
    assert cli("import", SG, "--out", tmp_path / "s", "--weights", "raw").code == 0
    res = cli("export", tmp_path / "s", "--out", tmp_path / "s.pt")
    assert res.code == 2 and "holds no EMA weights (pass --weights raw)" in error_lines(res.err)[0]
    assert cli("export", tmp_path / "s", "--out", tmp_path / "s.pt", "--weights", "raw").code == 0
    assert "ema_model" not in torch.load(tmp_path / "s.pt", weights_only=True)


def test_export_as_a_hugging_face_folder(tmp_path, cli):
    from transformers import AutoModelForCausalLM

    import aogpt.hf  # noqa: F401 (registers the model type)

    assert cli("import", AO, "--out", tmp_path / "a").code == 0
    res = cli("export", tmp_path / "a", "--format", "hf", "--out", tmp_path / "hf", "--json")
    assert res.code == 0, res.err
    assert res.json["format"] == "hf" and res.json["weights"] == "ema" and res.json["tokenizer"] is None
    assert "model.safetensors" in res.json["files"] and "Hugging Face folder" in res.out
    idx = torch.arange(20).remainder(101)[None]
    with torch.no_grad():
        theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")(idx).logits
        ours = aogpt.load(tmp_path / "a").model(idx, with_last_slot=True)[0]
    torch.testing.assert_close(theirs[:, :-1], ours[:, 1:-1], atol=1e-6, rtol=1e-6)
    res = cli("export", tmp_path / "a", "--format", "hf", "--out", tmp_path / "hf2", "--weights", "both")
    assert res.code == 2 and "holds one set of weights" in error_lines(res.err)[0]
    assert not (tmp_path / "hf2").exists()
