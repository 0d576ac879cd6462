"""The public API a researcher uses without reading private helpers (`aogpt.__init__`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import aogpt
from aogpt.data.tokenizer import ByteTokenizer

SRC = Path(__file__).resolve().parents[1] / "src"


def small(variant: str = "aogpt") -> aogpt.Transformer:
    torch.manual_seed(0)
    extra = {"target_dim": 8} if variant == "aogpt" else {}
    cfg = aogpt.model_config(variant, n_layer=2, n_head=2, n_embd=16, block_size=12, vocab_size=320, **extra)
    model = aogpt.Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.eval()


def test_names_are_exported_and_import_stays_light() -> None:
    for name in ("Transformer", "ModelConfig", "load", "save", "generate", "infill", "evaluate",
                 "conditional_logprobs", "GenerationSettings", "family_of", "make_order_sampler"):
        assert hasattr(aogpt, name), name
    assert isinstance(small().config, aogpt.ModelConfig)
    code = "import sys, aogpt; sys.exit('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


def test_save_then_load_round_trips_weights_tokenizer_and_generation(tmp_path: Path) -> None:
    model = small()
    path = aogpt.save(model, tmp_path / "ckpt", tokenizer=ByteTokenizer(), step=7, extra={"note": "api test"})
    loaded = aogpt.load(path)
    assert loaded.step == 7 and loaded.meta["note"] == "api test" and loaded.tokenizer.spec == "bytes"
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], tensor), name
    raw = aogpt.load(path, weights="raw").model
    assert all(torch.equal(a, b) for a, b in zip(raw.parameters(), model.parameters(), strict=True))
    out = loaded.generate(num_samples=2, length=10, steps=5, seed=3)
    assert len(out.texts) == 2 and out.tokens.shape == (2, 10)
    with pytest.raises(aogpt.AOGPTError, match="not an aogpt model"):
        aogpt.save(torch.nn.Linear(2, 2), tmp_path / "bad")


def test_generate_and_evaluate_are_the_functions_of_their_packages() -> None:
    from aogpt.evaluation.evaluate import evaluate
    from aogpt.generation.generate import generate

    assert aogpt.generate is generate and aogpt.evaluate is evaluate
    model = small()
    a = aogpt.generate(model, num_samples=2, length=8, steps=4, seed=5)

    b = generate(model, num_samples=2, length=8, steps=4, seed=5)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.orders, b.orders)
    settings = aogpt.GenerationSettings().with_overrides(steps=4, temperature=0.7, order="l2r")
    c = aogpt.generate(model, settings=settings, num_samples=2, length=8, seed=5)
    d = generate(model, num_samples=2, length=8, seed=5, steps=4, temperature=0.7, order="l2r")
    assert torch.equal(c.tokens, d.tokens) and (c.orders == torch.arange(8)).all()
    data = torch.randint(0, 320, (3, 12), generator=torch.Generator().manual_seed(0))
    assert aogpt.evaluate(model, data).nll == evaluate(model, data).nll
    with pytest.raises(TypeError, match="unknown generation setting"):
        aogpt.generate(model, length=8, temprature=0.5)
