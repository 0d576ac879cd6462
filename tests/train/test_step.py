"""The optimizer step: the LR schedule, accumulation, and stopping on a NaN loss."""

from __future__ import annotations

import math

import pytest
import torch

import aogpt.train.step as step_mod
from aogpt.checkpoint import list_checkpoints
from aogpt.config import train_config
from aogpt.train import NonFiniteLoss, lr_at
from tests.train.runs import make


def test_learning_rate_schedule():
    cfg = train_config(None, lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55)  # halfway through the cosine
    assert lr_at(110, cfg) == pytest.approx(0.1) and lr_at(500, cfg) == pytest.approx(0.1)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 120))


def test_accumulation_equals_one_big_batch(tmp_path):
    """Two micro-batches of 4 give the same update as one batch of 8 (same sequences, same orders); in
    fp32, as bf16's rounding depends on how a matmul is blocked, which depends on the batch."""
    big = make(None, batch_size=8, grad_accum=1, max_steps=3, dtype="float32")
    small = make(None, batch_size=4, grad_accum=2, max_steps=3, dtype="float32")
    for _ in range(3):
        a, b = big.train_step(), small.train_step()
        assert math.isclose(a.loss, b.loss, rel_tol=1e-5)
    for p, q in zip(big.raw.parameters(), small.raw.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    (tmp_path / "n").mkdir()
    t = make(tmp_path / "n")
    real = step_mod.training_loss

    def poisoned(model, idx, order, gen):
        loss = real(model, idx, order, gen)
        return loss * float("nan") if t.step >= 8 else loss

    monkeypatch.setattr(step_mod, "training_loss", poisoned)  # where the optimizer step looks it up
    with pytest.raises(NonFiniteLoss, match="at step 9") as err:
        t.fit()
    assert "ckpt-0000006" in str(err.value)
    assert [p.name for p in list_checkpoints(tmp_path / "n")] == ["ckpt-0000006"]
