"""The order curriculum of training: which orders each step reads, from stage to stage.

`TrainConfig.curriculum` lists stages, each an order spec of `aogpt.orders` (or a Mallows ramp)
until a step, before the run's own order; `make_curriculum` turns it into a `Curriculum` that the
trainer asks for every step's orders (docs/training.md, "Leaving the unigram plateau").
"""

from __future__ import annotations

import math

import torch

from aogpt.errors import AOGPTError
from aogpt.orders import DISPERSION, Mallows, OrderSampler, identity, make_order_sampler
from aogpt.validation import Range


class Curriculum:
    """The order distribution at every training step: stages, each until a step, then the run's order.

    A curriculum spec (``TrainConfig.curriculum``) lists stages ``SPEC@STEP`` separated by commas; a
    stage reads its orders until optimizer step STEP (exclusive; the first stage starts at step 0),
    and from the last STEP on, the run's own `order` applies. SPEC is any order spec, or a ramp
    ``mallows:A..B``: Mallows orders whose dispersion moves geometrically from A at the stage's first
    step to B at its last (A, B > 0), so the typical displacement from left to right (about 1/theta)
    grows by the same factor every step. Example, from left to right to uniform orders:
    ``l2r@100,mallows:4..0.05@600`` with ``order = uniform``.

    Every step draws from its stage's sampler with the run's order generator, except left-to-right
    stages, which draw the run's own orders and discard them: the order stream after such a stage is
    the same whatever its length (and runs made with ``l2r_first_steps`` keep their streams).

    An end may also be a share of the run, ``SPEC@P%`` (``l2r@1%,mallows:4..0.05@30%``): it is
    ``round(P / 100 * steps)`` for a run of `steps` steps (`TrainConfig.max_steps`), and at least one step
    after the stage before, so one spec fits a fine-tuning of any length. `resolved` is the spec in steps.
    """

    def __init__(self, spec: str, final: OrderSampler, steps: int | None = None):
        self.spec, self.final, self.steps = spec, final, steps
        self.stages: list[tuple[int, int, OrderSampler | tuple[float, float]]] = []  # (start, end, sampler | ramp)
        start, parts = 0, []
        for part in [p.strip() for p in spec.split(",")] if spec.strip() else []:
            stage, at, until = part.rpartition("@")
            if not at or not stage:
                raise AOGPTError(f"curriculum stage {part!r} has no end step",
                                 f"write SPEC@STEP, e.g. {CURRICULUM_EXAMPLE}")
            end = _stage_end(part, until.strip(), start, steps)
            self.stages.append((start, end, _stage_sampler(stage)))
            parts.append(f"{stage}@{end}")
            start = end
        self.resolved = ",".join(parts)

    @property
    def length(self) -> int:
        """The step the run's own order begins at (0 without stages)."""
        return self.stages[-1][1] if self.stages else 0

    def at(self, step: int) -> OrderSampler:
        """The sampler of optimizer step `step` (0-based)."""
        for start, end, stage in self.stages:
            if start <= step < end:
                if isinstance(stage, OrderSampler):
                    return stage
                first, last = stage
                frac = (step - start) / max(1, end - start - 1)
                return Mallows(first * (last / first) ** frac)
        return self.final

    def sample(self, step: int, batch: int, n: int, device: torch.device | str = "cpu",
               generator: torch.Generator | None = None) -> torch.Tensor:
        """The orders of step `step` (left-to-right stages draw and discard the run's own; class doc)."""
        sampler = self.at(step)
        if sampler.left_to_right and sampler is not self.final:
            self.final.sample(batch, n, device, generator)
            return identity(batch, n, device)
        return sampler.sample(batch, n, device, generator)

    def __repr__(self) -> str:
        return f"Curriculum({self.spec!r} then {self.final.spec!r})"


CURRICULUM_EXAMPLE = "l2r@100,mallows:4..0.05@600"
_STAGE_END = Range(ge=1, le=10**9, integer=True)
_STAGE_SHARE = Range(gt=0, le=100)


def _stage_end(part: str, until: str, start: int, steps: int | None) -> int:
    """A stage's end step: a whole number above `start`, or a share of the run (``P%`` of `steps`, at
    least ``start + 1``)."""
    if until.endswith("%"):
        try:
            share = float(_STAGE_SHARE.parse(until[:-1]))
        except ValueError:
            raise AOGPTError(f"curriculum stage {part!r}: a share of the run must lie in (0, 100]%",
                             "e.g. l2r@1%,mallows:4..0.05@30%") from None
        if steps is None:
            raise AOGPTError(f"curriculum stage {part!r} ends at a share of the run, whose length is not known here",
                             "give its end in steps")
        return max(start + 1, round(share / 100 * steps))
    try:
        end = int(_STAGE_END.parse(until))
    except ValueError:
        end = None
    if end is None or end <= start:
        raise AOGPTError(f"curriculum stage {part!r}: the end step must be a whole number above {start}",
                         f"list stages with increasing end steps, e.g. {CURRICULUM_EXAMPLE}")
    return end


def _stage_sampler(text: str) -> OrderSampler | tuple[float, float]:
    """A curriculum stage: an order spec, or a Mallows ramp ``mallows:A..B`` (returned as (A, B))."""
    name, _, rest = text.partition(":")
    if name == "mallows" and ".." in rest:
        first, _, last = rest.partition("..")
        try:
            ends = (float(DISPERSION.parse(first)), float(DISPERSION.parse(last)))
        except ValueError:
            ends = (0.0, 0.0)
        if not all(0 < t < math.inf for t in ends):
            raise AOGPTError(f"curriculum stage {text!r}: a Mallows ramp needs two dispersions above 0",
                             "e.g. mallows:4..0.05 (from nearly left to right towards uniform)")
        return ends
    return make_order_sampler(text)


def make_curriculum(spec: str, order: str | OrderSampler, l2r_first_steps: int = 0,
                    steps: int | None = None) -> Curriculum:
    """The run's orders over training: `spec` (`Curriculum`), then `order`; stage ends written as shares
    (``@30%``) are of `steps`, the run's length. `l2r_first_steps` = N is the older way to write the
    curriculum ``l2r@N``."""
    final = make_order_sampler(order)
    if l2r_first_steps and spec.strip():
        raise AOGPTError("both a curriculum and l2r_first_steps were given", f"write l2r@{l2r_first_steps} as the "
                         "curriculum's first stage instead")
    return Curriculum(spec if spec.strip() else (f"l2r@{l2r_first_steps}" if l2r_first_steps else ""), final, steps)


__all__ = ["CURRICULUM_EXAMPLE", "Curriculum", "make_curriculum"]
