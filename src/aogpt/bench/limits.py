"""The machine's own limits: how fast it multiplies matrices of a model's shapes, and how fast one
thread reads memory, measured here.

A step's distance to the limit is stated against these measured rates, not a datasheet: the matrix
products a step must do (counted by torch's `FlopCounterMode`) take ``flops / rate`` seconds at
best, and their share of the measured step time is the model FLOPs utilisation against the peak
this machine reaches at these shapes, in this precision, on these threads. A decode step of a few
rows is bound by the bytes it reads instead (`aogpt.bench.roofline`): `memory_bandwidth` streams
buffers of several sizes, from ones that stay in the caches to one larger than the last-level
cache, and reports the read rate of each (the plateau beyond the cache is the memory's).
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


GIB = 2 ** 30
LADDER_MIB = (4, 16, 64, 256)  # buffer sizes read before the one beyond the last-level cache


def last_level_cache() -> int | None:
    """The last-level cache's size in bytes as Linux reports it (sysfs), or None."""
    from pathlib import Path

    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        unit = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG") or 0) * unit)
    return max(sizes) if sizes else None


def memory_bandwidth(repeats: int = 3, largest: int | None = None, min_bytes: int = 1 << 30) -> dict[str, Any]:
    """One thread's read rate (bytes/s) of float32 buffers of several sizes (`LADDER_MIB`, then one
    twice the last-level cache and at least `min_bytes`, or `largest` bytes): the fastest of `repeats`
    passes of a dot product over the buffer with itself (every byte read once per pass, vectorised;
    a busy moment only ever slows a pass). ``memory`` is the rate beyond the last-level cache, the
    roofline's bandwidth; ``by_bytes`` the whole plateau, for `rate_at`."""
    llc = last_level_cache()
    big = largest or max(min_bytes, 2 * (llc or 0))
    sizes = [m * 2 ** 20 for m in LADDER_MIB if m * 2 ** 20 < big] + [big]
    rates = {}
    for size in sizes:
        x = torch.ones(size // 4, dtype=torch.float32)
        torch.dot(x, x)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.dot(x, x)
            best = min(best, time.perf_counter() - start)
        rates[size] = size / best
        del x
    return {"by_bytes": {str(k): v for k, v in rates.items()}, "memory": rates[big], "buffer_bytes": big,
            "last_level_cache_bytes": llc, "threads": torch.get_num_threads()}


def rate_at(bandwidth: dict[str, Any], nbytes: float) -> float:
    """The measured read rate for a working set of `nbytes`: interpolated (in log size) between the
    buffers measured around it; the smallest buffer's rate below them, the largest's above."""
    import math

    points = sorted((int(k), v) for k, v in bandwidth["by_bytes"].items())
    if nbytes <= points[0][0]:
        return points[0][1]
    for (a, ra), (b, rb) in zip(points, points[1:], strict=False):
        if nbytes <= b:
            w = (math.log(nbytes) - math.log(a)) / (math.log(b) - math.log(a))
            return ra + w * (rb - ra)
    return points[-1][1]


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
