"""aogpt: any-order GPT (decoder-only masked diffusion) with AR, sigma-GPT and encoder-MDM baselines."""

from __future__ import annotations

__version__ = "0.1.0"


def load(path, weights: str = "ema", device="cpu", dtype=None):
    """Load a trained or imported checkpoint: returns `Loaded` (model, tokenizer, config).

    EMA weights by default; see `aogpt.checkpoint.load`.
    """
    import torch

    from aogpt.checkpoint import load as _load

    return _load(path, weights=weights, device=device, dtype=dtype or torch.float32)


__all__ = ["load", "__version__"]
