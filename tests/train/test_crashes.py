"""Real processes killed mid-run: kill -9 in the middle of a checkpoint write, of a metrics line and
between steps, and SIGTERM at a step off every cadence. Each time, `--resume` cleans up what the
killed process left (an unfinished checkpoint folder, a torn line, its lock) and the finished run's
metrics.jsonl equals that of a run never interrupted. While the first process runs, a second
writer into its directory is refused with the first one's process id."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aogpt.checkpoint import list_checkpoints

ROOT = Path(__file__).resolve().parents[2]
TIMING = {"tokens_per_s", "mfu"}
CADENCE = ["--set", "train.ckpt_interval=3", "--set", "train.eval_interval=4", "--set", "log_interval=2",
           "--set", "train.keep_last=10", "--max-steps", "10"]


def args(data: Path, out: Path) -> list[str]:
    return ["train", "--preset", "tiny", "--data", str(data), "--out", str(out), "--no-progress", *CADENCE]


def rows(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def start(point: str, data: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    return subprocess.Popen([sys.executable, "-m", "tests.train.crash", point, *args(data, out)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, bytes_data) -> list[dict]:
    from aogpt.cli import main

    out = tmp_path_factory.mktemp("whole") / "run"
    assert main(args(bytes_data, out)) == 0
    return rows(out)


@pytest.mark.parametrize("point, leftover", [
    ("mid-checkpoint", "removed 1 unfinished checkpoint folder"),
    ("mid-line", "dropped a torn last line"),
    ("mid-step", ""),
])
def test_kill_9_then_resume_equals_an_uninterrupted_run(point, leftover, cli, bytes_data, tmp_path, uninterrupted):
    out = tmp_path / "run"
    proc = start(point, bytes_data, out)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
    assert (out / ".aogpt.lock").is_file()  # left by the killed process: a stale lock
    if point == "mid-checkpoint":
        assert list(out.glob(".ckpt-*.tmp-*"))
    if point == "mid-line":
        assert not (out / "metrics.jsonl").read_text().endswith("\n")

    result = cli("train", "--out", out, "--resume", "--no-progress")
    assert result.code == 0, result.err
    assert leftover in result.err
    assert rows(out) == uninterrupted
    assert not list(out.glob(".ckpt-*")) and not (out / ".aogpt.lock").exists()


@pytest.mark.slow
def test_a_second_writer_is_refused_and_sigterm_then_resume_equals_an_uninterrupted_run(
        cli, bytes_data, tmp_path, uninterrupted):
    out = tmp_path / "run"
    proc = start("pause", bytes_data, out)
    ready = tmp_path / "READY"
    deadline = time.monotonic() + 300
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), proc.communicate()[1][-2000:]

    for second in (args(bytes_data, out), ["train", "--out", out, "--resume", "--no-progress"]):
        refused = cli(*second)
        assert refused.code == 2 and refused.err.count("\n") == 1, refused.err
        assert refused.err.startswith(f"error: {out} is in use by process {proc.pid} (aogpt train on "), refused.err

    proc.send_signal(signal.SIGTERM)  # stops after step 5: off the log, eval and checkpoint cadences
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert [p.name for p in list_checkpoints(out)][-1] == "ckpt-0000005"
    assert max(r["step"] for r in rows(out)) == 4  # the open window (step 5) is in the checkpoint, not the log

    assert cli("train", "--out", out, "--resume", "--no-progress").code == 0
    assert rows(out) == uninterrupted
