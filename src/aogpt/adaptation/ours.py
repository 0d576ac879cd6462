"""Our own left-to-right `gpt` runs as a source: the backbone is already ours, the start slot its own."""

from __future__ import annotations

from pathlib import Path

from aogpt.adaptation.source import Source
from aogpt.errors import AOGPTError

# ModelConfig fields that describe the backbone (everything but the variant's target pathway).
BACKBONE_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "dropout", "bias", "norm", "norm_eps",
                   "tie_head", "head_bias", "pos_init", "positions", "rope_theta", "mlp", "mlp_hidden", "n_kv_head",
                   "qkv_bias", "mlp_bias")


def read(path: Path) -> Source:
    """The EMA weights of a `gpt` run (or checkpoint): its learned start slot stays the start slot."""
    from aogpt.checkpoint import load, unique_state
    from aogpt.families import family

    loaded = load(path)
    cfg = loaded.config
    if not family(cfg.variant).causal:
        raise AOGPTError(f"{path} is a {cfg.variant} model, not a causal (left-to-right) decoder",
                         "adapt a gpt run or a transformers causal LM")
    if cfg.target != "none":
        raise AOGPTError(f"{path} is a {cfg.variant} model: it reads any order already",
                         "fine-tune it with train --init-from, or adapt a gpt run")
    if loaded.tokenizer is None:
        raise AOGPTError(f"{path} records no tokenizer", "adapt a run trained by aogpt train")
    backbone = {k: getattr(cfg, k) for k in BACKBONE_FIELDS if hasattr(cfg, k)}
    state = {k: v.detach().clone() for k, v in unique_state(loaded.model).items()}
    return Source(kind="gpt run", backbone=backbone, state=state, tokenizer=loaded.tokenizer,
                  start_note="the run's own learned start slot")
