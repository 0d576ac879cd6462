"""`aogpt.device`: what `dtype auto` means, decided from the CPU's flags."""

from __future__ import annotations

import pytest
import torch

from aogpt import device
from aogpt.errors import AOGPTError


def fake_cpuinfo(tmp_path, flags: str) -> str:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: test\nflags\t\t: fpu sse2 {flags}\n\nprocessor\t: 1\n")
    return str(path)


def test_bf16_flags_are_read_from_cpuinfo(tmp_path):
    assert device.cpu_bf16_flags(fake_cpuinfo(tmp_path, "avx512f avx512_bf16 amx_bf16")) == ("avx512_bf16", "amx_bf16")
    assert device.cpu_bf16_flags(fake_cpuinfo(tmp_path / "..", "avx512f avx2")) == ()
    assert device.cpu_bf16_flags(str(tmp_path / "missing")) == ()


@pytest.mark.parametrize("flags,want", [(("avx512_bf16",), torch.bfloat16), ((), None)])
def test_auto_is_bf16_only_on_cpus_with_bf16_units(monkeypatch, flags, want):
    monkeypatch.setattr(device, "cpu_bf16_flags", lambda: flags)
    dtype, why = device.auto_precision("cpu")
    assert dtype == want
    assert why.startswith("bf16 autocast (auto: the CPU has native bf16, avx512_bf16)" if flags else
                          "fp32 (auto: the CPU has no native bf16")
    assert device.resolve_precision("auto", "cpu") == (dtype, why)
    assert device.resolve_precision("fp32", "cpu") == (None, "fp32 (asked for)")
    assert device.resolve_precision("bfloat16", "cpu")[0] == torch.bfloat16


def test_unknown_precision_is_refused():
    with pytest.raises(AOGPTError, match="unknown dtype"):
        device.resolve_precision("int8", "cpu")
