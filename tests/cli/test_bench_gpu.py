"""`aogpt bench gpu` end to end: --quick runs every part on the CPU (CUDA-only checks skipped) through the
real command line, with the packages the GPU machine lacks made unimportable; --dry-run's plan fits 8
minutes at H100 rates; a broken part makes the exit status 1; bad input is one line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Not on the GPU machine the lead runs the command on (docs/gpu.md): importing any of them must not be needed.
ABSENT = ("fastapi", "uvicorn", "greenlet", "lm_eval", "datasets")


@pytest.mark.slow
def test_quick_runs_every_part_on_the_cpu_without_the_server_and_harness_packages(tmp_path):
    """One real run: the command, torchrun's workers (PYTHONPATH carries the blocker to them) and the report."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{m!r}] = None  # import {m} -> ImportError\n" for m in ABSENT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "src")]), "OMP_NUM_THREADS": "1",
           "AOGPT_HEARTBEAT_SECONDS": "30"}
    blocked = subprocess.run([sys.executable, "-c", "import aogpt.serve.engine"], env=env, capture_output=True,
                             text=True, cwd=tmp_path)
    assert blocked.returncode == 1 and "ModuleNotFoundError: import of greenlet halted" in blocked.stderr
    out = tmp_path / "report"
    res = subprocess.run([sys.executable, "-m", "aogpt", "bench", "gpu", "--quick", "--threads", "1", "--out", str(out),
                          "--json"], env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["passed"] is True and summary["quick"] is True
    assert list(summary["parts"]) == ["figure5", "training", "correctness", "distributed"]  # the figures first
    assert summary["parts"] == dict.fromkeys(("figure5", "training", "correctness", "distributed"), "passed")
    assert summary["checks"]["failed"] == 0 and summary["checks"]["passed"] >= 20
    for name in ("gpu.md", "gpu.json", "gpu-figure5.png"):
        assert (out / name).is_file()
    assert not (out / ".lock").exists() and sorted(p.name for p in out.iterdir()) == \
        ["gpu-figure5.png", "gpu.json", "gpu.md"]
    report = json.loads((out / "gpu.json").read_text())
    assert report["finished"] is True and report["environment"]["device"] == "cpu"
    skipped = [c for p in report["parts"].values() for c in p["checks"] if c["passed"] is None]
    assert skipped and all(c["note"].startswith("skipped: ") for c in skipped)
    assert any("no CUDA device" in c["note"] for c in skipped)
    dist = report["parts"]["distributed"]["checks"]
    assert {c["name"] for c in dist if c["passed"]} >= {"DDP, 1 process, fp32: loss per step = one process's",
                                                        "FSDP2, 1 process, fp32: loss per step = one process's"}
    gen = report["parts"]["figure5"]["metrics"]["generate"]
    assert set(gen["seconds"]) == {"aogpt", "encoder", "gpt", "hf-gpt2"} and gen["n"] == 32
    lines = res.stderr.splitlines()  # one progress line per finished part (a heartbeat: stderr is not a terminal)
    assert [sum(line.startswith(f"bench gpu: {i}/4 parts") for line in lines) for i in range(1, 5)] == [1, 1, 1, 1]
    md = (out / "gpu.md").read_text()
    assert "Result: **passed**" in md and "## 1. Generation speed (the paper's Figure 5): passed" in md


def test_dry_run_plan_fits_8_minutes_at_h100_rates(cli, tmp_path):
    res = cli("bench", "gpu", "--dry-run", "--json", "--out", tmp_path / "never")
    assert res.code == 0, res.err
    summary = res.json
    assert summary["fits"] is True and summary["total_seconds"] <= summary["limit_seconds"] == 480
    assert set(summary["parts"]) == {"correctness", "figure5", "distributed", "training"}
    assert "# Plan of `aogpt bench gpu`" in res.out and "790 TFLOP/s" in res.out and "fits." in res.out
    assert not (tmp_path / "never").exists()  # a dry run writes nothing


def test_a_broken_part_is_reported_and_the_exit_status_says_so(cli, tmp_path, monkeypatch):
    from aogpt.bench.gpu import run as gpu

    def fine(ctx):
        ctx.check("fine", 0.0, 1.0)

    def broken(ctx):
        raise ValueError("a deliberately broken part")

    monkeypatch.setattr(gpu, "default_parts", lambda: {"correctness": fine, "figure5": broken, "training": fine})
    res = cli("bench", "gpu", "--quick", "--out", tmp_path, "--json", "--no-progress")
    assert res.code == 1
    assert res.json["parts"] == {"correctness": "passed", "figure5": "error", "training": "passed"}
    assert "Error: ValueError: a deliberately broken part" in (tmp_path / "gpu.md").read_text()
    res = cli("bench", "gpu", "--quick", "--out", tmp_path, "--json", "--no-progress", "--parts", "correctness")
    assert res.code == 0 and res.json["parts"] == {"correctness": "passed"}


@pytest.mark.parametrize("args,message", [
    (["--parts", "nope"], "error: unknown part(s) nope (choose from: figure5, training, correctness, distributed)"),
    (["--parts", ","], "error: unknown part(s) (none given) (choose from: figure5, training, correctness, "
                       "distributed)"),
    (["--device", "cpu"], "error: the full plan needs a CUDA device, and this run has cpu (run it on a machine with a "
                          "GPU, or pass --quick for the tiny plan on the CPU)"),
    (["--threads", "0"], None),
    (["--frobnicate"], None),
])
def test_bad_input_is_one_line_and_exit_2(cli, tmp_path, args, message):
    res = cli("bench", "gpu", *args, "--out", tmp_path / "out")
    assert res.code == 2 and res.out == ""
    assert len(res.err.strip().splitlines()) == 1 and res.err.startswith("error: ")
    if message:
        assert res.err.strip() == message
    assert not (tmp_path / "out").exists()


def test_help(cli):
    res = cli("bench", "gpu", "--help")
    assert res.code == 0 and "--dry-run" in res.out and "--quick" in res.out and "--parts" in res.out
