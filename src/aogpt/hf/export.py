"""A checkpoint as a Hugging Face folder: what `aogpt export --format hf` writes.

The folder holds ``config.json`` (`AOGPTConfig`, with an ``auto_map``), ``model.safetensors`` (one
set of weights, EMA by default, under ``model.<our parameter name>``), the modeling and
configuration files that ``trust_remote_code=True`` loads, ``generation_config.json`` and the
tokenizer (``tokenizer.json`` and ``tokenizer_config.json``). ``AutoModelForCausalLM`` and
``AutoTokenizer`` load it, and so does `aogpt.load` (without importing transformers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aogpt.checkpoint import load, load_state_into, unique_state
from aogpt.errors import AOGPTError
from aogpt.families import family_of, unwrap
from aogpt.hf.configuration_aogpt import AOGPTConfig
from aogpt.hf.modeling_aogpt import AOGPTForCausalLM
from aogpt.hf.tokenization import to_hf_tokenizer
from aogpt.io import atomic_dir


def to_hf(model: Any, tokenizer: Any = None, *, weights: str | None = None, step: int = 0) -> AOGPTForCausalLM:
    """An `AOGPTForCausalLM` holding a copy of `model`'s weights (a `Transformer` or `aogpt.load`'s
    result, whose tokenizer, weights and step are then used unless given)."""
    core = unwrap(model)
    if getattr(core, "config", None) is None or not hasattr(core, "forward_slots"):
        raise AOGPTError(f"{type(model).__name__} is not an aogpt model", "pass aogpt.load(path) or a Transformer")
    if not family_of(core).causal:
        raise AOGPTError(f"variant {core.config.variant} is a bidirectional encoder, not a causal language model",
                         "export a gpt, sigma or aogpt checkpoint (aogpt.load reads the encoder as it is)")
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    extra: dict[str, Any] = {"weights": weights or getattr(model, "weights", None),
                             "training_step": int(step or getattr(model, "step", 0))}
    if tokenizer is not None:
        extra.update(tokenizer=tokenizer.spec, eos_token_id=tokenizer.eot_id)
    hf = AOGPTForCausalLM(AOGPTConfig.from_model_config(core.config, **extra))
    param = next(core.parameters())
    load_state_into(hf.model, unique_state(core), where="the model")  # a tied head is the embedding, loaded once
    hf.generation_config.eos_token_id = extra.get("eos_token_id")
    return hf.to(device=param.device, dtype=param.dtype).eval()


def export_hf(run: str | Path, out: str | Path, *, weights: str = "ema", overwrite: bool = False) -> dict[str, Any]:
    """Write a run's newest checkpoint (or a ckpt-* directory) as a Hugging Face folder at `out`."""
    from transformers.utils import logging as hf_logging

    loaded = load(run, weights=weights)
    hf = to_hf(loaded)
    out = Path(out)
    progress_bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # our own progress line is the one the user sees
    try:
        with atomic_dir(out, overwrite=overwrite) as tmp:
            hf.save_pretrained(tmp)
            if loaded.tokenizer is not None:
                to_hf_tokenizer(loaded.tokenizer, model_max_length=loaded.config.block_size).save_pretrained(tmp)
                if loaded.tokenizer.spec == "hf":  # what `aogpt.load` of the folder reads besides tokenizer.json
                    loaded.tokenizer.save_meta(tmp)
    finally:
        if progress_bars:
            hf_logging.enable_progress_bar()
    return {"checkpoint": str(loaded.path), "out": str(out), "variant": loaded.config.variant,
            "weights": loaded.weights, "step": loaded.step, "params": loaded.model.num_params(),
            "tokenizer": getattr(loaded.tokenizer, "spec", None),
            "files": sorted(p.name for p in out.iterdir())}


__all__ = ["export_hf", "to_hf"]
