"""DDP and FSDP2 on CPU: two gloo processes under torchrun follow the one-process trajectory for the
same global batch, a DDP run resumes with a different world size and an FSDP run resumes sharded."""

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


@pytest.mark.slow
def test_ddp_and_fsdp_match_one_process_and_resume(tmp_path, bytes_data):
    common = ["train", "--preset", "tiny", "--data", bytes_data, "--no-progress", "--device", "cpu",
              "--global-batch-tokens", 512, "--batch-size", 8, "--set", "train.eval_interval=2",
              "--set", "train.ckpt_interval=2", "--set", "log_interval=1", "--max-steps", 4,
              "--dtype", "float32"]  # fp32: bf16 rounds differently per reduction order, beyond this tolerance
    one, two, sharded = tmp_path / "one", tmp_path / "two", tmp_path / "fsdp"
    aogpt(*common, "--out", one)  # accumulation 2 x 8 sequences
    aogpt(*common, "--out", two, procs=2)  # 2 ranks x 8 sequences
    aogpt(*common, "--out", sharded, "--fsdp", procs=2)  # 2 ranks, each holding half of every weight
    assert_close_rows(rows(one), rows(two))
    assert_close_rows(rows(one), rows(sharded))
    assert json.loads((sharded / "run.json").read_text())["train"]["fsdp"] is True
    assert json.loads((two / "run.json").read_text())["train"]["global_batch_tokens"] == 512

    # the one-process run resumes with 2 processes (DDP), the FSDP run sharded: still the same trajectory
    aogpt("train", "--out", one, "--resume", "--extend-to", 6, "--no-progress", procs=2)
    aogpt("train", "--out", sharded, "--resume", "--extend-to", 6, "--no-progress", procs=2)
    assert_close_rows(rows(one), rows(sharded))
    assert max(r["step"] for r in rows(one)) == 6


def test_fsdp_without_torchrun_is_refused(cli, bytes_data, tmp_path):
    result = cli("train", "--preset", "tiny", "--data", bytes_data, "--out", tmp_path / "r", "--fsdp")
    assert result.code == 2 and result.err.strip() == (
        "error: --fsdp shards the model over several processes (launch with torchrun, or drop --fsdp)")
