"""Progress on stderr: a tqdm bar on terminals, a plain heartbeat line in logs and pipes."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from tqdm.auto import tqdm

from aogpt.progress import Heartbeat, duration, heartbeat_seconds, progress


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_heartbeat_prints_at_most_every_interval_and_once_at_the_end():
    clock, out = Clock(), io.StringIO()
    bar = Heartbeat(850, "train", unit="step", interval=30, file=out, clock=clock)
    for _ in range(119):
        clock.now += 0.25  # 29.75 s: no line yet
        bar.update(1)
    assert out.getvalue() == ""
    bar.set_postfix(loss="5.123", tok_s="4,500")
    clock.now = 1070.0
    bar.update(1)  # 120 steps in 70 s: 730 more take 425.8 s
    assert out.getvalue() == "train: 120/850 steps (14%), loss 5.123, tok_s 4,500, elapsed 1m10s, ETA 7m05s\n"
    clock.now += 10
    bar.update(5)  # 10 s since the last line
    assert out.getvalue().count("\n") == 1
    with bar:
        pass  # close on leaving: the last line, then nothing more
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("train: 125/850 steps (14%), loss 5.123")
    assert bar.n == 125 and bar.total == 850


def test_heartbeat_eta_counts_only_this_runs_progress_and_unknown_totals_show_a_count():
    clock, out = Clock(), io.StringIO()
    bar = Heartbeat(100, "train", initial=50, unit="step", interval=0, file=out, clock=clock)
    clock.now += 60
    bar.update(10)  # 10 steps a minute since the resume: 40 left take 4 minutes
    assert out.getvalue().splitlines()[-1] == "train: 60/100 steps (60%), elapsed 1m00s, ETA 4m00s"
    bar.update(40)
    assert out.getvalue().splitlines()[-1] == "train: 100/100 steps (100%), elapsed 1m00s"  # done: no ETA
    plain = Heartbeat(None, "", interval=0, file=out, clock=clock)
    plain.set_postfix_str("step 3")
    plain.update(1234)
    assert out.getvalue().splitlines()[-1] == "1,234 it, step 3, elapsed 0s"


def test_progress_off_a_terminal_is_a_heartbeat_with_the_interval_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("AOGPT_HEARTBEAT_SECONDS", "0")
    with progress(total=4, desc="import") as bar:
        assert isinstance(bar, Heartbeat)
        bar.set_description("import: read")
        bar.update(1)
        bar.set_postfix(loss=2.5, tokens=12000)
        bar.update(3)
    err = capsys.readouterr()
    assert err.out == ""  # stdout carries results only
    lines = err.err.splitlines()
    assert lines[0].startswith("import: read: 1/4 it (25%), elapsed 0s")
    assert lines[1].startswith("import: read: 4/4 it (100%), loss 2.5, tokens 12,000, elapsed")
    assert len(lines) == 3  # and one at the end


def test_disabled_progress_prints_nothing(monkeypatch, capsys):
    monkeypatch.setenv("AOGPT_HEARTBEAT_SECONDS", "0")
    with progress(total=3, desc="train", disable=True) as bar:
        bar.update(3)
        bar.set_postfix(loss="1.000")
    assert capsys.readouterr().err == ""


def test_a_terminal_gets_the_tqdm_bar(monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    bar = progress(total=3, desc="train")
    try:
        assert isinstance(bar, tqdm) and not bar.disable
    finally:
        bar.close()


def test_heartbeat_interval_setting(monkeypatch):
    monkeypatch.delenv("AOGPT_HEARTBEAT_SECONDS", raising=False)
    assert heartbeat_seconds() == 30
    for value, expected in (("5", 5), ("0.5", 0.5), ("soon", 30), ("-1", 30), ("nan", 30)):
        monkeypatch.setenv("AOGPT_HEARTBEAT_SECONDS", value)
        assert heartbeat_seconds() == expected
    assert [duration(s) for s in (0, 59.9, 70, 3600 + 125)] == ["0s", "59s", "1m10s", "1h02m05s"]


def test_the_library_never_imports_the_cli():
    src = Path(__file__).resolve().parents[1] / "src" / "aogpt"
    offenders = [str(p.relative_to(src)) for p in src.rglob("*.py")
                 if p.parent.name != "cli" and p.name != "__main__.py" and "aogpt.cli" in p.read_text()]
    assert offenders == []


def test_the_unit_is_plural_by_the_total_not_by_the_count_so_far():
    clock, out = Clock(), io.StringIO()
    bar = Heartbeat(100, "train", unit="step", interval=0, file=out, clock=clock)
    bar.update(1)
    assert out.getvalue().splitlines()[-1].startswith("train: 1/100 steps (1%)")
    single = Heartbeat(None, "train", unit="step", interval=0, file=out, clock=clock)
    single.update(1)
    assert out.getvalue().splitlines()[-1].startswith("train: 1 step,")
