"""The training loop, `Trainer.fit`: step until `max_steps`, a time limit or a signal; log, validate
and checkpoint on their cadences; then validate, checkpoint and plot once more.

The records written follow the cadences only (`log_interval`, `eval_interval`, and the last step):
a run stopped early by a signal or its time limit validates once more for its summary but logs that
validation only where the cadence would have, and the loss window still open goes into the
checkpoint (`Trainer.window`). So a run stopped at any step and resumed writes the same
metrics.jsonl as one that was never stopped.

SIGINT and SIGTERM do not interrupt a step: they set a flag that every rank sees at the end of the
step (`distributed.broadcast_flag`), so all ranks stop together and write a final checkpoint.

The progress display (a bar on a terminal, a heartbeat line in logs) shows the training loss, the
throughput, the last validation in bits per byte, and -- under a time limit that will cut the run
short at the current speed -- how many steps it will reach, so a busy machine is noticed early.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from typing import Any

from aogpt.progress import progress
from aogpt.train import distributed
from aogpt.train.recipe import against_source
from aogpt.train.step import StepResult

Trainer = Any  # aogpt.train.trainer.Trainer (not imported: trainer.py imports this module)


@contextlib.contextmanager
def stop_on_signals(t: Trainer) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM set `t._stop_signal` (their name) instead of interrupting."""

    def handle(signum, frame) -> None:  # noqa: ARG001
        t._stop_signal = signal.Signals(signum).name

    previous = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


SPEED_SKIP = 3  # the first steps of a process, left out of its speed (they touch memory for the first time)
BUDGET_END_DECAY = 0.9  # a budgeted run stopped by its clock with this much of its decay done ended as planned


def fit(t: Trainer, until: int | None = None) -> dict[str, Any]:
    """Train until max_steps (or max_minutes, or a signal), then validate and checkpoint.

    until: stop after this step instead (at most max_steps; the learning-rate schedule still spans
    max_steps), so a run can be trained in pieces: each piece ends with a validation and a
    checkpoint (loss.png is drawn when the run ends), and resuming from it continues exactly where
    it stopped.

    A compiled training step is compiled first (`Trainer.warm_up`); its time counts in the run's
    time, and so in a time budget, but not in the speed of the steps. Under a time budget the
    progress display counts the budget's seconds (it never goes backwards when the number of steps
    the budget holds is re-estimated) and names the step and the steps expected."""
    if t.cfg.init_from and t.step == 0 and t.family.any_order and not t.source_eval:
        t.source_eval = t.validation({"source": t.raw})  # the start: read left to right, the source model
        t.log({"kind": "source", "step": 0, **t.source_eval})
    compile_seconds = t.warm_up()
    if compile_seconds:
        t.train_seconds += compile_seconds
        if t.show_progress:
            print(f"compiled the training step in {compile_seconds:.0f} s (counted in the training time)",
                  file=sys.stderr, flush=True)
    budgeted = t.schedule.time_budgeted and until is None
    if budgeted:
        budget = t.cfg.max_minutes * 60
        bar_kw: dict[str, Any] = dict(total=round(budget), initial=round(min(t.train_seconds, budget)), unit="s",
                                      bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s "
                                                 "[{elapsed}<{remaining}{postfix}]")
    else:
        bar_kw = dict(total=planned_end(t, until), initial=t.step, unit="step")
    with stop_on_signals(t), progress(desc="train", disable=not t.show_progress, **bar_kw) as bar:
        last = train_steps(t, bar, until, budgeted)
        if budgeted and t.step >= planned_end(t, until) and bar.total:
            bar.update(max(bar.total - bar.n, 0))  # ended at its decay's last step, a little before the clock
    end = planned_end(t, until)
    stopped_by = t._stop_signal or ("time" if t.step < end else "max_steps" if end == t.schedule.end_step
                                    else "until")
    decay_done = t.schedule.decay_done(t.step)
    as_planned = stopped_by in ("max_steps", "until") or (
        stopped_by == "time" and t.schedule.time_budgeted and decay_done >= BUDGET_END_DECAY)
    if stopped_by == "time" and t.show_progress:
        if as_planned:
            print(f"the {t.cfg.max_minutes:g}-minute budget is spent at step {t.step:,} ({100 * decay_done:.0f}% of "
                  "the learning-rate decay done): a last validation and checkpoint follow", file=sys.stderr,
                  flush=True)
        else:
            print(f"time limit of {t.cfg.max_minutes:g} minutes reached after {t.step} of {end} steps: "
                  "stopping early (a last validation and checkpoint follow)", file=sys.stderr, flush=True)
    final_eval = t.evaluate()
    if t.step % t.cfg.eval_interval == 0 or t.step == t.cfg.max_steps:
        t.log({"kind": "eval", "step": t.step, **final_eval})  # off the cadence only in the summary, so
        # metrics.jsonl of a run stopped early and resumed equals that of an uninterrupted run
    ckpt = t.save()
    plot = t.plot() if stopped_by != "until" else None  # a piece of a longer run: plotted when the run ends
    return {
        "step": t.step,
        "planned_steps": t.schedule.end_step,
        "max_minutes": t.cfg.max_minutes,
        "stopped_by": stopped_by,
        "ended_as_planned": as_planned,
        "decay_done": decay_done,
        "train_loss": last.loss if last else None,
        **final_eval,
        **t.validation.coverage(),
        "tokens_seen": t.tokens_seen,
        "tokens_per_s": t.tokens_seen / max(t.train_seconds, 1e-9),
        "train_seconds": t.train_seconds,
        "compile_seconds": t.compile_seconds,
        "checkpoint": str(ckpt or t.last_checkpoint or ""),
        "plot": str(plot) if plot else None,
        "run_dir": str(t.out) if t.out else None,
        "params": t.raw.num_params(),
        "variant": t.model_cfg.variant,
        **t.source_eval,
        **({"against_source": against_source(final_eval, t.source_eval)} if t.source_eval else {}),
    }


def planned_end(t: Trainer, until: int | None = None) -> int:
    """The step this call of `fit` trains to: the schedule's end (`LRSchedule.end_step`: max_steps, or
    where a decay fitted to the time budget ends), or `until` if that comes first."""
    return t.schedule.end_step if until is None else min(until, t.schedule.end_step)


def train_steps(t: Trainer, bar: Any, until: int | None = None, budgeted: bool = False) -> StepResult | None:
    """The steps up to `planned_end`, with train records every `log_interval`, validation every
    `eval_interval` and checkpoints every `ckpt_interval`; the last step's result (None if none ran).
    After every step the schedule sees the time spent (`LRSchedule.observe`): under a time budget it
    may begin its decay, which fixes the step the run ends at. `budgeted`: the bar counts seconds."""
    cfg, window, last = t.cfg, t.window, None
    window.restart_clock()
    first_step = t.step
    speed_from = (t.step, t.train_seconds)  # moved past the first SPEED_SKIP steps once they are done
    announced = False
    while t.step < planned_end(t, until):
        t0 = t.clock()
        last = t.train_step()
        spent = t.clock() - t0
        t.train_seconds += spent
        window.add(last.loss, t.tokens_per_step)
        bar.update(spent if budgeted else 1)
        if t.step - first_step == SPEED_SKIP and planned_end(t, until) - t.step > SPEED_SKIP:
            speed_from = (t.step, t.train_seconds)
        seconds_per_step = (t.train_seconds - speed_from[1]) / max(t.step - speed_from[0], 1)
        if t.schedule.observe(t.step, t.train_seconds, seconds_per_step):
            announce_decay(t, bar, seconds_per_step, budgeted)
        elif not announced and t.step - speed_from[0] >= cfg.log_interval and t.schedule.time_budgeted:
            announce_budget(t, bar, seconds_per_step, budgeted)
            announced = True
        stop_at = planned_end(t, until)
        if t.step % cfg.log_interval == 0 or t.step == stop_at:
            log_window(t, window, last, bar, seconds_per_step)
        if should_stop(t) or t.step >= stop_at:
            break
        if t.step % cfg.eval_interval == 0:
            t.log({"kind": "eval", "step": t.step, **t.evaluate()})
            if t.source_eval and t.info.is_main:  # also without a progress bar: what fine-tuning is judged by
                print(f"step {t.step:,}: {against_source(t.last_eval, t.source_eval)}", file=sys.stderr, flush=True)
            t.plot()
            window.restart_clock()
        if t.step % cfg.ckpt_interval == 0:
            t.save()
            window.restart_clock()
    return last


def announce_budget(t: Trainer, bar: Any, seconds_per_step: float, budgeted: bool = False) -> None:
    """A time-budgeted run knows its speed after its first steps: how many steps the budget holds."""
    expected = t.schedule.expected_steps(seconds_per_step, t.step, t.train_seconds)
    if not budgeted:
        bar.total = expected
    if t.show_progress:
        print(f"at {seconds_per_step:.3g} s a step, the {t.cfg.max_minutes:g}-minute budget holds about {expected:,} "
              "steps", file=sys.stderr, flush=True)


def announce_decay(t: Trainer, bar: Any, seconds_per_step: float, budgeted: bool = False) -> None:
    """The schedule began its decay: say so (under a time budget, with the step the run now ends at)."""
    if not budgeted:
        bar.total = t.schedule.end_step
    if t.show_progress and t.schedule.time_budgeted:
        print(f"learning rate: {100 * (1 - t.cfg.decay_share):g}% of the {t.cfg.max_minutes:g}-minute budget spent at "
              f"step {t.step:,} ({seconds_per_step:.3g} s a step); decaying to {t.cfg.min_lr:g} over the next "
              f"{t.schedule.decay_steps:,} steps, ending at step {t.schedule.end_step:,}", file=sys.stderr, flush=True)


def log_window(t: Trainer, window: Any, last: StepResult, bar: Any, seconds_per_step: float) -> None:
    """Write the train record of the steps since the last one, and show it on the progress bar."""
    figures = window.close(flops_per_token=t.flops_per_token, peak=t.peak_flops, devices=t.info.world_size)
    record = {"kind": "train", "step": t.step, "loss": figures["loss"], "lr": last.lr, "grad_norm": last.grad_norm,
              "tokens": t.tokens_seen, **{k: v for k, v in figures.items() if k != "loss"}}
    if t.cfg.hold_floor < 1 and (t.cfg.replay_l2r > 0 or t.cfg.distill_l2r > 0):
        record["hold"] = t.hold(t.step - 1)  # the weight of replay and distillation in the last step
    t.log(record)
    bar.set_postfix_str(progress_note(t, figures["loss"], figures["tokens_per_s"], seconds_per_step))


def progress_note(t: Trainer, loss: float, tokens_per_s: float, seconds_per_step: float) -> str:
    """`loss 5.123, 4,500 tok/s, val 2.71 bits/byte` and, when the time limit will stop the run
    before its last step at this speed, `time limit: about 700 of 850 steps`."""
    parts = [f"loss {loss:.3f}", f"{tokens_per_s:,.0f} tok/s"]
    if t.schedule.time_budgeted:
        expected = t.schedule.expected_steps(seconds_per_step, t.step, t.train_seconds)
        parts.insert(0, f"step {t.step:,} of {'about ' if t.schedule.decay_start is None else ''}{expected:,}")
    val = next((t.last_eval[k] for k in ("bpb/l2r/ema", "bpb/l2r/raw") if k in t.last_eval), None)
    if val is not None:
        parts.append(f"val {val:.2f} bits/byte")
    elif "val/l2r/ema" in t.last_eval:
        parts.append(f"val loss {t.last_eval['val/l2r/ema']:.3f}")
    limit, end = t.cfg.max_minutes * 60, t.schedule.end_step
    if limit > 0 and seconds_per_step > 0 and not t.schedule.time_budgeted:
        reachable = t.step + int(max(limit - t.train_seconds, 0) / seconds_per_step)
        if reachable < end:
            parts.append(f"time limit: about {reachable:,} of {end:,} steps")
    return ", ".join(parts)


def should_stop(t: Trainer) -> bool:
    """A signal on any rank, or `max_minutes` of training spent (the same answer on every rank)."""
    out_of_time = t.cfg.max_minutes > 0 and t.train_seconds >= t.cfg.max_minutes * 60
    return distributed.broadcast_flag(bool(t._stop_signal) or out_of_time, t.info, t.device)
