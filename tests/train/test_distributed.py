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


def torchrun(*args, procs=2):
    """`aogpt ARGS` in `procs` processes under torchrun. On a timeout the launcher gets SIGTERM, on which
    it stops its ranks (each in a session of its own: a SIGKILL to the launcher would leave a rank stuck
    in a collective running after the test)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}"]
    with subprocess.Popen([*launcher, "-m", "aogpt", *map(str, args)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        try:
            _, err = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            proc.terminate()
            _, err = proc.communicate(timeout=120)
            pytest.fail(f"torchrun did not finish within 600 s: {err[-3000:]}")
    assert proc.returncode == 0, err[-3000:]


@pytest.mark.slow
def test_ddp_and_fsdp_match_one_process_and_resume(tmp_path, bytes_data, cli):
    common = ["train", "--preset", "tiny", "--data", bytes_data, "--no-progress", "--device", "cpu",
              "--global-batch-tokens", 512, "--batch-size", 8, "--set", "train.eval_interval=2",
              "--set", "train.ckpt_interval=2", "--set", "log_interval=1", "--max-steps", 4,
              "--dtype", "float32"]  # fp32: bf16 rounds differently per reduction order, beyond this tolerance
    one, two, sharded = tmp_path / "one", tmp_path / "two", tmp_path / "fsdp"
    assert cli(*common, "--out", one).code == 0  # one process (this one): accumulation 2 x 8 sequences
    torchrun(*common, "--out", two)  # 2 ranks x 8 sequences
    torchrun(*common, "--out", sharded, "--fsdp")  # 2 ranks, each holding half of every weight
    assert_close_rows(rows(one), rows(two))
    assert_close_rows(rows(one), rows(sharded))
    assert json.loads((sharded / "run.json").read_text())["train"]["fsdp"] is True
    assert json.loads((two / "run.json").read_text())["train"]["global_batch_tokens"] == 512

    # the one-process run resumes with 2 processes (DDP), the FSDP run sharded: still the same trajectory
    torchrun("train", "--out", one, "--resume", "--extend-to", 6, "--no-progress")
    torchrun("train", "--out", sharded, "--resume", "--extend-to", 6, "--no-progress")
    assert_close_rows(rows(one), rows(sharded))
    assert max(r["step"] for r in rows(one)) == 6


def test_fsdp_without_torchrun_is_refused(cli, bytes_data, tmp_path):
    result = cli("train", "--preset", "tiny", "--data", bytes_data, "--out", tmp_path / "r", "--fsdp")
    assert result.code == 2 and result.err.strip() == (
        "error: --fsdp shards the model over several processes (launch with torchrun, or drop --fsdp)")
