"""The machine's own limit: how fast it multiplies matrices of a model's shapes, measured here.

A step's distance to the limit is stated against this measured rate, not a datasheet: the matrix
products a step must do (counted by torch's `FlopCounterMode`) take ``flops / rate`` seconds at
best, and their share of the measured step time is the model FLOPs utilisation against the peak
this machine reaches at these shapes, in this precision, on these threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from aogpt.bench.common import sync


def matmul_rate(shapes: Iterable[tuple[int, int, int]], dtype: torch.dtype, device: torch.device,
                repeats: int = 7, min_seconds: float = 0.02) -> dict[str, Any]:
    """Measured FLOP/s of ``(m, k) @ (k, n)`` for each shape (the fastest of `repeats` timings of a
    loop lasting at least `min_seconds`: another process on the core only ever slows a matmul, so
    the fastest timing is the closest to the limit); ``best`` is the fastest shape's rate: the peak a
    step could reach. Inputs are random (a matmul's time does not depend on its values)."""
    rates = {}
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device).to(dtype)
        b = torch.randn(k, n, device=device).to(dtype)
        for _ in range(2):
            a @ b
        sync(device)
        calls = 1
        while True:  # enough calls per timing to outlast the clock's resolution
            start = time.perf_counter()
            for _ in range(calls):
                a @ b
            sync(device)
            if time.perf_counter() - start >= min_seconds or calls >= 1 << 14:
                break
            calls *= 2
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(calls):
                a @ b
            sync(device)
            times.append((time.perf_counter() - start) / calls)
        rates[f"{m}x{k}x{n}"] = 2 * m * k * n / min(times)
    return {"dtype": str(dtype).removeprefix("torch."), "rates": rates, "best": max(rates.values())}


def faster_of(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Two measurements of `matmul_rate` (say before and after a benchmark) merged shape by shape
    into the faster: a busy moment during one of them does not lower the limit."""
    rates = {k: max(first["rates"][k], second["rates"].get(k, 0.0)) for k in first["rates"]}
    return {**first, "rates": rates, "best": max(rates.values())}


def counted_matmul_flops(fn: Callable[[], Any]) -> float:
    """The FLOPs of the matrix products (linear layers, attention's batched products) one call of
    `fn` runs, forward and backward, as torch's `FlopCounterMode` counts them."""
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    def cpu_sdpa(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return sdpa_flop_count(query, key, value)  # torch counts SDPA's CUDA kernels, not its CPU one

    counter = FlopCounterMode(display=False,
                              custom_mapping={torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_sdpa})
    with counter:
        fn()
    return float(counter.get_total_flops())


def model_shapes(tokens: int, width: int, hidden: int | None = None) -> list[tuple[int, int, int]]:
    """The main matrix shapes of a transformer step over `tokens` rows: the fused q/k/v projection,
    the MLP's two products."""
    hidden = hidden or 4 * width
    return [(tokens, width, 3 * width), (tokens, width, hidden), (tokens, hidden, width)]
