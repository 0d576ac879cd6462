"""DDP on CPU: two gloo processes under torchrun follow the one-process trajectory for the same
global batch, and a run resumes with a different world size."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def rows(run):
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        out.append({k: v for k, v in r.items() if k not in ("tokens_per_s", "grad_norm")})
    return out


def assert_close_rows(a, b, rel=2e-5):
    assert [(r["kind"], r["step"]) for r in a] == [(r["kind"], r["step"]) for r in b]
    for ra, rb in zip(a, b, strict=True):
        for key, value in ra.items():
            if isinstance(value, float):
                assert rb[key] == pytest.approx(value, rel=rel, abs=1e-6), (ra["step"], key)
            else:
                assert rb[key] == value


def aogpt(*args, procs=1):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}"] \
        if procs > 1 else [sys.executable]
    result = subprocess.run([*launcher, "-m", "aogpt", *map(str, args)], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_ddp_matches_one_process_and_resumes_with_another_world_size(tmp_path, bytes_data):
    common = ["train", "--preset", "tiny", "--data", bytes_data, "--no-progress", "--device", "cpu",
              "--global-batch-tokens", 512, "--batch-size", 8, "--set", "train.eval_interval=2",
              "--set", "train.ckpt_interval=2", "--set", "log_interval=1", "--max-steps", 4]
    one, two = tmp_path / "one", tmp_path / "two"
    aogpt(*common, "--out", one)  # accumulation 2 x 8 sequences
    aogpt(*common, "--out", two, procs=2)  # 2 ranks x 8 sequences
    assert_close_rows(rows(one), rows(two))
    assert json.loads((two / "run.json").read_text())["train"]["global_batch_tokens"] == 512

    # resume both to step 6 with the world size swapped: still the same trajectory
    aogpt("train", "--out", one, "--resume", "--max-steps", 6, "--no-progress", procs=2)
    aogpt("train", "--out", two, "--resume", "--max-steps", 6, "--no-progress")
    assert_close_rows(rows(one), rows(two))
    assert max(r["step"] for r in rows(one)) == 6
