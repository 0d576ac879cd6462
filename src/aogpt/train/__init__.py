"""Training: the trainer (`trainer.py`), the EMA of the weights (`ema.py`), DDP/FSDP (`distributed.py`)."""

from __future__ import annotations

from aogpt.train.ema import EMA
from aogpt.train.trainer import (
    PEAK_BF16_FLOPS,
    BatchSource,
    NonFiniteLoss,
    RandomTokens,
    StepResult,
    Trainer,
    accumulation_steps,
    autocast_dtype,
    flops_per_token,
    lr_at,
    make_optimizer,
    peak_flops,
    training_loss,
)

__all__ = [
    "EMA",
    "PEAK_BF16_FLOPS",
    "BatchSource",
    "NonFiniteLoss",
    "RandomTokens",
    "StepResult",
    "Trainer",
    "accumulation_steps",
    "autocast_dtype",
    "flops_per_token",
    "lr_at",
    "make_optimizer",
    "peak_flops",
    "training_loss",
]
