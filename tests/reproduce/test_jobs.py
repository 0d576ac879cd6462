"""Training processes side by side (`--jobs`): a SIGTERM to the main process passed on to the workers,
the rest trained in two processes again, the same runs as one uninterrupted process; a stop between
pieces; run directories of an older version recognised."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from aogpt.checkpoint import list_checkpoints, load
from aogpt.data import PreparedData
from aogpt.reproduce import runner
from aogpt.reproduce.runner import make_plan, same_identity, train_runs
from aogpt.reproduce.scale import QUICK

SCALE = dataclasses.replace(QUICK, steps=8, evals=2, eval_batches=2, warmup_steps=2)
SRC = Path(__file__).resolve().parents[2] / "src"


def plan_for(out, data, scale=SCALE):
    return make_plan(out, scale, (1,), ("f1",), int(data.tokenizer.padded_vocab_size))


def same_runs(a, b) -> None:
    for x, y in zip(a.runs, b.runs, strict=True):
        assert x.batch_records() == y.batch_records()
        wx, wy = load(x.dir).model.state_dict(), load(y.dir).model.state_dict()
        assert all(torch.equal(wx[k], wy[k]) for k in wx)


def test_a_stop_before_a_piece_trains_one_step_and_checkpoints(tmp_path, bytes_data):
    data = PreparedData(bytes_data)
    plan = plan_for(tmp_path, data)
    run = plan.runs[0]
    runner._check_identity(run)
    with pytest.raises(KeyboardInterrupt):
        runner.advance(run, SCALE.eval_interval, data, stop=lambda: True)
    assert run.step() == 1 and not run.done


@pytest.mark.slow
def test_sigterm_stops_the_workers_and_two_processes_finish_the_runs_one_process_trains(tmp_path, bytes_data):
    data = PreparedData(bytes_data)
    long = dataclasses.replace(SCALE, steps=120)
    script = (
        "import dataclasses, sys\n"
        "from pathlib import Path\n"
        "from aogpt.data import PreparedData\n"
        "from aogpt.reproduce.runner import make_plan, train_runs\n"
        "from aogpt.reproduce.scale import QUICK\n"
        f"scale = dataclasses.replace(QUICK, steps={long.steps}, evals=2, eval_batches=2, warmup_steps=2)\n"
        f"plan = make_plan(Path(sys.argv[1]), scale, (1,), ('f1',), {int(data.tokenizer.padded_vocab_size)})\n"
        "try:\n"
        "    train_runs(plan, PreparedData(sys.argv[2]), False, 2)\n"
        "except KeyboardInterrupt:\n"
        "    sys.exit(130)\n")
    out = tmp_path / "cut"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", script, str(out), str(bytes_data)], env=env,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list((out / "runs").glob("*/metrics.jsonl"))) < 2 and time.monotonic() < deadline \
            and proc.poll() is None:  # both workers inside their first piece
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # the main process only, as `kill PID` does
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, err
    cut = make_plan(out, long, (1,), ("f1",), int(data.tokenizer.padded_vocab_size))
    steps = [r.step() for r in cut.runs]
    assert all(0 < s < long.steps for s in steps), steps  # stopped mid-piece, with a checkpoint
    assert all(list_checkpoints(r.dir) for r in cut.runs)
    train_runs(cut, data, show_progress=False, jobs=2)  # the rest, in two processes again
    assert all(r.done for r in cut.runs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker: one process, never interrupted, trains the same runs
    try:
        whole = make_plan(tmp_path / "whole", long, (1,), ("f1",), int(data.tokenizer.padded_vocab_size))
        train_runs(whole, data, show_progress=False)
    finally:
        torch.set_num_threads(threads)
    same_runs(whole, cut)


def test_an_older_run_directory_is_still_the_run(tmp_path, bytes_data):
    data = PreparedData(bytes_data)
    run = plan_for(tmp_path, data).runs[0]
    current = json.loads(json.dumps(run.identity))
    older = json.loads(json.dumps(current))
    for section, fields in (("spec", ("fim_rate", "infill_budget")), ("model", ("fim_tokens",)),
                            ("train", ("fim_rate", "fim_spm_rate"))):
        for name in fields:
            del older[section][name]  # written before these options existed
    assert same_identity(older, current) and same_identity(current, current)
    older["train"]["lr"] = 1.0
    assert not same_identity(older, current)
    changed = json.loads(json.dumps(current))
    del changed["train"]["fim_rate"]
    current["train"]["fim_rate"] = 0.5  # a new option in use: another run
    assert not same_identity(changed, current)
