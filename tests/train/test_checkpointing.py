"""Checkpoints of a run: exact resume, and metrics truncated to the checkpoint resumed from."""

from __future__ import annotations

import pytest
import torch

from aogpt.checkpoint import list_checkpoints
from tests.train.runs import make, records, stop_after


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


@pytest.mark.parametrize("stop", [1, 5, 7, 11])
def test_stopped_at_any_step_and_resumed_writes_the_metrics_of_an_uninterrupted_run(tmp_path, stop):
    """SIGTERM (or the time limit) at a step off the log, eval and checkpoint cadences: the open loss
    window goes into the checkpoint and the extra validation stays out of metrics.jsonl."""
    (tmp_path / "full").mkdir()
    make(tmp_path / "full", log_interval=3).fit()
    (tmp_path / "cut").mkdir()
    first = make(tmp_path / "cut", log_interval=3)
    stop_after(first, stop)
    assert first.fit()["step"] == stop
    second = make(tmp_path / "cut", log_interval=3)
    second.resume(list_checkpoints(tmp_path / "cut")[-1])
    second.fit()
    assert records(tmp_path / "cut") == records(tmp_path / "full")
