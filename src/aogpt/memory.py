"""Memory estimates, checked before anything large is allocated.

Each estimate adds up the largest tensors of one kind of work (weights and optimizer state,
activations, the KV cache, logits, attention scores); `check_fits` compares it with the memory
available on the device (``MemAvailable`` of /proc/meminfo on the CPU, ``torch.cuda.mem_get_info``
on a GPU) and refuses with one line that names the estimate, what is available and the flag that
lowers it. Estimates are rough (within a small factor): they are meant to turn an allocation that
cannot succeed (a huge batch, a 65536-wide model, a million-token benchmark) into a clear error
instead of a crash or an hour of swapping, not to predict usage to the byte. Setting
``AOGPT_SKIP_MEMORY_CHECK=1`` skips the check (where the available memory is misreported, e.g. in
some containers).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

from aogpt.errors import AOGPTError

MEMINFO = Path("/proc/meminfo")
FP32 = 4


def gib(n: float) -> str:
    """Bytes in GiB, readably: 0.02 GiB, 3.5 GiB, 12,800 GiB."""
    g = n / 2**30
    return f"{g:,.0f} GiB" if g >= 100 else f"{g:.2g} GiB" if g < 1 else f"{g:.1f} GiB"


def available_bytes(device: torch.device | str) -> int | None:
    """Memory free for new tensors on `device` (None when it cannot be told)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        return None
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_fits(needed: float, device: torch.device | str, what: str, lower: str, processes: int = 1) -> None:
    """Refuse `what` when its estimate (times the `processes` sharing this machine's memory) exceeds
    the memory available on `device`; `lower` names the flag(s) that shrink it."""
    if os.environ.get("AOGPT_SKIP_MEMORY_CHECK") == "1":
        return
    available = available_bytes(device)
    total = needed * processes
    if available is None or total <= available:
        return
    per = f" ({processes} processes x {gib(needed)})" if processes > 1 else ""
    raise AOGPTError(f"{what} needs about {gib(total)} of memory{per}, but {gib(available)} is available on "
                     f"{torch.device(device)}", f"lower {lower}")


def parameter_count(cfg: Any) -> int:
    """Parameters of a model of config `cfg`, counted on the meta device (nothing is allocated)."""
    from aogpt.model import Transformer

    with torch.device("meta"):
        return Transformer(cfg).num_params()


def training_bytes(cfg: Any, batch_size: int, world_size: int = 1, sharded: bool = False,
                   params: int | None = None) -> float:
    """One training process: fp32 weights, gradients, Adam moments and the EMA (20 bytes per
    parameter, split over the ranks under FSDP), plus activations of one micro-batch (per layer
    about 34 values per token and channel and 5 per attention score, as in Korthikanti et al.
    2022) and the logits with their softmax and gradient."""
    params = parameter_count(cfg) if params is None else params
    state = 20 * params / (world_size if sharded else 1)
    B, T, d, L = batch_size, cfg.block_size, cfg.n_embd, cfg.n_layer
    activations = L * B * T * d * (34 + 5 * cfg.n_head * T / d) + B * T * cfg.vocab_size * 10
    return state + activations


def kv_cache_bytes(cfg: Any, batch: int, capacity: int, bytes_per_value: int = FP32) -> float:
    """The static KV cache (`Transformer.setup_cache`): keys and values of every layer."""
    return 2 * cfg.n_layer * batch * cfg.n_head * capacity * (cfg.n_embd // cfg.n_head) * bytes_per_value


def generation_bytes(cfg: Any, batch: int, length: int, steps: int, num_samples: int, *, use_cache: bool,
                     kv_cache: bool, record_logits: bool = False) -> float:
    """What generating adds to the loaded weights: the KV cache, the logits and sampling buffers of
    the widest step (float64 for the draw), the activations of one forward, and the samples kept.
    Without a cache (or for a bidirectional model) every step reruns the whole sequence."""
    B, n, d, H, V = batch, length, cfg.n_embd, cfg.n_head, cfg.vocab_size
    per_step = n if steps <= 1 else min(n, 2 * math.ceil(n / steps) + 8)  # Bernoulli steps vary around n/T
    cached = use_cache and kv_cache
    cache = kv_cache_bytes(cfg, B, n + 1) if cached else 0
    rows = B * per_step if cached else B * n
    logits = B * per_step * V * (FP32 + 2 * 8)
    keys = n + 1
    activations = rows * d * 16 * FP32 + B * H * (per_step if cached else n) * keys * FP32 * 2
    kept = num_samples * n * 8 * 3 + (num_samples * n * V * FP32 if record_logits else 0)
    return cache + logits + activations + kept


def evaluation_bytes(cfg: Any, batch: int, length: int) -> float:
    """One scoring forward of `batch` sequences of `length` tokens (inference: one layer's
    activations at a time): attention scores, the residual stream and the log-softmax of the logits."""
    B, n, d, H, V = batch, length, cfg.n_embd, cfg.n_head, cfg.vocab_size
    return B * H * n * (n + 1) * FP32 * 2 + B * n * d * 16 * FP32 + B * n * V * FP32 * 3


def weights_bytes(cfg: Any, params: int | None = None, bytes_per_value: int = FP32) -> float:
    """The weights of a model of config `cfg`."""
    return (parameter_count(cfg) if params is None else params) * bytes_per_value


__all__ = ["available_bytes", "check_fits", "evaluation_bytes", "generation_bytes", "gib", "kv_cache_bytes",
           "parameter_count", "training_bytes", "weights_bytes"]
