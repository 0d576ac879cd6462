"""The learning-rate schedule: cosine, warm-up-stable-decay, and a decay fitted to a time budget."""

from __future__ import annotations

import itertools

import pytest
import torch

from aogpt.checkpoint import list_checkpoints
from aogpt.config import train_config
from aogpt.errors import AOGPTError
from aogpt.train import LRSchedule, lr_at
from tests.train.runs import make


def fake_clock(seconds_per_call: float):
    """A clock that advances by `seconds_per_call` each time it is read: every step then takes exactly
    that long (the loop reads it just before and just after a step)."""
    ticks = itertools.count()
    return lambda: next(ticks) * seconds_per_call


def test_wsd_by_steps_warms_up_holds_then_decays_to_min_lr_at_the_end():
    cfg = train_config(None, lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=100, lr_schedule="wsd",
                       decay_share=0.2)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert all(lr_at(s, cfg) == 1.0 for s in range(10, 80))
    assert lr_at(80, cfg) == pytest.approx(1.0 - 0.9 / 20) and lr_at(99, cfg) == pytest.approx(0.1)
    assert all(lr_at(s, cfg) > lr_at(s + 1, cfg) for s in range(80, 99))
    assert LRSchedule(cfg).end_step == 100


def test_a_time_budget_begins_the_decay_at_its_share_and_fits_its_length_to_the_speed():
    """60 s budget, decay over the last 25%: at 0.5 s a step the decay begins when 45 s are spent
    (step 90) and lasts the 15 s left (x 0.98 margin) = 29 steps; the run then ends at step 119."""
    cfg = train_config(None, lr=1.0, min_lr=0.0, warmup_steps=0, max_steps=10**6, max_minutes=1.0,
                       lr_schedule="wsd", decay_share=0.25)
    sched = LRSchedule(cfg)
    assert sched.time_budgeted and sched.expected_steps(0.5) == 117  # 60 s x 0.98 / 0.5
    began = [s for s in range(1, 200) if sched.observe(s, 0.5 * s, 0.5)]
    assert began == [90] and (sched.decay_start, sched.decay_steps, sched.end_step) == (90, 29, 119)
    assert sched.lr(89) == 1.0 and sched.lr(118) == pytest.approx(0.0) and sched.lr(104) == pytest.approx(1 - 15 / 29)
    again = LRSchedule(cfg)
    again.load_state_dict(sched.state_dict())
    assert [again.lr(s) for s in range(130)] == [sched.lr(s) for s in range(130)]


def test_a_slow_machine_and_a_fast_one_both_end_decayed_within_the_budget(tmp_path):
    """The same 0.2-minute budget at 0.1 s and at 0.4 s a step: the fast run trains about 4x more steps,
    both end with the rate at min_lr, both use more than 90% of the budget and none exceeds it."""
    ends = {}
    for per_step in (0.1, 0.4):
        t = make(None, max_steps=10**6, max_minutes=0.2, lr_schedule="wsd", decay_share=0.2, eval_interval=10**6,
                 ckpt_interval=10**6, warmup_steps=2)
        t.clock = fake_clock(per_step)
        summary = t.fit()
        assert summary["stopped_by"] == "max_steps" and summary["step"] == t.schedule.end_step
        assert 0.9 * 12 <= summary["train_seconds"] <= 12 + 1e-9
        assert t.schedule.lr(t.step - 1) == pytest.approx(t.cfg.min_lr)
        ends[per_step] = summary["step"]
    assert 3.5 < ends[0.1] / ends[0.4] < 4.5


@pytest.mark.parametrize("stop", [40, 120])  # before the decay began, and in the middle of it
def test_resume_in_a_time_budgeted_run_continues_exactly(tmp_path, stop):
    """Stopped at `stop` and resumed (the fake clock times both pieces alike), the run takes the same
    decision and ends with the same weights as an uninterrupted one."""
    train = dict(max_steps=10**6, max_minutes=0.05, lr_schedule="wsd", decay_share=0.3, eval_interval=10**6,
                 ckpt_interval=10**6, warmup_steps=2, curriculum="l2r@20,mallows:3..0.3@60", order="uniform")
    (tmp_path / "whole").mkdir()
    (tmp_path / "pieces").mkdir()
    whole = make(tmp_path / "whole", **train)
    whole.clock = fake_clock(0.02)
    whole.fit()
    first = make(tmp_path / "pieces", **train)
    first.clock = fake_clock(0.02)
    first.fit(until=stop)
    rest = make(tmp_path / "pieces", **train)
    rest.clock = fake_clock(0.02)
    rest.resume(list_checkpoints(tmp_path / "pieces")[-1])
    rest.fit()
    assert whole.step == rest.step == whole.schedule.end_step and 100 < whole.step < 150
    assert rest.schedule.state_dict() == whole.schedule.state_dict()
    for a, b in zip(whole.raw.state_dict().values(), rest.raw.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_an_unknown_schedule_is_refused():
    with pytest.raises(AOGPTError, match="lr_schedule"):
        train_config(None, lr_schedule="linear")


@pytest.mark.parametrize("variant, curriculum, message", [
    ("gpt", "l2r@5,mallows:3..0.3@10", "reads left to right only"),  # a GPT has no target position
    ("gpt", "uniform@5", "reads left to right only"),
    ("encoder-mdm", "l2r@5", "draws its own masks"),
])
def test_a_curriculum_a_variant_cannot_read_is_refused(tmp_path, variant, curriculum, message):
    order = "l2r" if variant == "gpt" else "uniform"
    with pytest.raises(AOGPTError, match=message):
        make(tmp_path, variant, curriculum=curriculum, order=order)
