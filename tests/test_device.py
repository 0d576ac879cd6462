"""`aogpt.device`: `auto` / `cpu` / `cuda` / `cuda:N`, and refusals in one line."""

from __future__ import annotations

import pytest
import torch

from aogpt.device import resolve_device
from aogpt.errors import AOGPTError


def test_auto_is_cuda_only_when_it_is_there():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_unknown_or_missing_devices_are_refused():
    with pytest.raises(AOGPTError, match="unknown device"):
        resolve_device("tpu:x")
    if not torch.cuda.is_available():
        with pytest.raises(AOGPTError, match="CUDA is not available"):
            resolve_device("cuda")
