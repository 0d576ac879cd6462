"""The training loop: stopping on signals, and learning something."""

from __future__ import annotations

import math

import torch

from aogpt.checkpoint import list_checkpoints
from aogpt.config import model_config, train_config
from aogpt.train import RandomTokens, Trainer
from tests.train.runs import make, stop_after


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


def test_training_in_pieces_equals_one_uninterrupted_run(tmp_path):
    """fit(until=...) stops early with a validation and a checkpoint; a new trainer resuming from it
    continues the same run (same schedule, same streams): the metrics equal an uninterrupted run's."""
    from tests.train.runs import records

    (tmp_path / "whole").mkdir()
    (tmp_path / "pieces").mkdir()
    whole = make(tmp_path / "whole", max_steps=12, eval_interval=4, ckpt_interval=100)
    whole.fit()
    first = make(tmp_path / "pieces", max_steps=12, eval_interval=4, ckpt_interval=100)
    summary = first.fit(until=4)
    assert summary["step"] == 4 and summary["stopped_by"] == "until"
    for stop in (8, 12):
        piece = make(tmp_path / "pieces", max_steps=12, eval_interval=4, ckpt_interval=100)
        piece.resume(list_checkpoints(tmp_path / "pieces")[-1])
        last = piece.fit(until=stop)
    assert last["stopped_by"] == "max_steps" and last["step"] == 12
    assert records(tmp_path / "whole") == records(tmp_path / "pieces")


def test_progress_note_shows_validation_and_foresees_a_time_limit(tmp_path):
    from aogpt.train.loop import progress_note

    t = make(None, max_steps=850, max_minutes=10.0)
    t.step, t.train_seconds = 100, 60.0  # 0.6 s a step: 540 s left buy 900 steps, more than the 750 to go
    assert progress_note(t, 5.1234, 4500.0, 0.6) == "loss 5.123, 4,500 tok/s"
    t.last_eval = {"val/l2r/ema": 5.5, "bpb/l2r/ema": 2.714}
    t.train_seconds = 300.0  # 300 s left buy 500 more steps: the limit stops the run at about step 600
    assert progress_note(t, 5.0, 4500.0, 0.6) == ("loss 5.000, 4,500 tok/s, val 2.71 bits/byte, "
                                                  "time limit: about 600 of 850 steps")
    t.last_eval = {"val/l2r/ema": 5.5}  # random tokens: no bytes, the loss instead
    t.cfg.max_minutes = 0.0
    assert progress_note(t, 5.0, 4500.0, 0.6) == "loss 5.000, 4,500 tok/s, val loss 5.500"


def test_heartbeat_lines_of_a_run_under_a_time_limit(tmp_path, monkeypatch, capsys):
    """In a log (stderr not a terminal) the run prints heartbeat lines with the step count and an ETA,
    and says when the time limit stops it."""
    monkeypatch.setenv("AOGPT_HEARTBEAT_SECONDS", "0")
    t = make(None, max_steps=10**6, max_minutes=0.005, log_interval=1)
    t.show_progress = True
    summary = t.fit()
    err = capsys.readouterr().err
    assert summary["stopped_by"] == "time" and 0 < summary["step"] < 10**6
    beats = [line for line in err.splitlines() if line.startswith("train: ")]
    assert len(beats) >= 2 and "ETA" in beats[0] and any("time limit: about" in b for b in beats)
    assert f"reached after {summary['step']} of 1000000 steps: stopping early" in err
