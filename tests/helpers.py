"""Helpers shared by the tests: the vendored conformance vectors and small random checkpoints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from aogpt import capability
from aogpt.checkpoint import save_checkpoint
from aogpt.config import model_config, to_dict
from aogpt.model import Transformer

# The paper's conformance vectors, vendored from ../shared/fixtures (tests/test_fixture_copy.py checks
# the copy against the original when it is beside the clone).
REFERENCE = Path(__file__).resolve().parent / "fixtures" / "reference-checkpoints"


def reference_expected() -> dict[str, np.ndarray]:
    return dict(np.load(REFERENCE / "expected.npz"))


def reference_aogpt(dtype: torch.dtype = torch.float32, weights: str = "ema") -> Transformer:
    """The fixture's AO-GPT read directly with torch.load (independently of `aogpt.reference`):
    `shadow_params` follow `model.parameters()` order."""
    ckpt = torch.load(REFERENCE / "ckpt_aogpt.pt", map_location="cpu", weights_only=True)
    model = Transformer(model_config("aogpt", n_layer=2, n_head=2, n_embd=24, block_size=32, vocab_size=101))
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
    if weights == "ema":
        with torch.no_grad():
            for p, shadow in zip(model.parameters(), ckpt["ema_model"]["shadow_params"], strict=True):
                p.copy_(shadow)
    return model.to(dtype).eval().requires_grad_(False)


def random_checkpoint(root: Path, variant: str, *, block_size: int, scale: float, ema_scale: float = 1.0,
                      vocab_size: int = 320) -> Path:
    """A run directory holding one checkpoint of a small model with large random weights (the bytes
    tokenizer); its EMA weights are the raw ones times `ema_scale`."""
    from aogpt.data.tokenizer import ByteTokenizer

    torch.manual_seed(0)
    extra = {"target_dim": 8} if variant == "aogpt" else {}
    cfg = model_config(variant, n_layer=2, n_head=2, n_embd=16, block_size=block_size, vocab_size=vocab_size,
                       **extra)
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, scale)
    ema = {k: v * ema_scale for k, v in model.state_dict().items()}
    path = root / f"run-{variant}" / "ckpt-0000010"
    save_checkpoint(path, model, config={"model": to_dict(cfg), "tokenizer": "bytes", "step": 10}, ema=ema,
                    tokenizer=ByteTokenizer())
    return path.parent


def random_model(variant: str, n: int = 8, vocab: int = 11, seed: int = 0, scale: float = 0.4) -> Transformer:
    """A small float64 model with *all* weights random (adaLN starts at zero otherwise): its
    conditionals are far from uniform and depend on the order."""
    torch.manual_seed(seed)
    extra = {"target_dim": 8} if variant == "aogpt" else {}
    model = Transformer(model_config(variant, n_layer=2, n_head=2, n_embd=16, block_size=n, vocab_size=vocab, **extra))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, scale)
    return model.double().eval().requires_grad_(False)


def prefix_conditional(model: Transformer, idx: torch.Tensor, order: list[int], i: int) -> float:
    """-log p(x[order[i]] | x[order[:i]]) from its own forward over exactly i + 1 slots."""
    x = idx[0]
    tokens = torch.tensor([[-1] + [int(x[p]) for p in order[:i]]])
    pos = torch.tensor([[0] + [p + 1 for p in order[:i]]])
    target = torch.tensor([order[: i + 1]])
    logits = model.forward_slots(tokens, pos, target)[0, -1]
    return float(-torch.log_softmax(logits, -1)[x[order[i]]])


# ----------------------------------------------------------------------------- CPU classes
# What this CPU can do comes from `aogpt.capability`; the suite also runs under the lesser-CPU switch
# (scripts/test.sh: AOGPT_CPU=avx2 with torch's own limits), where these markers skip what such a CPU
# cannot do; each skipped test has a sibling that tests the fallback.
needs_bf16 = pytest.mark.skipif(not capability.usable_precision(torch.bfloat16),
                                reason=f"needs a CPU that computes in bf16 (this one: {capability.cpu_class()}); "
                                "what such a CPU does instead is tested beside it")
needs_native_bf16 = pytest.mark.skipif(not capability.native_precision(torch.bfloat16),
                                       reason=f"needs bf16 units (this CPU: {capability.cpu_class()}); "
                                       "what such a CPU does instead is tested beside it")
needs_bf16_packing = pytest.mark.skipif(not capability.can_pack(torch.bfloat16),
                                        reason=f"needs oneDNN bf16 weight packing (this CPU: "
                                        f"{capability.cpu_class()}); what such a CPU does instead is tested beside it")
