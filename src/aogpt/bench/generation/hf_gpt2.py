"""Hugging Face `transformers` GPT-2 as a generation contender: what a user would otherwise reach for.

A `GPT2LMHeadModel` of the same size as ours (layers, width, heads, vocabulary, context), random
weights, generating n tokens after one start token with `generate()`: KV cache on, sampling on
(temperature 1, no top-k, top-p as asked), no early stop. Only built when `transformers` is
installed; the benchmark says so when it is not.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from typing import Any

import torch

from aogpt.bench.common import Size


def available() -> bool:
    return importlib.util.find_spec("transformers") is not None


def build(size: Size, n: int, device: torch.device, seed: int) -> Any:
    """A random GPT-2 (GPT2LMHeadModel) of `size` with a context of n + 1 (the start token)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=size.vocab_size, n_positions=n + 1, n_embd=size.n_embd, n_layer=size.n_layer,
                     n_head=size.n_head, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(cfg).to(device).eval()


def generate_call(model: Any, n: int, batch: int, seed: int, top_p: float = 1.0,
                  temperature: float = 1.0) -> Callable[[], torch.Tensor]:
    """One call = a batch of n sampled tokens each, exactly n (EOS does not stop it)."""
    device = next(model.parameters()).device
    start = torch.zeros(batch, 1, dtype=torch.long, device=device)
    mask = torch.ones_like(start)

    from transformers.utils import logging as hf_logging

    def call() -> torch.Tensor:
        torch.manual_seed(seed)
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # its advice on padding does not apply: nothing is padded
        try:
            with torch.inference_mode(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return model.generate(start, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                      do_sample=True, top_k=0, top_p=top_p, temperature=temperature, use_cache=True,
                                      pad_token_id=0)
        finally:
            hf_logging.set_verbosity(verbosity)

    return call
