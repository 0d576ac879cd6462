"""Which positions each decoding step revealed, as it happens: what `aogpt.generate(on_step=...)` reports.

Every sampler (the decoders' fixed-order, speculative and adaptive samplers, the encoder's) can say
which tokens it has decided so far, by position (`decided()`: (B, n), -1 where still masked). After
each step the sampler calls its progress callback; `watch` wraps that callback, compares the
decided tokens with the previous step's and hands the difference to ``on_step`` as one `Revealed`.
Known tokens (a prompt, a template's text) are decided before the first step and never reported.

This is how `aogpt serve` streams a generation step by step. It reads the sampler's state only after
the step's tokens are written, so it never changes what is sampled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class Revealed:
    """What one step decided: sequence ``samples[i]`` (its index among all samples of the call) got
    token ``tokens[i]`` at position ``positions[i]``; `step` counts the batch's steps from 1."""

    step: int
    samples: np.ndarray
    positions: np.ndarray
    tokens: np.ndarray


def scatter_by_position(chain: torch.Tensor, chain_tokens: torch.Tensor, decided: torch.Tensor) -> torch.Tensor:
    """Tokens by position (B, n) from tokens in chain order, -1 where `decided` (B, n, chain order) is False."""
    out = torch.full_like(chain_tokens, -1)
    rows, idx = decided.nonzero(as_tuple=True)
    out[rows, chain[rows, idx]] = chain_tokens[rows, idx]
    return out


def watch(sampler: Any, start: int, on_step: Callable[[Revealed], None] | None,
          progress: Callable[[int], None] | None) -> Callable[[int], None] | None:
    """A progress callback for `sampler` that also reports each step's new tokens to `on_step`
    (`progress` itself when there is nothing to report to). `start`: the batch's first sample."""
    if on_step is None:
        return progress
    before = sampler.decided().to("cpu", copy=True)
    steps = 0

    def after_step(revealed: int) -> None:
        nonlocal before, steps
        now = sampler.decided().to("cpu", copy=True)
        rows, positions = ((now >= 0) & (before < 0)).nonzero(as_tuple=True)
        before, steps = now, steps + 1
        on_step(Revealed(steps, (rows + start).numpy(), positions.numpy(), now[rows, positions].numpy()))
        if progress is not None:
            progress(revealed)

    return after_step


__all__ = ["Revealed", "scatter_by_position", "watch"]
