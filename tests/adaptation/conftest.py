"""Tiny `transformers` decoders with random weights, saved as folders with a tokenizer (no download)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


def _noisy(model: torch.nn.Module, seed: int, scale: float = 0.2) -> torch.nn.Module:
    """Every weight perturbed (norm weights too): logits far from uniform, so equality means something."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


def _fast_tokenizer(kind: str, bos: bool) -> object:
    from transformers import PreTrainedTokenizerFast

    from aogpt.data.tokenizer import load_tokenizer
    from aogpt.hf.tokenization import backend_tokenizer

    special = {"bos_token": "<|endoftext|>"} if bos else {}
    return PreTrainedTokenizerFast(tokenizer_object=backend_tokenizer(load_tokenizer(kind)), eos_token="<|endoftext|>",
                                   **special)


def make_hf(root: Path, arch: str, *, bos: bool = True, tied: bool = False, seed: int = 0,
            tokenizer: bool = True) -> Path:
    """A folder holding a tiny `arch` model (gpt2, llama, qwen2) and, unless `tokenizer` is False, its
    tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    if arch == "gpt2":
        cfg = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=33, vocab_size=50257)
        model, tok = GPT2LMHeadModel(cfg), _fast_tokenizer("gpt2", bos)
    else:
        cls_cfg, cls = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
        cfg = cls_cfg(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=40, vocab_size=264, max_position_embeddings=33, rms_norm_eps=1e-6,
                      rope_parameters={"rope_type": "default", "rope_theta": 500.0}, tie_word_embeddings=tied,
                      bos_token_id=256 if bos else None, eos_token_id=256)
        model, tok = cls(cfg), _fast_tokenizer("bytes", bos)
    model = _noisy(model, seed).eval()
    out = root / f"{arch}-{'bos' if bos else 'nobos'}-{'tied' if tied else 'untied'}{'' if tokenizer else '-notok'}"
    model.save_pretrained(out)
    if tokenizer:
        tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf-models")
    return {"gpt2": make_hf(root, "gpt2"), "llama": make_hf(root, "llama"),
            "qwen2": make_hf(root, "qwen2", bos=False, tied=True)}
