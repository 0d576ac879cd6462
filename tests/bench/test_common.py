"""`aogpt.bench.common`: interleaved timing (wall and CPU), targets, input parsing."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import pytest
import torch

from aogpt.bench.common import (
    Target,
    cpu_seconds,
    interleaved_medians,
    interleaved_timings,
    parse_checkpoints,
    parse_int_list,
)
from aogpt.errors import AOGPTError

CPU = torch.device("cpu")


def test_interleaved_medians_run_round_robin():
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    med, runs = interleaved_medians(fns, CPU, repeats=3, long_run=10.0)
    assert calls == ["a", "b"] * 3 and med["a"] == sorted(runs["a"])[1]  # round robin, median of 3
    calls.clear()
    med, runs = interleaved_medians(fns, CPU, repeats=3, long_run=-1.0)
    assert calls == ["a", "b"] and len(runs["a"]) == 1  # a run longer than long_run is not repeated


def test_no_repeat_starts_past_the_deadline_but_every_call_runs_once():
    order = []
    calls = {k: (lambda k=k: order.append(k)) for k in "ab"}
    t = interleaved_timings(calls, CPU, repeats=3, deadline=time.monotonic() - 1.0)
    assert order == ["a", "b"] and all(len(r) == 1 for r in t.wall_runs.values())
    order.clear()
    interleaved_timings(calls, CPU, repeats=3, deadline=time.monotonic() + 60.0)
    assert order == ["a", "b"] * 3


def test_interleaved_timings_measure_cpu_beside_wall():
    def spin() -> None:  # busy for 20 ms of CPU time, however long a loaded machine makes that in wall time
        end = time.process_time() + 0.02
        while time.process_time() < end:
            pass

    seen = []
    t = interleaved_timings({"spin": spin, "sleep": lambda: time.sleep(0.02)}, CPU, repeats=3, progress=seen.append)
    assert seen == ["spin", "sleep"] * 3
    assert set(t.wall) == set(t.cpu) == {"spin", "sleep"}
    assert all(len(t.wall_runs[k]) == len(t.cpu_runs[k]) == 3 for k in t.wall)
    assert t.cpu["spin"] == statistics.median(t.cpu_runs["spin"]) and t.wall["sleep"] >= 0.02
    assert t.cpu["spin"] >= 0.02 and t.wall["spin"] >= 0.02 and t.cpu["sleep"] < 0.01  # sleeping takes no CPU
    med, runs = interleaved_medians({"sleep": lambda: time.sleep(0.02)}, CPU, 1, 10.0)  # the old interface: wall
    assert med["sleep"] >= 0.02 and runs["sleep"] == [med["sleep"]]


def test_cpu_seconds_count_finished_child_processes():
    before = cpu_seconds()
    subprocess.run([sys.executable, "-c", "sum(range(3_000_000))"], check=True)
    assert cpu_seconds() - before > 0.01


def test_targets():
    assert Target("x", 30.0, 25.0, True).met and not Target("y", 1.4, 1.3, False).met
    assert Target("z", None, 1.0, True).met is None
    assert Target("speed", 3.5, 3.0, True).line() == "- speed: 3.50x (goal >= 3x: reached)"


def test_parsing():
    for bad in ("", "a,b", "0,4"):
        with pytest.raises(AOGPTError):
            parse_int_list(bad, "steps")
    assert parse_int_list("64, 16,64", "steps") == [16, 64]
    with pytest.raises(AOGPTError, match="VARIANT=PATH"):
        parse_checkpoints(["ckpt/dir"], ("aogpt",))


def test_past_the_cutoff_no_run_starts_and_the_calls_not_run_are_absent():
    import time

    from aogpt.bench.common import interleaved_timings

    ran = []

    def slow(key):
        def run():
            ran.append(key)
            time.sleep(0.05)
        return run

    calls = {k: slow(k) for k in "abcd"}
    t = interleaved_timings(calls, torch.device("cpu"), repeats=3, cutoff=time.monotonic() + 0.12)
    assert ran and len(ran) < 4 and set(t.wall) == set(ran) and set(t.cpu) == set(ran)
    assert all(len(v) == 1 for v in t.wall_runs.values())
