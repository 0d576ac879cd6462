"""`aogpt bench train --profile`: where one training step's time goes, by kind of operator.

`torch.profiler` records one step (forward, backward, clipping, AdamW, EMA); every operator's *self*
CPU time is put in one bucket by its name, so the shares add up to the step. Buckets:

- attention: scaled-dot-product attention, forward and backward;
- matmul: the linear layers (attention projections, MLP, adaLN, head), forward and backward;
- norm: RMSNorm / LayerNorm kernels and their backward;
- gather: embedding look-ups, gathers, indexing (adaLN rows by target) and their backward;
- optimizer: AdamW, gradient clipping and the EMA (the `_foreach_*` kernels);
- elementwise: the rest of the arithmetic (modulation, residuals, GELU, loss), and copies / casts;
- other: what is left (allocation, views, Python-side autograd bookkeeping).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

BUCKETS = ("attention", "matmul", "norm", "gather", "optimizer", "elementwise", "other")
_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("scaled_dot_product", "flash_attention", "sdpa", "_efficient_attention")),
    ("optimizer", ("adam", "_foreach", "clip_grad", "optimizer", "_fused_")),
    ("norm", ("norm", "rmsnorm", "rsqrt")),
    ("matmul", ("addmm", "::mm", "bmm", "matmul", "linear", "mkldnn")),
    ("gather", ("embedding", "gather", "index", "scatter", "take")),
    ("elementwise", ("add", "mul", "sub", "div", "gelu", "silu", "exp", "log", "softmax", "sum", "mean",
                     "pow", "copy", "to_copy", "where", "fill", "zero", "neg", "clamp", "cat", "sqrt", "nll",
                     "lerp", "max", "cumsum")),
)


def bucket(name: str) -> str:
    """The bucket of an operator name (module docstring)."""
    low = name.lower()
    for label, needles in _RULES:
        if any(n in low for n in needles):
            return label
    return "other"


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """The profiler's C++ side (kineto) writes a log line to the process's stderr each time it starts
    and stops, whatever its log level: nothing a user of the table needs. Python's own errors still
    reach the terminal, after the block."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 (an embedding host): nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def profile_step(step: Callable[[], Any]) -> dict[str, Any]:
    """Self CPU time of one call of `step` by bucket (seconds and shares) and its top operators."""
    from torch.profiler import ProfilerActivity, profile

    with native_stderr_silenced(), profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    totals = dict.fromkeys(BUCKETS, 0.0)
    ops: list[tuple[str, float]] = []
    for event in prof.key_averages():
        seconds = event.self_cpu_time_total / 1e6
        if seconds <= 0:
            continue
        totals[bucket(event.key)] += seconds
        ops.append((event.key, seconds))
    total = sum(totals.values()) or 1.0
    ops.sort(key=lambda kv: -kv[1])
    return {"seconds": totals, "share": {k: v / total for k, v in totals.items()}, "total": total,
            "top": [{"op": k, "seconds": v, "share": v / total} for k, v in ops[:12]]}


def profile_markdown(profiles: dict[str, dict[str, Any]]) -> str:
    """One table: a row per bucket, a column per contender, each cell share of the step (and ms)."""
    names = list(profiles)
    lines = ["Share of one profiled step's self CPU time by operator kind (ms in brackets; the profiler's own "
             "overhead inflates the total):", "",
             "| operator | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for b in BUCKETS:
        cells = [f"{100 * p['share'][b]:.0f}% ({1e3 * p['seconds'][b]:.1f})" for p in profiles.values()]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    lines.append("| total | " + " | ".join(f"{1e3 * p['total']:.1f} ms" for p in profiles.values()) + " |")
    return "\n".join(lines)
