"""Training: AdamW, cosine or warm-up-stable-decay rates, accumulation, clipping, EMA, validation, checkpoints, DDP.

    planning.py       plan(...): a run's configuration resolved in one pass (preset, config file,
                      overrides, flags, resume or init, vocabulary, checks) -> a frozen RunPlan that runs
    trainer.py        Trainer: builds one run (model, EMA, optimizer, streams, wrappers), composes the parts
    init.py           options for where training starts on the target pathway (never the forward)
    step.py           the optimizer step over the global batch; optimizer, accumulation, loss
    schedule.py       the learning-rate schedule (cosine, or warm-up-stable-decay fitted to a time budget)
    validation.py     periodic validation: left-to-right and any-order loss, raw and EMA weights
    checkpointing.py  what trainer.pt holds, full-state gathering under FSDP, save and resume
    metrics.py        metrics.jsonl (truncated on resume) and the loss plot
    loop.py           Trainer.fit: signals, time limit, logging/eval/checkpoint cadence, progress
    throughput.py     training FLOPs per token, GPU peaks (MFU), the tokens/s window
    sources.py        BatchSource (what the trainer reads) and RandomTokens
    ema.py            the exponential moving average of the weights
    distributed.py    torchrun process groups, DDP/FSDP2 wrapping, collectives

Reproducibility. Every optimizer step draws its *global* batch (all ranks, all micro-steps) from one
data generator and one order generator shared by every rank; each rank then takes its rows. So one
process with gradient accumulation and N processes see exactly the same sequences and orders, and
a resumed run continues the same streams (their states are in the checkpoint). On CPU the metrics
of a resumed run equal those of an uninterrupted one.

Validation uses the same held-out windows every time: the left-to-right loss, and the any-order
loss under orders drawn from a generator re-seeded with `eval_orders_seed` (the same orders every
time), for the raw and the EMA weights.
"""

from __future__ import annotations

from aogpt.train.ema import EMA
from aogpt.train.planning import RunPlan, plan, run_lock
from aogpt.train.schedule import LRSchedule, lr_at
from aogpt.train.sources import BatchSource, RandomTokens
from aogpt.train.step import (
    NonFiniteLoss,
    OptimizerStep,
    StepResult,
    accumulation_steps,
    autocast_dtype,
    make_optimizer,
    training_loss,
    training_precision,
)
from aogpt.train.throughput import PEAK_BF16_FLOPS, flops_per_token, peak_flops
from aogpt.train.trainer import Trainer
from aogpt.train.validation import Validation

__all__ = [
    "EMA",
    "LRSchedule",
    "PEAK_BF16_FLOPS",
    "BatchSource",
    "NonFiniteLoss",
    "OptimizerStep",
    "RandomTokens",
    "RunPlan",
    "StepResult",
    "Trainer",
    "Validation",
    "accumulation_steps",
    "autocast_dtype",
    "flops_per_token",
    "lr_at",
    "make_optimizer",
    "peak_flops",
    "plan",
    "run_lock",
    "training_loss",
    "training_precision",
]
