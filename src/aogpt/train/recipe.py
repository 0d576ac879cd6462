"""Fine-tuning an adapted model without losing what its source knew (docs/adapt.md).

An adapted decoder (`aogpt.adaptation`) equals its left-to-right source at step 0. Trained on
mostly-random orders, the parameters every order shares (the backbone, and the adaLN biases of the
target pathway) move towards what random orders need, and the left-to-right quality it started
with is lost within a few steps. Three things hold it, each a `TrainConfig` field:

- **parameter roles** (`backbone_lr_mult`, `target_lr_mult`; `aogpt.train.step.make_optimizer`):
  the pretrained backbone at a low rate (no re-warm-up to a pre-training peak), the new target
  pathway at a higher one;
- **replay** (`replay_l2r`): a share of every step's sequences read left to right, drawn here
  (`replay_rows`) on top of whatever order the curriculum's stage draws;
- **distillation** (`distill_l2r`): on the sequences read left to right, the KL divergence from the
  frozen start (`teacher`: a copy of the weights training started from, which read left to right
  *are* the source) to the model, added to the loss (`distilled_loss`).

Replay and distillation hold the model to its source, and hold it back from the other orders too. The
**hold** (`Hold`, `hold_floor`) lets go when the orders do: both are weighted by
``floor + (1 - floor) * closeness``, where closeness measures how far the step's orders (the order
curriculum's stage, `aogpt.curriculum.Curriculum`) still are from the run's own ones towards left to right,
by the share of their steps that read the leftmost unread position, as left to right does every step
(`leftmost_share`): 1 in the curriculum's left-to-right opening, falling through its Mallows ramp, 0
(the floor) once the orders are the run's. A function of the step and the config alone, so a checkpoint
keeps it (its config) and a resumed run follows it exactly.
"""

from __future__ import annotations

import copy
import math
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from aogpt.config import TrainConfig
from aogpt.errors import AOGPTError
from aogpt.families import family_of


def replay_rows(order: torch.Tensor, share: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """`order` (B, n) with each row, independently with probability `share`, replaced by left to right.

    The draw is one uniform number per row from `generator` (on the orders' device), so the number of
    replayed rows of a step is Binomial(B, share) and which rows does not depend on the orders."""
    if share <= 0:
        return order
    B, n = order.shape
    keep = torch.rand(B, device=order.device, generator=generator) >= share
    l2r = torch.arange(n, device=order.device).expand(B, n)
    return torch.where(keep[:, None], order, l2r)


def replay_from(cfg: TrainConfig) -> int:
    """The first step replay applies to: after the curriculum's leading left-to-right stages (which read
    left to right anyway: drawing there would only shift the order stream)."""
    from aogpt.curriculum import make_curriculum

    start = 0
    for begin, end, stage in make_curriculum(cfg.curriculum, cfg.order, cfg.l2r_first_steps, cfg.decay_steps).stages:
        if begin != start or isinstance(stage, tuple) or not stage.left_to_right:
            break
        start = end
    return start


def leftmost_share(sampler: object, n: int) -> float:
    """The expected share of the n steps of an order drawn from `sampler` that read the leftmost position not
    yet read (rank 0 in `aogpt.orders.decode_ranks`), exactly: 1 for left to right, the mean over the m = n..1
    positions left of P(rank 0) for the samplers that draw ranks (uniform 1/m, Mallows (1 - q) / (1 - q^m)
    with q = e^-theta, window 1 / min(W, m)), a mixture's weighted, and a fixed permutation's own count."""
    from aogpt.orders import Blend, Fixed, Infill, Mallows, Mixture, Uniform, Window

    if getattr(sampler, "left_to_right", False):
        return 1.0
    if isinstance(sampler, Blend):
        return sum(w * leftmost_share(part, n) for part, w in sampler.parts)
    if isinstance(sampler, Infill):  # the prefix's and the gap's steps read the leftmost unread position, the suffix's
        # not (its first step skips the gap): a + L of n steps, the start a uniform on 0..n-L
        lengths = sampler.gap_lengths(n)
        return sum((n - g) / 2 + g for g in lengths) / len(lengths) / n
    if isinstance(sampler, Uniform):
        return _mean_over_remaining(n, lambda m: 1.0 / m)
    if isinstance(sampler, Mixture):
        return sampler.p_l2r + (1 - sampler.p_l2r) * _mean_over_remaining(n, lambda m: 1.0 / m)
    if isinstance(sampler, Mallows):
        theta = sampler.theta
        if theta == 0:
            return _mean_over_remaining(n, lambda m: 1.0 / m)
        return _mean_over_remaining(n, lambda m: -math.expm1(-theta) / -math.expm1(-theta * m))
    if isinstance(sampler, Window):
        return _mean_over_remaining(n, lambda m: 1.0 / min(sampler.width, m))
    if isinstance(sampler, Fixed):
        perm = sampler.permutation(n)
        later_smaller = (perm[None, :] < perm[:, None]).triu(diagonal=1).sum(1)  # each step's rank
        return int((later_smaller == 0).sum()) / n
    raise AOGPTError(f"order {getattr(sampler, 'spec', sampler)!r} has no known leftmost share",
                     "use l2r, uniform, mixture, mallows, window, fixed-random, blockwise, infill orders or blends")


def _mean_over_remaining(n: int, p_rank0) -> float:
    return sum(p_rank0(m) for m in range(1, n + 1)) / n


class Hold:
    """The weight of replay and distillation at each step (module docstring): ``floor + (1 - floor) *
    closeness``, closeness = (share - final) / (1 - final) clipped to [0, 1], with share the step's orders'
    `leftmost_share` and final the run's own orders'. `floor` 1 (`TrainConfig.hold_floor`'s default) is a
    constant weight. With `hold_anneal` above the floor, the weight climbs back linearly from the floor to it
    over the learning rate's decay, step for step with the rate (`LRSchedule.decay_in_rate` of the run's own
    schedule, whose decay a time budget may place; wsd only), and is the larger of the two."""

    def __init__(self, cfg: TrainConfig, n: int, schedule: Any = None):
        from aogpt.curriculum import make_curriculum
        from aogpt.train.schedule import LRSchedule

        self.floor, self.anneal, self.n = cfg.hold_floor, cfg.hold_anneal, n
        self.schedule = schedule if schedule is not None else LRSchedule(cfg)
        self.curriculum = make_curriculum(cfg.curriculum, cfg.order, cfg.l2r_first_steps, cfg.decay_steps)
        self.final = leftmost_share(self.curriculum.final, n)
        self._closeness = lru_cache(maxsize=4096)(self._closeness_uncached)

    def _closeness_uncached(self, step: int) -> float:
        if self.final >= 1.0:  # the run reads left to right: nothing to let go of
            return 1.0
        share = leftmost_share(self.curriculum.at(step), self.n)
        return min(1.0, max(0.0, (share - self.final) / (1.0 - self.final)))

    def closeness(self, step: int) -> float:
        """How close step `step`'s orders are to left to right, relative to the run's own (0..1)."""
        return self._closeness(step)

    def __call__(self, step: int) -> float:
        if self.floor >= 1.0:
            return 1.0
        held = self.floor + (1.0 - self.floor) * self.closeness(step)
        if self.anneal > self.floor:
            climb = self.schedule.decay_in_rate(step) if self.schedule.cfg.lr_schedule == "wsd" else 0.0
            held = max(held, self.floor + (self.anneal - self.floor) * climb)
        return held


def left_to_right_rows(order: torch.Tensor) -> torch.Tensor:
    """(B,) bool: the rows of `order` that read left to right."""
    return (order == torch.arange(order.shape[1], device=order.device)).all(dim=1)


def make_teacher(model: nn.Module, cfg: TrainConfig) -> nn.Module | None:
    """A frozen copy of the weights training starts from, when `distill_l2r` asks for one (else None).
    Called after ``init_from`` is loaded: read left to right, an adapted model's start is its source."""
    if cfg.distill_l2r <= 0:
        return None
    if not cfg.init_from:
        raise AOGPTError("distill_l2r distils towards the model training starts from, and this run starts from "
                         "random weights", "fine-tune an adapted checkpoint (--init-from DIR), or drop distill_l2r")
    teacher = copy.deepcopy(model).eval()
    teacher.requires_grad_(False)
    return teacher


def kl_to_teacher(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) per token (..., V) -> (...), in float32."""
    t = F.log_softmax(teacher_logits.float(), dim=-1)
    s = F.log_softmax(student_logits.float(), dim=-1)
    return (t.exp() * (t - s)).sum(-1)


def distilled_loss(model: nn.Module, teacher: nn.Module, idx: torch.Tensor, order: torch.Tensor,
                   weight: float, generator: torch.Generator) -> torch.Tensor:
    """The family's mean training loss plus `weight` x the mean KL from `teacher` to `model` over the
    tokens of the rows read left to right (nothing is added when a step has none). The student's logits
    come from the same forward as its loss; the teacher reads only the left-to-right rows."""
    logits, losses = model(idx, order)
    loss = losses.mean()
    rows = left_to_right_rows(order)
    if weight > 0 and bool(rows.any()):
        with torch.no_grad():
            target = teacher(idx[rows])[0]
        loss = loss + weight * kl_to_teacher(logits[rows, : idx.shape[1]], target).mean()
    return loss


def check_recipe(model: nn.Module, cfg: TrainConfig) -> None:
    """Refuse recipe fields the model cannot use: distillation and replay read left to right, which only
    a causal decoder does."""
    if (cfg.distill_l2r > 0 or cfg.replay_l2r > 0) and not family_of(model).causal:
        raise AOGPTError(f"variant {family_of(model).name} draws masks, not orders: replay_l2r and distill_l2r "
                         "do nothing", "drop replay_l2r and distill_l2r")


def against_source(scores: dict[str, float], source: dict[str, float], weights: str = "ema") -> str:
    """One line: validation in both orders with the difference to the start's (`source`) beside each,
    in bits per byte where the data has bytes (nats per token otherwise)."""
    unit, prefix = ("bits/byte", "bpb") if f"bpb/l2r/{weights}" in scores else ("nats/token", "val")
    parts = []
    for kind, label in (("l2r", "left to right"), ("any", "any order")):
        now, then = scores.get(f"{prefix}/{kind}/{weights}"), source.get(f"{prefix}/{kind}/source")
        if now is None or then is None:
            continue
        parts.append(f"{label} {now:.3f} (source {then:.3f}, {now - then:+.3f})")
    return f"validation, {weights} weights, {unit}: " + "; ".join(parts)


def describe(cfg: TrainConfig) -> str:
    """The plan line's words for the recipe's fields ("" when none is in use)."""
    parts = []
    if cfg.backbone_lr_mult != 1.0 or cfg.target_lr_mult != 1.0:
        backbone, target = cfg.lr * cfg.backbone_lr_mult, cfg.lr * cfg.target_lr_mult
        parts.append(f"rates: backbone {backbone:g}, target pathway {target:g} at the peak")
    if cfg.replay_l2r > 0:
        parts.append(f"{100 * cfg.replay_l2r:g}% of the sequences replayed left to right")
    if cfg.distill_l2r > 0:
        parts.append(f"left-to-right sequences distilled towards the start (KL weight {cfg.distill_l2r:g})")
    if (cfg.replay_l2r > 0 or cfg.distill_l2r > 0) and cfg.hold_floor < 1:
        parts.append(f"both at full weight while the orders read left to right, letting go as they move towards "
                     f"the run's own, to {cfg.hold_floor:g}x once they are"
                     + (f", and back to {cfg.hold_anneal:g}x over the learning rate's decay"
                        if cfg.hold_anneal > cfg.hold_floor else ""))
    return "; ".join(parts)


def left_to_right_share(cfg: TrainConfig, hold: float = 1.0) -> float:
    """The expected share of sequences read left to right once the curriculum is over, with the hold (`Hold`)
    at `hold`: replayed ones, and the run's own order's (a mixture's left-to-right share; all of them for left
    to right)."""
    from aogpt.orders import Mixture, make_order_sampler

    final = make_order_sampler(cfg.order)
    own = 1.0 if final.left_to_right else (final.p_l2r if isinstance(final, Mixture) else 0.0)
    replay = cfg.replay_l2r * hold
    return replay + (1.0 - replay) * own


def teacher_cost(cfg: TrainConfig, params: int) -> tuple[int, float]:
    """What distillation adds: the teacher's fp32 weights in bytes, and its forward on the left-to-right
    sequences as a share of a training step's FLOPs (a forward is about a third of forward + backward), at
    most: with replay at full weight."""
    if cfg.distill_l2r <= 0:
        return 0, 0.0
    return 4 * params, left_to_right_share(cfg) / 3
