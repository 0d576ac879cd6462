"""Device selection shared by every command: `auto`, `cpu`, `cuda`, `cuda:N`. Precisions are
`aogpt.precision`'s, what the CPU can do `aogpt.capability`'s."""

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
