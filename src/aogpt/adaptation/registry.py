"""What a source model is, and which reader turns it into our backbone.

A reader returns a `Source`: the backbone as `ModelConfig` fields, its weights under our parameter
names (those of a left-to-right `gpt` model: ``transformer.wte.weight``, ``transformer.h.0.ln_1.weight``,
..., ``transformer.ln_f.weight``, ``lm_head.weight`` unless tied), the start slot's embedding and the
tokenizer. Readers: our own runs (`aogpt.adaptation.ours`), and `transformers` architectures by
their class name in `ARCHITECTURES` (`aogpt.adaptation.gpt2`, `aogpt.adaptation.llama`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aogpt.adaptation.source import Source
from aogpt.errors import AOGPTError


def _architectures() -> dict[str, Callable[[Any, Any, Path | str], Source]]:
    from aogpt.adaptation import gpt2, llama

    return {"GPT2LMHeadModel": gpt2.read, "LlamaForCausalLM": llama.read, "Qwen2ForCausalLM": llama.read}


SUPPORTED = ("GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM")


def _is_ours(path: Path) -> bool:
    """An aogpt checkpoint or run directory (not a Hugging Face folder)."""
    if (path / "model.safetensors").is_file() and (path / "config.json").is_file():
        from aogpt.io import read_json

        cfg = read_json(path / "config.json", what="config")
        return isinstance(cfg, dict) and "format" in cfg and "model" in cfg
    return any(path.glob("ckpt-*/model.safetensors"))


def read_source(source: str | Path) -> Source:
    """The `Source` behind a folder, a hub name or one of our runs; a user error for anything else."""
    path = Path(source)
    if path.is_dir() and _is_ours(path):
        from aogpt.adaptation.ours import read

        return read(path)
    looks_local = path.is_absolute() or str(source).startswith((".", "~")) or path.exists() or \
        str(source).count("/") != 1
    if looks_local and not path.is_dir():
        raise AOGPTError(f"source {source} does not exist",
                         "pass a folder with a transformers causal LM (config.json, weights, tokenizer), "
                         "a hub name such as openai-community/gpt2, or an aogpt gpt run")
    return _read_transformers(source)


def _read_transformers(source: str | Path) -> Source:
    try:
        from transformers import AutoConfig
    except ImportError:
        raise AOGPTError("reading a transformers model needs the transformers package",
                         "pip install transformers") from None
    try:
        config = AutoConfig.from_pretrained(str(source))
    except (OSError, ValueError, KeyError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise AOGPTError(f"cannot read a transformers config from {source}: {first}",
                         "pass a folder with config.json (or a hub name, with a network)") from None
    arch = (getattr(config, "architectures", None) or [""])[0]
    if not arch.endswith(("ForCausalLM", "LMHeadModel")) or not getattr(config, "is_decoder", True) and \
            getattr(config, "is_encoder_decoder", False):
        raise AOGPTError(f"{source} is not a causal (left-to-right) language model (architecture "
                         f"{arch or config.model_type})", f"adapt one of: {', '.join(SUPPORTED)}")
    readers = _architectures()
    if arch not in readers:
        raise AOGPTError(f"architecture {arch} of {source} is not supported", f"adapt one of: {', '.join(SUPPORTED)}")
    tokenizer = _hf_tokenizer(source)
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and len(tokenizer) > vocab:  # before the weights are read
        raise AOGPTError(f"{source}: the tokenizer has {len(tokenizer)} tokens but the model embeds only {vocab}",
                         "use the tokenizer the model was trained with")
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no loading bar between our lines
    try:
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return readers[arch](model, tokenizer, source)


# What a tokenizer is read from: its Hugging Face JSON, or the vocabulary files it is built from.
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "vocab.txt")


def _has_tokenizer_files(source: str | Path) -> bool:
    from transformers.utils import cached_file

    return any(cached_file(str(source), name, _raise_exceptions_for_missing_entries=False,
                           _raise_exceptions_for_connection_errors=False) is not None for name in TOKENIZER_FILES)


def _hf_tokenizer(source: str | Path) -> Any:
    """The source's own tokenizer. One rule for every architecture: without tokenizer files beside the
    model there is nothing to adapt with (`transformers` would build an empty vocabulary for some
    families and fail for others), so the source is refused the same way whatever its family."""
    if not _has_tokenizer_files(source):
        raise AOGPTError(f"{source} has no tokenizer files: none of {', '.join(TOKENIZER_FILES)}",
                         "save the model's tokenizer beside it: tokenizer.save_pretrained(FOLDER)")
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise AOGPTError(f"{source} has no tokenizer that loads ({first})",
                         "save the model's tokenizer beside it (tokenizer.save_pretrained)") from None
