"""Each generation contender against its own roofline: max(FLOPs / peak, bytes / bandwidth) per step.

A decode step of a few rows per sequence reads every weight once and its sequences' keys and values,
and does little arithmetic with them: its limit is the time to read those bytes, not the time to
multiply (the "FLOPs utilisation" of such a step says little). A full bidirectional pass (the
encoder) multiplies thousands of rows by every weight: its limit is the matrix rate. The roofline
of a step is the larger of the two, from rates measured in the same run (`aogpt.bench.limits`): the
best matrix-product rate at the model's shapes in that precision, and one thread's read rate from
memory, beyond the last-level cache (``memory``) and, tighter, for a buffer the size of the step's
own bytes (``working set``: what repeated reads of that many bytes reach on this machine, the
caches included).

Bytes per step (averages over a run's forwards), counted from what the run did:

- ``weights``: every decode-path weight and bias (the q/k/v, attention-output and MLP products of
  every block, the output head) once per forward, plus the embedding rows and AO-GPT's per-position
  adaLN rows the step's slots look up;
- ``cache read``: for every sequence taking part in a forward, the keys and values of the columns
  its rows attend to (its decided slots and its own rows), in every layer, in the cache's dtype;
- ``cache written``: the keys and values of every slot the forward evaluates;
- ``logits``: the head's output rows, written once and read once by the draw.

Activations (a few rows of the residual stream) stay in the caches and are not counted. The
transformers GPT-2 is counted as our GPT's step (same sizes and rows; its cache grows by
concatenation, which reads and writes more: its true count is higher). A contender without a KV
cache (the encoder, the recompute baseline) reads its weights once per pass and no cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from aogpt.bench.limits import rate_at


@dataclass
class StepBytes:
    """Bytes one forward reads or writes, averaged over a run's forwards."""

    weights: float
    cache_read: float
    cache_written: float
    logits: float

    @property
    def total(self) -> float:
        return self.weights + self.cache_read + self.cache_written + self.logits

    def to_dict(self) -> dict[str, float]:
        return {"weights": self.weights, "cache_read": self.cache_read, "cache_written": self.cache_written,
                "logits": self.logits, "total": self.total}


def decode_weight_bytes(model: torch.nn.Module) -> float:
    """The weights and biases of the decode path's products (blocks' q/k/v, attention output, MLP;
    the output head), in the model's dtype."""
    from aogpt.decode.runner import decode_linears

    return float(sum(p.numel() * p.element_size() for layer in decode_linears(model).values()
                     for p in layer.parameters(recurse=False)))


def lookup_bytes_per_row(model: torch.nn.Module) -> float:
    """What each slot of a step looks up besides the products: its token and position embeddings and,
    for AO-GPT, its target's adaLN rows (6d per block, 2d for the final norm)."""
    cfg = model.config
    size = next(model.parameters()).element_size()
    per_row = cfg.n_embd * (2 if cfg.positions == "learned" else 1)
    if cfg.target == "adaln":
        per_row += 6 * cfg.n_embd * cfg.n_layer + 2 * cfg.n_embd
    return float(per_row * size)


def cache_read_columns(step_counts: np.ndarray, known: int = 0) -> tuple[int, int]:
    """(columns attended, summed over every sequence of every forward; forwards) of a fixed-order run
    with per-step counts (N, T): a sequence revealing k > 0 positions with g decided attends over
    g + k columns (its decided slots, its catch-ups and its queries); one revealing nothing sits the
    step out. A forward runs at every step where any sequence reveals something."""
    counts = np.asarray(step_counts, dtype=np.int64)
    decided = known + np.cumsum(counts, axis=1) - counts
    active = counts > 0
    return int(((decided + counts) * active).sum()), int(active.any(axis=0).sum())


def decoder_bytes(model: torch.nn.Module, cache_dtype: torch.dtype, step_counts: np.ndarray, forwards: int,
                  slots: int, queries: int) -> StepBytes:
    """`StepBytes` of a KV-cache run of `model` (module docstring): `step_counts` (N, T) as the run
    reported them, `slots` evaluated, `queries` tokens drawn."""
    cfg = model.config
    columns, _ = cache_read_columns(step_counts)
    kv = 2 * cfg.n_layer * cfg.n_embd * torch.finfo(cache_dtype).bits // 8
    logit = cfg.vocab_size * next(model.parameters()).element_size() * 2
    f = max(forwards, 1)
    return StepBytes(decode_weight_bytes(model) + lookup_bytes_per_row(model) * slots / f, kv * columns / f,
                     kv * slots / f, logit * queries / f)


def pass_bytes(model: torch.nn.Module, rows: int, head_rows: int) -> StepBytes:
    """`StepBytes` of one pass without a KV cache over `rows` slots, the head on `head_rows` of them."""
    logit = model.config.vocab_size * next(model.parameters()).element_size() * 2
    return StepBytes(decode_weight_bytes(model) + lookup_bytes_per_row(model) * rows, 0.0, 0.0,
                     float(logit * head_rows))


def roofline(step_bytes: StepBytes, flops_per_step: float, peak: float, bandwidth: dict[str, Any]
             ) -> dict[str, Any]:
    """The roofline of a step: seconds for its FLOPs at `peak`, for its bytes at the memory rate and at
    the working-set rate (`aogpt.bench.limits.rate_at`), the limit (the larger of FLOPs and the memory
    bytes) and which bound it is."""
    flops_s = flops_per_step / peak
    memory_s = step_bytes.total / bandwidth["memory"]
    cached_s = step_bytes.total / rate_at(bandwidth, step_bytes.total)
    limit = max(flops_s, memory_s)
    return {"bytes": step_bytes.to_dict(), "flops": flops_per_step, "flops_s": flops_s, "memory_s": memory_s,
            "working_set_s": cached_s, "limit_s": limit, "limit_working_set_s": max(flops_s, cached_s),
            "bound": "bytes" if memory_s >= flops_s else "FLOPs"}


__all__ = ["StepBytes", "cache_read_columns", "decode_weight_bytes", "decoder_bytes", "lookup_bytes_per_row",
           "pass_bytes", "roofline"]
