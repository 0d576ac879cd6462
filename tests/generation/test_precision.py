"""`aogpt.generation.precision`: auto generation precision is the one the probe timed faster, probed
once per process and model shape; fp32 without a probe where the CPU has no bf16 units."""

from __future__ import annotations

import torch

from aogpt import capability
from aogpt.generation import precision
from tests.generation.test_generate import tiny_model
from tests.helpers import needs_native_bf16


def test_the_faster_precision_wins_and_is_probed_once(monkeypatch):
    model = tiny_model("aogpt", vocab=16, block=8, dtype=torch.float32)
    calls, seconds = [], {}

    def fake(m, batch, length):
        calls.append(next(m.parameters()).dtype)
        return seconds[calls[-1]]

    monkeypatch.setattr(capability, "native_precision", lambda dtype: True)  # timings are faked: any CPU
    monkeypatch.setattr(precision, "_timed", fake)
    monkeypatch.setattr(precision, "_CACHE", {})
    for slow, want in ((torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)):
        precision._CACHE.clear()
        calls.clear()
        seconds.update({slow: 2.0, want: 1.0})
        dtype, why = precision.fastest_precision(model, 3)
        assert dtype == want and "measured" in why
        assert calls.count(torch.float32) == calls.count(torch.bfloat16) == precision.PROBE_ROUNDS + 1
        assert precision.fastest_precision(model, 3)[0] == want and len(calls) == 2 * (precision.PROBE_ROUNDS + 1)
    assert next(model.parameters()).dtype == torch.float32  # the model itself is not converted


def test_a_huge_batch_is_probed_at_a_small_one(monkeypatch):
    """The probe runs before the request's own memory check: it must never cost the whole request."""
    model = tiny_model("aogpt", vocab=16, block=8, dtype=torch.float32)
    batches = []
    monkeypatch.setattr(capability, "native_precision", lambda dtype: True)
    monkeypatch.setattr(precision, "_timed", lambda m, batch, length: batches.append(batch) or 1.0)
    monkeypatch.setattr(precision, "_CACHE", {})
    precision.fastest_precision(model, 100_000)
    assert batches and set(batches) == {precision.PROBE_MAX_BATCH}


def test_a_real_probe_returns_fp32_without_bf16(monkeypatch, as_cpu):
    """The sibling of the real probe on a CPU without bf16 units (an AVX2 CPU, or the switch): fp32,
    said so, and nothing timed."""
    model = tiny_model("aogpt", vocab=16, block=8, dtype=torch.float32)
    if capability.cpu().arch == "x86":
        as_cpu("avx2")
    else:
        monkeypatch.setattr(capability, "native_precision", lambda dtype: dtype not in (torch.bfloat16,))
    monkeypatch.setattr(precision, "_timed", lambda *a: (_ for _ in ()).throw(AssertionError("probed")))
    dtype, why = precision.fastest_precision(model, 2)
    assert dtype == torch.float32 and "has no bf16 units" in why


@needs_native_bf16
def test_a_real_probe_returns_a_precision_it_timed(monkeypatch):
    monkeypatch.setattr(precision, "_CACHE", {})
    monkeypatch.setattr(precision, "PROBE_LENGTH", 4)
    model = tiny_model("aogpt", vocab=16, block=8, dtype=torch.float32)
    dtype, why = precision.fastest_precision(model, 2)
    assert dtype in (torch.float32, torch.bfloat16) and "ms per step in bf16" in why

