"""The trainer: exact resume, schedules, accumulation, stopping on signals and on NaN."""

from __future__ import annotations

import json
import math

import pytest
import torch

import aogpt.train.trainer as train_mod
from aogpt.checkpoint import list_checkpoints
from aogpt.config import model_config, train_config
from aogpt.train import NonFiniteLoss, RandomTokens, Trainer, lr_at

TIMING = {"tokens_per_s", "mfu"}


def make(out, variant="aogpt", **train_over):
    mc = model_config(variant, preset="tiny", vocab_size=40)
    tc = train_config("tiny", variant, **{"max_steps": 12, "eval_interval": 6, "ckpt_interval": 6,
                                          "log_interval": 2, "keep_last": 5, **train_over})
    return Trainer(mc, tc, RandomTokens(40), out, show_progress=False)


def records(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def stop_after(trainer, step, name="SIGTERM"):
    inner = trainer.train_step

    def wrapped():
        result = inner()
        if trainer.step == step:
            trainer._stop_signal = name
        return result

    trainer.train_step = wrapped


@pytest.mark.parametrize("variant", ["aogpt", "gpt"])
def test_resume_continues_exactly(tmp_path, variant):
    full = make(tmp_path / "full", variant)
    (tmp_path / "full").mkdir()
    summary_full = full.fit()

    (tmp_path / "cut").mkdir()
    first = make(tmp_path / "cut", variant, order=full.cfg.order)
    stop_after(first, 6)
    s1 = first.fit()
    assert s1["step"] == 6 and s1["stopped_by"] == "SIGTERM"
    second = make(tmp_path / "cut", variant, order=full.cfg.order)
    second.resume(list_checkpoints(tmp_path / "cut")[-1])
    summary_cut = second.fit()

    assert records(tmp_path / "cut") == records(tmp_path / "full")
    for key in ("val/l2r/raw", "val/l2r/ema", "train_loss"):
        assert summary_cut[key] == summary_full[key]
    a = torch.load(list_checkpoints(tmp_path / "full")[-1] / "trainer.pt", weights_only=True)
    b = torch.load(list_checkpoints(tmp_path / "cut")[-1] / "trainer.pt", weights_only=True)
    assert torch.equal(a["data_gen"], b["data_gen"]) and a["ema_updates"] == b["ema_updates"] == 12


def test_resume_drops_metrics_written_after_the_checkpoint(tmp_path):
    (tmp_path / "r").mkdir()
    t = make(tmp_path / "r")
    t.fit()  # checkpoints at 6 and 12; pretend we crashed after 12 but resume from 6
    ckpt6 = list_checkpoints(tmp_path / "r")[0]
    t2 = make(tmp_path / "r")
    t2.resume(ckpt6)
    assert max(r["step"] for r in records(tmp_path / "r")) == 6


def test_learning_rate_schedule():
    cfg = train_config(None, lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55)  # halfway through the cosine
    assert lr_at(110, cfg) == pytest.approx(0.1) and lr_at(500, cfg) == pytest.approx(0.1)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 120))


def test_accumulation_equals_one_big_batch(tmp_path):
    """Two micro-batches of 4 give the same update as one batch of 8 (same sequences, same orders)."""
    big = make(None, batch_size=8, grad_accum=1, max_steps=3)
    small = make(None, batch_size=4, grad_accum=2, max_steps=3)
    for _ in range(3):
        a, b = big.train_step(), small.train_step()
        assert math.isclose(a.loss, b.loss, rel_tol=1e-5)
    for p, q in zip(big.raw.parameters(), small.raw.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    (tmp_path / "n").mkdir()
    t = make(tmp_path / "n")
    real = train_mod.training_loss

    def poisoned(model, idx, order, gen):
        loss = real(model, idx, order, gen)
        return loss * float("nan") if t.step >= 8 else loss

    monkeypatch.setattr(train_mod, "training_loss", poisoned)
    with pytest.raises(NonFiniteLoss, match="at step 9") as err:
        t.fit()
    assert "ckpt-0000006" in str(err.value)
    assert [p.name for p in list_checkpoints(tmp_path / "n")] == ["ckpt-0000006"]


def test_signal_writes_a_final_checkpoint(tmp_path):
    (tmp_path / "s").mkdir()
    t = make(tmp_path / "s", max_steps=50, ckpt_interval=100, eval_interval=100)
    stop_after(t, 3, "SIGINT")
    summary = t.fit()
    assert summary["stopped_by"] == "SIGINT" and summary["step"] == 3
    assert [p.name for p in list_checkpoints(tmp_path / "s")] == ["ckpt-0000003"]
    assert (tmp_path / "s" / "loss.png").is_file()


def test_training_reduces_the_loss_on_learnable_data():
    """Constant sequences (one random token repeated) are learnt in any order: after the first token the
    rest is a copy, so both validation losses fall far below the uniform log(V)."""

    class Pattern(RandomTokens):
        def get_batch(self, split, batch_size, block_size, generator):
            start = torch.randint(self.vocab_size, (batch_size, 1), generator=generator)
            return start.expand(batch_size, block_size).clone()

        def iter_eval_batches(self, split, batch_size, block_size, max_batches=None):
            yield self.get_batch(split, batch_size, block_size, torch.Generator().manual_seed(0))

    mc = model_config("aogpt", preset="tiny", vocab_size=16)
    tc = train_config("tiny", "aogpt", max_steps=40, eval_interval=1000, ckpt_interval=1000)
    summary = Trainer(mc, tc, Pattern(16), None, show_progress=False).fit()
    assert summary["val/l2r/raw"] < 0.65 * math.log(16)
    assert summary["val/any/raw"] < 0.65 * math.log(16)
