"""The learning-rate schedule of a run, and the step it ends at.

Two shapes (`TrainConfig.lr_schedule`):

- ``cosine``: linear warm-up to `lr`, cosine decay to `min_lr` at `TrainConfig.decay_steps`
  (`max_steps`, or the original horizon of a run extended with ``--extend-to``), `min_lr` after it.
  The run ends at `max_steps`; a time limit (`max_minutes`) may stop it earlier, before its rate
  has decayed.
- ``wsd`` (warm-up, stable, decay; MiniCPM 2024): linear warm-up, then `lr` held constant, then a
  linear decay to `min_lr` over the last `decay_share` of the run, which ends decayed. The decay
  begins at the first of two moments: step ``(1 - decay_share) * max_steps``, or, under a time limit,
  when ``(1 - decay_share)`` of `max_minutes` has been spent training. In the second case the decay's
  length in steps is fitted then to the speed of the steps so far, so the run ends, decayed, at about
  its time limit on a fast machine and on a slow one. Because the rate is constant until the decay
  begins, nothing done before that moment depends on when it comes.

The moment the decay began and its length are the schedule's state (`state_dict`): a checkpoint
keeps them, so a resumed run follows exactly the schedule it was on. Only the decision itself, taken
from a clock, differs between machines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from aogpt.config import TrainConfig

TIME_MARGIN = 0.98  # the share of the remaining time the fitted decay plans to use (steps vary a little)


def cosine_lr(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to `lr`, then cosine decay to `min_lr` at `cfg.decay_steps`; `min_lr` after."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    end = cfg.decay_steps
    if step >= end:
        return cfg.min_lr
    progress = (step - cfg.warmup_steps) / max(1, end - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """The rate of `step` in a run whose schedule has taken no decision by the clock (tests, plots)."""
    return LRSchedule(cfg).lr(step)


@dataclass
class LRSchedule:
    """The rate at every step and the step the run ends at, for one run (`TrainConfig`)."""

    cfg: TrainConfig
    decay_start: int | None = None  # wsd: the step the decay began (None: not yet)
    decay_steps: int | None = None  # wsd: its length in steps

    @property
    def time_budgeted(self) -> bool:
        """Whether the time limit decides when the decay begins (wsd under `max_minutes`)."""
        return self.cfg.lr_schedule == "wsd" and self.cfg.max_minutes > 0

    @property
    def end_step(self) -> int:
        """The step the run ends at: `max_steps`, or where a decay decided by the clock ends."""
        extended = self.cfg.schedule_steps > 0  # --extend-to: on past the decay, at min_lr
        if self.cfg.lr_schedule == "wsd" and self.decay_start is not None and not extended:
            return min(self.decay_start + self.decay_steps, self.cfg.max_steps)
        return self.cfg.max_steps

    def _planned_decay(self) -> tuple[int, int]:
        """wsd by steps alone: the decay over the last `decay_share` of `max_steps`."""
        steps = max(1, round(self.cfg.decay_share * self.cfg.max_steps))
        return self.cfg.max_steps - steps, steps

    def lr(self, step: int) -> float:
        cfg = self.cfg
        if cfg.lr_schedule == "cosine":
            return cosine_lr(step, cfg)
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        return cfg.lr + self.decay_in_rate(step) * (cfg.min_lr - cfg.lr)

    def decay_in_rate(self, step: int) -> float:
        """wsd: how much of the decay step `step`'s rate has: 0 before it, 1 at its last step (which runs at
        `min_lr`), linear between. What else follows the decay (the recipe's hold) reads it here."""
        start, length = (self.decay_start, self.decay_steps) if self.decay_start is not None else self._planned_decay()
        if step < start:
            return 0.0
        return min(1.0, (step - start + 1) / max(length, 1))

    def observe(self, step: int, train_seconds: float, seconds_per_step: float) -> bool:
        """After `step` steps and `train_seconds` of training at `seconds_per_step`: begin the decay if
        its moment has come (wsd). True when this call began it (the caller may say so)."""
        cfg = self.cfg
        if cfg.lr_schedule != "wsd" or self.decay_start is not None:
            return False
        planned_start, planned_steps = self._planned_decay()
        if step >= planned_start:
            self.decay_start, self.decay_steps = planned_start, planned_steps
            return True
        budget = cfg.max_minutes * 60
        if budget > 0 and train_seconds >= (1 - cfg.decay_share) * budget and seconds_per_step > 0:
            remaining = max(budget - train_seconds, 0.0) * TIME_MARGIN
            self.decay_start = step
            self.decay_steps = min(int(remaining / seconds_per_step), cfg.max_steps - step)  # 0: no time left
            return True
        return False

    def expected_steps(self, seconds_per_step: float, step: int = 0, train_seconds: float = 0.0) -> int:
        """The steps the run will take at `seconds_per_step`, from `step` after `train_seconds` of its
        time (for the plan line and the progress display)."""
        if self.decay_start is not None or not self.time_budgeted or seconds_per_step <= 0:
            return self.end_step
        remaining = max(self.cfg.max_minutes * 60 - train_seconds, 0.0) * TIME_MARGIN
        return min(self.cfg.max_steps, step + int(remaining / seconds_per_step))

    def decay_done(self, step: int) -> float:
        """The share of the decay done after `step` steps: 0 before it began, 1 at its end (wsd)."""
        if self.cfg.lr_schedule != "wsd":
            return 1.0 if step >= self.cfg.decay_steps else 0.0
        start, length = (self.decay_start, self.decay_steps) if self.decay_start is not None else self._planned_decay()
        return min(1.0, max(0.0, (step - start) / max(length, 1)))

    def describe(self) -> str:
        """The schedule in words, for the plan line."""
        cfg = self.cfg
        warm = f"warm-up {cfg.warmup_steps:,} steps to {cfg.lr:g}"
        if cfg.lr_schedule == "cosine":
            return f"learning rate: {warm}, cosine decay to {cfg.min_lr:g} at step {cfg.decay_steps:,}"
        share = f"{100 * cfg.decay_share:g}%"
        if self.time_budgeted:
            return (f"learning rate: {warm}, constant, then a linear decay to {cfg.min_lr:g} over the last {share} "
                    f"of the {cfg.max_minutes:g}-minute budget (its length fitted to the speed of the steps before)")
        start, _ = self._planned_decay()
        return f"learning rate: {warm}, constant, then a linear decay to {cfg.min_lr:g} from step {start:,}"

    def state_dict(self) -> dict[str, Any]:
        return {"decay_start": self.decay_start, "decay_steps": self.decay_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        start, steps = state.get("decay_start"), state.get("decay_steps")
        self.decay_start = None if start is None else int(start)
        self.decay_steps = None if steps is None else int(steps)
