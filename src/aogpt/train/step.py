"""One optimizer step: AdamW at the schedule's rate (`schedule`), accumulation over the global batch, clipping.

Every optimizer step reads one *global* batch (all ranks, all micro-steps), drawn by the trainer;
this rank takes its rows, micro-batch by micro-batch, so one process with gradient accumulation and
N processes compute the same update. The loss is the model family's (`ModelFamily.train_loss`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from aogpt.config import TrainConfig
from aogpt.errors import AOGPTError
from aogpt.families import family_of, unwrap
from aogpt.precision import resolve_precision
from aogpt.train import distributed
from aogpt.train.recipe import distilled_loss
from aogpt.train.schedule import LRSchedule
from aogpt.validation import field_range


def autocast_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of training (None: fp32); `auto` is `aogpt.precision.auto_precision`'s choice."""
    return training_precision(cfg, device)[0]


def training_precision(cfg: TrainConfig, device: torch.device) -> tuple[torch.dtype | None, str]:
    """(autocast dtype or None for fp32, a line saying which and why): what the plan line prints."""
    return resolve_precision(cfg.dtype, device)


def autocast(device: torch.device, dtype: torch.dtype | None):
    """The autocast context for `dtype` (from `autocast_dtype`); a no-op for None (fp32)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices and embeddings (>= 2-D) only, not on biases and norms. Two roles
    with their own rates (each group's ``lr_scale``, applied by `OptimizerStep`): the target pathway's
    parameters (`Transformer.target_pathway`) at `target_lr_mult` times the rate, the rest (the
    backbone) at `backbone_lr_mult` times it (`aogpt.train.recipe`)."""
    roles = cfg.target_lr_mult != 1.0 or cfg.backbone_lr_mult != 1.0
    target = {id(p) for p in unwrap(model).target_pathway().values()} if roles else set()
    params = [p for p in model.parameters() if p.requires_grad]
    groups = []
    for scale, members in ((cfg.backbone_lr_mult, [p for p in params if id(p) not in target]),
                           (cfg.target_lr_mult, [p for p in params if id(p) in target])):
        groups += [{"params": [p for p in members if p.dim() >= 2], "weight_decay": cfg.weight_decay,
                    "lr_scale": scale},
                   {"params": [p for p in members if p.dim() < 2], "weight_decay": 0.0, "lr_scale": scale}]
    groups = [g for g in groups if g["params"]]
    fused = device.type in ("cuda", "cpu")  # one kernel over all parameters: on CPU too since torch 2.4
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)


def accumulation_steps(cfg: TrainConfig, world_size: int, block_size: int) -> int:
    """Micro-steps per optimizer step: `grad_accum`, or derived from `global_batch_tokens`."""
    if cfg.global_batch_tokens <= 0:
        return cfg.grad_accum
    per_micro = world_size * cfg.batch_size * block_size
    if cfg.global_batch_tokens % per_micro:
        raise AOGPTError(
            f"global batch of {cfg.global_batch_tokens} tokens is not divisible by world size {world_size} x "
            f"micro-batch {cfg.batch_size} x block {block_size} = {per_micro}",
            "change --global-batch-tokens or --batch-size",
        )
    accum = cfg.global_batch_tokens // per_micro
    limit = field_range(TrainConfig, "grad_accum")
    limit.check(f"the accumulation steps derived from a global batch of {cfg.global_batch_tokens} tokens", accum,
                "lower --global-batch-tokens, or raise --batch-size")
    return accum


def training_loss(model: nn.Module, idx: torch.Tensor, order: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Mean per-token loss of the batch, as the model's family defines it: the any-order loss for
    decoders (one causal pass, the orders already drawn), the masked-diffusion loss for the encoder."""
    return family_of(model).train_loss(model, idx, order, generator).mean()


@dataclass
class StepResult:
    loss: float
    lr: float
    grad_norm: float


class NonFiniteLoss(AOGPTError):
    """The loss or the gradient norm became NaN or infinite; the step was not applied."""


def no_sync(model: nn.Module, skip: bool):
    """Skip the gradient all-reduce on micro-steps before the last (DDP `no_sync`, FSDP2's flag)."""
    if skip and hasattr(model, "no_sync"):
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(not skip)
    return contextlib.nullcontext()


@dataclass
class OptimizerStep:
    """The optimizer step over one global batch: set the LR, accumulate this rank's micro-batches,
    clip, check the loss is finite, step and zero the gradients. The trainer updates the EMA and
    its counters afterwards."""

    model: nn.Module  # the (DDP/FSDP) wrapped model: gradient sync, clipping
    step_model: nn.Module  # what the forward runs (`model`, or its torch.compile)
    optimizer: torch.optim.Optimizer
    cfg: TrainConfig
    info: distributed.DistInfo
    device: torch.device
    amp: torch.dtype | None
    accum: int
    schedule: LRSchedule
    teacher: nn.Module | None = None  # the frozen start, for `distill_l2r` (aogpt.train.recipe)
    hold: Callable[[int], float] | None = None  # the weight of distillation at a step (recipe.Hold; None: 1)

    def __call__(self, step: int, idx_all: torch.Tensor, order_all: torch.Tensor, order_gen: torch.Generator,
                 last_checkpoint: Path | None = None) -> StepResult:
        self.model.train()
        lr = self.schedule.lr(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        weight = self.cfg.distill_l2r * (self.hold(step) if self.hold is not None else 1.0)
        total = self._accumulate(idx_all, order_all, order_gen, weight)
        if step < self.cfg.freeze_backbone_steps:  # only the target pathway learns: AdamW skips a None gradient
            learning = {id(p) for p in unwrap(self.model).target_pathway().values()}
            for p in self.model.parameters():
                if id(p) not in learning:
                    p.grad = None
        grad_norm = (
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
            if self.cfg.grad_clip > 0
            else torch.zeros(())
        )
        loss_value = float(distributed.all_reduce_sum(total, self.info)) / self.info.world_size
        if not math.isfinite(loss_value) or not math.isfinite(float(grad_norm)):
            raise NonFiniteLoss(
                f"the training loss became {loss_value} at step {step + 1}",
                f"lower the learning rate; the last good checkpoint is {last_checkpoint or 'none'}",
            )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(loss=loss_value, lr=lr, grad_norm=float(grad_norm))

    def _accumulate(self, idx_all: torch.Tensor, order_all: torch.Tensor, order_gen: torch.Generator,
                    distill: float) -> torch.Tensor:
        """Forward and backward over this rank's micro-batches (`distill`: the KL weight of this step); the
        summed (detached) mean loss."""
        B, world, total = self.cfg.batch_size, self.info.world_size, torch.zeros((), device=self.device)
        for micro in range(self.accum):
            start = (micro * world + self.info.rank) * B
            idx = idx_all[start : start + B].to(self.device, non_blocking=True)
            order = order_all[start : start + B]
            sync = micro == self.accum - 1
            with no_sync(self.model, not sync), autocast(self.device, self.amp):
                if self.teacher is None:
                    loss = training_loss(self.step_model, idx, order, order_gen) / self.accum
                else:
                    loss = distilled_loss(self.step_model, self.teacher, idx, order, distill, order_gen) / self.accum
            if loss.requires_grad:  # not when every row read left to right through a gated model's frozen source
                loss.backward()
            total += loss.detach()
        return total
