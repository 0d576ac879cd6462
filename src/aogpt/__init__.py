"""aogpt: any-order GPT (decoder-only masked diffusion) with AR, sigma-GPT and encoder-MDM baselines.

The public API, imported on first use (so ``import aogpt`` stays light):

    aogpt.Transformer, aogpt.ModelConfig, aogpt.model_config   the model and its config
    aogpt.load(path), aogpt.save(model, path)                  checkpoints (EMA weights by default)
    aogpt.adapt(source, variant, out)                          a pretrained left-to-right model as an any-order one
    aogpt.generate(model, ...), aogpt.infill(model, tmpl, ...) sampling, with GenerationSettings
    aogpt.evaluate(model, data, order=...)                     exact NLLs, any-order bounds, ensembles
    aogpt.conditional_logprobs(model, x, context, targets)     log p(x_t | a context read in this order)
    aogpt.evaluate_infill(model, tokens, ...)                  exact span likelihoods given both sides
    aogpt.family_of(model)                                     what a model is and can do
    aogpt.make_order_sampler(spec)                             the order vocabulary

Each name has one import path: these functions and classes here, the rest in the package that
holds the concept (`aogpt.evaluation.ensemble`, `aogpt.evaluation.genppl`, `aogpt.generation.settings`,
...). The modules that only re-exported evaluation and generation (``aogpt.evaluate.*``,
``aogpt.generate.*``, ``aogpt.ensemble``, ``aogpt.genppl``) are gone.
"""

from __future__ import annotations

import importlib
from typing import Any

from aogpt.capability import apply_switch

apply_switch()  # AOGPT_CPU: PyTorch's own limits set before torch starts (aogpt.capability)

__version__ = "0.1.0"

_EXPORTS = {
    "Transformer": "aogpt.model",
    "ModelConfig": "aogpt.config",
    "model_config": "aogpt.config",
    "save": "aogpt.checkpoint",
    "adapt": "aogpt.adaptation",
    "generate": "aogpt.generation.generate",
    "infill": "aogpt.generation.generate",
    "GenerationSettings": "aogpt.generation.settings",
    "DecodePlan": "aogpt.generation.settings",
    "SamplingConfig": "aogpt.sampling",
    "evaluate": "aogpt.evaluation.evaluate",
    "conditional_logprobs": "aogpt.evaluation.evaluate",
    "evaluate_infill": "aogpt.evaluation.infill",
    "family_of": "aogpt.families",
    "make_order_sampler": "aogpt.orders",
    "AOGPTError": "aogpt.errors",
}


def load(path, weights: str = "ema", device="cpu", dtype=None):
    """Load a trained or imported checkpoint: returns `Loaded` (model, tokenizer, config).

    EMA weights by default; `dtype` a torch dtype or a precision name (``fp32``, ``bf16``, ...; default
    fp32); see `aogpt.checkpoint.load`.
    """
    from aogpt.checkpoint import load as _load

    return _load(path, weights=weights, device=device, dtype=dtype or "fp32")


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'aogpt' has no attribute {name!r}")


__all__ = ["load", "__version__", *_EXPORTS]
