"""Device selection shared by every command: `auto`, `cpu`, `cuda`, `cuda:N`."""

from __future__ import annotations

import torch

from aogpt.errors import AOGPTError


def resolve_device(spec: str = "auto", local_rank: int | None = None) -> torch.device:
    """`auto` is CUDA when available, else CPU; under torchrun a bare `cuda` means this rank's GPU."""
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise AOGPTError(f"unknown device {spec!r}", "use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise AOGPTError("CUDA is not available on this machine", "use --device cpu")
        if dev.index is None and local_rank is not None:
            return torch.device("cuda", local_rank)
    return dev


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float64": torch.float64, "fp64": torch.float64,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    """A dtype from its name (``float32``/``fp32``, ``bfloat16``/``bf16``, ...); the one name table."""
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise AOGPTError(f"unknown dtype {name!r}", "use float32, float64 or bfloat16")
    return DTYPES[name]
