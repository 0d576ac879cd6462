"""The family registry: the one module that answers "which variant am I, and what can I do?".

Every variant name in a config maps to a `ModelFamily` object (`aogpt.families.base`) holding its
architecture defaults, its capabilities (any-order, ensembles, parallel steps, KV cache) and its
behaviour (training loss, exact NLL under an order, any-order bound, validation, sampler).

    decoder.py   gpt, sigma, aogpt: one causal pass per order, KV-cache generation
    encoder.py   encoder-mdm: the bidirectional masked-diffusion baseline

To add a family: write its module (a `ModelFamily` subclass and its instance) and add it to the
`register(...)` line below. Training, evaluation, generation and the configs then know it.
"""

from __future__ import annotations

from typing import Any

from aogpt.errors import AOGPTError
from aogpt.families.base import ModelFamily, unwrap
from aogpt.families.decoder import AOGPT, GPT, SIGMA
from aogpt.families.encoder import ENCODER_MDM

FAMILIES: dict[str, ModelFamily] = {}


def register(*families: ModelFamily) -> None:
    """Make families known by their variant names (a later registration replaces an earlier one)."""
    for fam in families:
        FAMILIES[fam.name] = fam


register(GPT, SIGMA, AOGPT, ENCODER_MDM)


def family(variant: str) -> ModelFamily:
    """The family of a variant name; an unknown name is a user error listing the known ones."""
    try:
        return FAMILIES[variant]
    except (KeyError, TypeError):
        raise AOGPTError(f"unknown variant {variant!r}", f"choose one of: {', '.join(FAMILIES)}") from None


def family_of(obj: Any) -> ModelFamily:
    """The family of a model (wrapped or not, or `aogpt.load`'s result), a config, or a variant name."""
    if isinstance(obj, str):
        return family(obj)
    cfg = obj if hasattr(obj, "variant") else getattr(unwrap(obj), "config", None)
    if cfg is None:
        raise AOGPTError(f"{type(obj).__name__} is not an aogpt model", "load one with aogpt.load(path)")
    return family(cfg.variant)


__all__ = ["FAMILIES", "ModelFamily", "family", "family_of", "register", "unwrap"]
