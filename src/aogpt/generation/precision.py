"""Which precision a model generates fastest in on this machine: measured, not assumed.

bf16 weights make a large matrix product about 3.5x faster than fp32 on a CPU with bf16 units, but
a decode step multiplies a few rows by each weight, where the gain shrinks or vanishes (conversions,
small-block kernels, attention over a growing cache), and it depends on the model's width and
vocabulary. So ``--dtype auto`` for generation is decided by a probe: `fastest_precision` times
a short generation (one token per step, the caller's batch up to 64) of the model at hand in fp32 and in
bf16, interleaved, and keeps the faster; the answer is cached for the process, keyed by the model's
shapes, the batch, the device and the thread count. Where bf16 is not native (`aogpt.capability`: no
avx512_bf16 / AMX / ARM bf16) it is fp32 without a probe; on CUDA it is bf16. docs/generation.md has
the figures behind it.
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

from aogpt import capability

PROBE_LENGTH = 32  # tokens generated per probe run: enough steps to amortise the per-call set-up
PROBE_ROUNDS = 3  # interleaved fp32 / bf16 runs, median of each
PROBE_MAX_BATCH = 64  # past this a step's products are large enough that bf16's rate decides; a bigger probe
# would cost the user's whole request (and run before the request's own memory check)
_CACHE: dict[tuple, tuple[torch.dtype, str]] = {}


def probe_key(model: torch.nn.Module, batch: int) -> tuple:
    cfg = model.config
    return (cfg.variant, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab_size, cfg.block_size, batch,
            str(next(model.parameters()).device), torch.get_num_threads())


def _timed(model: torch.nn.Module, batch: int, length: int) -> float:
    from aogpt.generation.generate import generate

    start = time.perf_counter()
    generate(model, num_samples=batch, batch_size=batch, length=length, seed=0, policy="count")
    return time.perf_counter() - start


def fastest_precision(model: torch.nn.Module, batch: int) -> tuple[torch.dtype, str]:
    """(the dtype to generate in, why), for `model` (any precision; it is not modified) generating
    `batch` sequences at a time on its device (module docstring)."""
    device = next(model.parameters()).device
    if device.type == "cuda":
        return torch.bfloat16, "bf16 (auto: a CUDA GPU)"
    if device.type != "cpu" or not capability.native_precision(torch.bfloat16):
        where = f"this CPU, {capability.cpu_class()}," if device.type == "cpu" else f"this {device.type}"
        return torch.float32, f"fp32 (auto: {where} has no bf16 units)"
    batch = min(batch, PROBE_MAX_BATCH)
    key = probe_key(model, batch)
    if key not in _CACHE:
        length = min(PROBE_LENGTH, model.config.block_size)
        have = next(model.parameters()).dtype
        models = {dtype: model if have == dtype else copy.deepcopy(model).to(dtype)
                  for dtype in (torch.float32, torch.bfloat16)}
        times: dict[torch.dtype, list[float]] = {dtype: [] for dtype in models}
        for m in models.values():  # warm-up: kernels, packing, lazy imports
            _timed(m, batch, min(length, 4))
        for _ in range(PROBE_ROUNDS):
            for dtype, m in models.items():
                times[dtype].append(_timed(m, batch, length))
        fp32, bf16 = (statistics.median(times[d]) * 1e3 / length for d in models)
        best = torch.bfloat16 if bf16 < fp32 else torch.float32
        _CACHE[key] = (best, f"{'bf16' if best == torch.bfloat16 else 'fp32'} (auto: measured {bf16:.2f} ms per "
                             f"step in bf16, {fp32:.2f} in fp32, batch {batch})")
    return _CACHE[key]


__all__ = ["fastest_precision"]
