"""Small tensor functions that several layers need, each defined once."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """-log softmax(logits)[target] per row: logits (..., V), targets (...) -> (...), computed in at
    least float32 (logits may be bf16 under autocast; float64 stays float64)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           reduction="none").view(targets.shape)
