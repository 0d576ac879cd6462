"""`aogpt.generation.precision`: auto generation precision is the one the probe timed faster, probed
once per process and model shape; fp32 without a probe where bf16 is not native."""

from __future__ import annotations

import torch

from aogpt.generation import precision
from tests.generation.test_generate import tiny_model


def test_the_faster_precision_wins_and_is_probed_once(monkeypatch):
    model = tiny_model("aogpt", vocab=16, block=8, dtype=torch.float32)
    calls, seconds = [], {}

    def fake(m, batch, length):
        calls.append(next(m.parameters()).dtype)
        return seconds[calls[-1]]

    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: ["avx512_bf16"])
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


def test_no_native_bf16_means_fp32_without_a_probe(monkeypatch):
    model = tiny_model("aogpt", vocab=16, block=8, dtype=torch.float32)
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: [])
    monkeypatch.setattr(precision, "_timed", lambda *a: (_ for _ in ()).throw(AssertionError("probed")))
    assert precision.fastest_precision(model, 2)[0] == torch.float32


def test_a_real_probe_returns_a_precision_it_timed(monkeypatch):
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: ["avx512_bf16"])
    monkeypatch.setattr(precision, "_CACHE", {})
    monkeypatch.setattr(precision, "PROBE_LENGTH", 4)
    model = tiny_model("aogpt", vocab=16, block=8, dtype=torch.float32)
    dtype, why = precision.fastest_precision(model, 2)
    assert dtype in (torch.float32, torch.bfloat16) and "ms per step in bf16" in why

