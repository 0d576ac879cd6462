"""Memory estimates checked before allocation: what is available, the one-line refusal that names
the estimate, the memory available and the flag to lower, and estimates against what is allocated."""

from __future__ import annotations

import pytest

from aogpt.config import model_config
from aogpt.errors import AOGPTError
from aogpt.memory import (
    available_bytes,
    check_fits,
    generation_bytes,
    kv_cache_bytes,
    parameter_count,
    training_bytes,
    weights_bytes,
)
from aogpt.model import Transformer


@pytest.fixture
def meminfo(tmp_path, monkeypatch):
    """/proc/meminfo with 2 GiB available."""
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {8 * 2**20} kB\nMemFree:  1 kB\nMemAvailable:   {2 * 2**20} kB\n")
    monkeypatch.setattr("aogpt.memory.MEMINFO", path)
    monkeypatch.delenv("AOGPT_SKIP_MEMORY_CHECK", raising=False)
    return path


def test_available_memory_is_read_from_meminfo(meminfo):
    assert available_bytes("cpu") == 2 * 2**30
    meminfo.write_text("garbage")
    assert available_bytes("cpu") is None  # unknown: nothing is refused


def test_the_refusal_names_the_estimate_the_available_memory_and_the_flag(meminfo, monkeypatch):
    check_fits(2**30, "cpu", "training", "--batch-size")
    with pytest.raises(AOGPTError) as exc:
        check_fits(3 * 2**30, "cpu", "training", "--batch-size")
    assert str(exc.value) == ("training needs about 3.0 GiB of memory, but 2.0 GiB is available on cpu "
                              "(lower --batch-size)")
    with pytest.raises(AOGPTError, match=r"4.0 GiB of memory \(2 processes x 2.0 GiB\)"):
        check_fits(2 * 2**30, "cpu", "training", "--batch-size", processes=2)
    monkeypatch.setenv("AOGPT_SKIP_MEMORY_CHECK", "1")
    check_fits(10**15, "cpu", "training", "--batch-size")


def test_estimates_against_what_is_allocated():
    cfg = model_config("aogpt", preset="tiny", vocab_size=100)
    model = Transformer(cfg)
    assert parameter_count(cfg) == sum(p.numel() for p in model.parameters())
    assert weights_bytes(cfg) == 4 * sum(p.numel() for p in model.parameters())
    cache = model.setup_cache(3, 17)
    assert kv_cache_bytes(cfg, 3, 17) == cache.k.numel() * 4 + cache.v.numel() * 4
    # training: 20 bytes per parameter (weights, gradients, Adam's two moments, EMA), split by FSDP
    small, large = training_bytes(cfg, 1), training_bytes(cfg, 64)
    assert training_bytes(cfg, 1, 4, sharded=True) == pytest.approx(small - 20 * parameter_count(cfg) * 3 / 4)
    assert large > small
    gen = generation_bytes(cfg, 8, 32, 32, 8, use_cache=True, kv_cache=True)
    assert gen > kv_cache_bytes(cfg, 8, 33)
    assert generation_bytes(cfg, 8, 32, 1, 8, use_cache=False, kv_cache=True) > gen  # one step: all logits at once


def test_generation_is_refused_before_anything_is_allocated(meminfo, monkeypatch):
    import aogpt

    cfg = model_config("aogpt", preset="tiny", vocab_size=50000, block_size=64)
    model = Transformer(cfg)
    monkeypatch.setattr("aogpt.generation.generate.for_inference", lambda *a, **k: pytest.fail("allocated"))
    with pytest.raises(AOGPTError, match=r"generation needs about .* GiB of memory, but 2.0 GiB is available on cpu "
                                         r"\(lower the batch size \(--batch-size\)"):
        aogpt.generate(model, num_samples=4096, batch_size=4096, length=64, steps=1)
