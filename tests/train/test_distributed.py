"""DDP and FSDP2 on CPU: two gloo processes under torchrun follow the one-process trajectory for the
same global batch, a DDP run resumes with a different world size and an FSDP run resumes sharded;
a run leaves its process group only once its DDP model is gone (else a rank can hang on exit)."""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys

import pytest
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from aogpt.train import loop, planning


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


@pytest.mark.parametrize("ending", ["trained", "failed"])
def test_a_run_leaves_its_process_group_after_its_ddp_model_is_gone(ending, bytes_data, tmp_path, monkeypatch):
    """Gloo's backend joins its worker threads when its last reference goes; DDP's reducer holds one and
    drops it with the GIL held, while a worker finishing a collective may need the GIL: a rank then hung
    for good on exit (one in about 14 torchrun resumes of the test above). So when the run leaves the
    group (`destroy_process_group`), no DDP wrapper may be alive, not even in a failed run's traceback
    or a reference cycle. One process in a gloo group of one, as torchrun starts it, trains with DDP."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    alive_at_destroy, destroy = [], dist.destroy_process_group

    def watched_destroy(*args, **kwargs):
        alive_at_destroy.append(sum(issubclass(type(o), DistributedDataParallel) for o in gc.get_objects()))
        return destroy(*args, **kwargs)

    monkeypatch.setattr(dist, "destroy_process_group", watched_destroy)
    if ending == "failed":
        def fail(t, until=None):
            assert isinstance(t.model, DistributedDataParallel)  # the model the traceback now holds
            raise RuntimeError("the run failed")
        monkeypatch.setattr(loop, "fit", fail)
    run = planning.plan(tmp_path / "run", data=bytes_data, preset="tiny", max_steps=1, eval_interval=1,
                        device="cpu", show_progress=False)
    assert run.info.backend == "gloo"
    if ending == "failed":
        with pytest.raises(RuntimeError, match="the run failed"):
            run.run()
    else:
        assert run.run()["step"] == 1
    assert alive_at_destroy == [0] and not dist.is_initialized()
