"""Exported Hugging Face folders: `AutoModelForCausalLM` gives our logits, `AutoTokenizer` our ids, and
`aogpt.load` reads the folder back to the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

import aogpt
from aogpt.config import model_config
from aogpt.data.tokenizer import ByteTokenizer
from aogpt.errors import AOGPTError
from aogpt.hf import export_hf
from aogpt.model import Transformer

TEXT = "The king and the queen at sea."  # fits the 32-byte context


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@torch.no_grad()
def test_exported_run_loads_in_transformers_with_our_logits(tmp_path: Path, tiny_run: Path) -> None:
    summary = export_hf(tiny_run, tmp_path / "hf")
    assert summary["weights"] == "ema" and summary["tokenizer"] == "bytes" and summary["variant"] == "aogpt"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "modeling_aogpt.py",
            "configuration_aogpt.py", "generation_config.json"} <= set(summary["files"])
    ours = aogpt.load(tiny_run)
    ids = torch.tensor([ours.tokenizer.encode(TEXT)])
    assert AutoTokenizer.from_pretrained(tmp_path / "hf")(TEXT, return_tensors="pt")["input_ids"].equal(ids)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    logits, _ = ours.model(ids, with_last_slot=True)
    torch.testing.assert_close(hf(ids).logits[:, :-1], logits[:, 1:-1], atol=1e-6, rtol=1e-6)
    back = aogpt.load(tmp_path / "hf")  # our loader reads the folder without transformers
    assert same_weights(back.model, ours.model) and back.config == ours.config
    assert back.weights == "ema" and back.step == ours.step and back.tokenizer.spec == "bytes"


def test_raw_weights_and_refusals(tmp_path: Path, tiny_run: Path) -> None:
    export_hf(tiny_run, tmp_path / "raw", weights="raw")
    assert same_weights(aogpt.load(tmp_path / "raw").model, aogpt.load(tiny_run, weights="raw").model)
    assert not same_weights(aogpt.load(tiny_run, weights="raw").model, aogpt.load(tiny_run).model)
    export_hf(tiny_run, tmp_path / "ema")
    with pytest.raises(AOGPTError, match="holds the ema weights only"):
        aogpt.load(tmp_path / "ema", weights="raw")
    with pytest.raises(AOGPTError, match="already exists"):
        export_hf(tiny_run, tmp_path / "ema")
    encoder = aogpt.save(Transformer(model_config("encoder-mdm", preset="tiny", vocab_size=257)), tmp_path / "enc",
                         tokenizer=ByteTokenizer())
    with pytest.raises(AOGPTError, match="not a causal language model"):
        export_hf(encoder, tmp_path / "enc-hf")


def test_tied_head_is_stored_once(tmp_path: Path) -> None:
    torch.manual_seed(0)
    gpt = Transformer(model_config("gpt", preset="tiny", vocab_size=257))
    export_hf(aogpt.save(gpt, tmp_path / "gpt", tokenizer=ByteTokenizer()), tmp_path / "hf")
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.transformer.wte.weight" in names and "model.lm_head.weight" not in names
    back = aogpt.load(tmp_path / "hf").model
    assert same_weights(back, gpt) and back.lm_head.weight is back.transformer.wte.weight


@torch.no_grad()
def test_a_gated_pathway_travels_to_transformers_and_back(tmp_path: Path) -> None:
    """The gate is the model's: AutoModelForCausalLM reads left to right through the source's weights and
    in any order through the pathway, as ours does, and the config carries the pathway and its rank."""
    torch.manual_seed(0)
    model = Transformer(model_config("aogpt", preset="tiny", vocab_size=257, pathway="gated", pathway_rank=4))
    for p in model.parameters():
        p.normal_(0.0, 0.3)
    aogpt.save(model, tmp_path / "gated", tokenizer=ByteTokenizer())
    export_hf(tmp_path / "gated", tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert hf.config.pathway == "gated" and hf.config.pathway_rank == 4
    ids = torch.tensor([list(TEXT.encode())[:20]])
    order = torch.randperm(20, generator=torch.Generator().manual_seed(1))
    for o in (None, order):
        ours, _ = model(ids, None if o is None else o[None], with_last_slot=True)
        theirs = hf(ids, order=o).logits  # slot by slot after the start slot; the last one predicts position n
        torch.testing.assert_close(theirs[:, :-1], ours[:, 1:-1], atol=1e-6, rtol=1e-6)
    back = aogpt.load(tmp_path / "hf")
    assert back.config == model.config and same_weights(back.model, model)
    trained = {n for n, p in back.model.named_parameters() if p.requires_grad}
    assert trained and all(("delta" in n or "adaLN" in n or "wtpe" in n) for n in trained)
