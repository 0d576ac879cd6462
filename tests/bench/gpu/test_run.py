"""`aogpt.bench.gpu.run`: parts isolated (a broken one is reported, the rest run, the run fails), the report
rewritten before and after every part, the plan's estimate from FLOPs and bytes, and the correctness
checks able to fail. The whole --quick run on the CPU is tests/cli/test_bench_gpu.py's."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import torch

from aogpt import capability
from aogpt.bench.gpu import checks as gpu_checks
from aogpt.bench.gpu import distributed as gpu_distributed
from aogpt.bench.gpu.parts import Context, Part, Skipped
from aogpt.bench.gpu.plan import FULL, LIMIT_S, PARTS, QUICK, estimate, generation_seconds, roofline
from aogpt.bench.gpu.run import Run


def passing(ctx: Context) -> None:
    ctx.check("one equals one", 0.0, 1e-9)
    ctx.lines("a line of this part")


def broken(ctx: Context) -> None:
    ctx.check("a check before the break", 0.0, 1.0)
    raise RuntimeError("deliberately broken")


def test_a_broken_part_is_reported_with_its_message_and_the_others_complete(tmp_path):
    seen = []

    def last(ctx: Context) -> None:
        seen.append("last")
        passing(ctx)

    run = Run(QUICK, torch.device("cpu"), out=tmp_path, parts={"first": passing, "broken": broken, "last": last})
    summary = run.execute()
    parts = summary["parts"]
    assert [parts[p]["status"] for p in ("first", "broken", "last")] == ["passed", "error", "passed"]
    assert parts["broken"]["error"] == "RuntimeError: deliberately broken" and seen == ["last"]
    assert "deliberately broken" in parts["broken"]["trace"]
    assert parts["broken"]["checks"][0]["passed"] is True  # what it recorded before breaking is kept
    assert summary["passed"] is False and summary["finished"] is True
    md = (tmp_path / "gpu.md").read_text()
    assert "Result: **FAILED**" in md and "Error: RuntimeError: deliberately broken" in md
    assert json.loads((tmp_path / "gpu.json").read_text())["parts"]["last"]["status"] == "passed"


def test_a_failed_check_fails_the_run_and_a_skipped_one_does_not(tmp_path):
    def failing(ctx: Context) -> None:
        ctx.check("two is at most one", 2.0, 1.0)
        ctx.check("a missing value", None, 1.0)

    def skipping(ctx: Context) -> None:
        ctx.skip("a CUDA-only check", "no CUDA device")

    def not_here(ctx: Context) -> None:
        raise Skipped("nothing of it applies here")

    summary = Run(QUICK, torch.device("cpu"), parts={"skipping": skipping, "not here": not_here}).execute()
    assert summary["passed"] is True and summary["parts"]["not here"]["status"] == "skipped"
    summary = Run(QUICK, torch.device("cpu"), parts={"failing": failing}).execute()
    assert summary["passed"] is False and summary["parts"]["failing"]["status"] == "failed"
    assert [c["passed"] for c in summary["parts"]["failing"]["checks"]] == [False, False]


def test_the_report_on_disk_holds_every_finished_part_while_the_next_runs(tmp_path):
    """A run killed during a part leaves the parts before it, finished, on disk."""
    snapshots = []

    def slow(ctx: Context) -> None:
        ctx.metric("first piece", 1)
        ctx.save()
        snapshots.append(json.loads((tmp_path / "gpu.json").read_text()))

    Run(QUICK, torch.device("cpu"), out=tmp_path, parts={"first": passing, "second": slow}).execute()
    during = snapshots[0]
    assert during["finished"] is False and during["passed"] is None
    assert during["parts"]["first"]["status"] == "passed" and during["parts"]["second"]["status"] == "running"
    assert during["parts"]["second"]["metrics"] == {"first piece": 1}
    final = json.loads((tmp_path / "gpu.json").read_text())
    assert final["finished"] is True and final["parts"]["second"]["status"] == "passed"


def test_a_part_sees_its_share_as_a_deadline(tmp_path):
    left = []
    plan = dataclasses.replace(QUICK, shares={"timed": 5.0})
    Run(plan, torch.device("cpu"), parts={"timed": lambda ctx: left.append(ctx.left())}).execute()
    assert 4.0 < left[0] <= 5.0


# ----------------------------------------------------------------------------- the plan
def test_the_full_plan_fits_8_minutes_at_h100_rates_and_every_part_its_share():
    est = estimate(FULL)
    assert est["fits"] and est["total_seconds"] <= LIMIT_S and est["over_share"] == []
    assert est["shares_total"] <= LIMIT_S
    assert set(est["parts"]) == set(PARTS)
    for part in PARTS:
        assert 0 < est["parts"][part]["seconds"] <= FULL.shares[part]
    assert estimate(FULL, world=8)["parts"]["distributed"]["launches"] == 2


def test_the_estimate_follows_flops_and_bytes():
    assert roofline(790e12 * 0.5, 0, 0) == pytest.approx(1.0)  # compute bound at the derated peak
    assert roofline(0, 3.3e12 * 0.6, 0) == pytest.approx(1.0)  # memory bound
    size = FULL.fig_size
    enc = [generation_seconds("encoder", size, 1024, 32, T) for T in (64, 128)]
    assert enc[1] == pytest.approx(2 * enc[0], rel=0.05)  # T full passes
    assert generation_seconds("encoder", size, 1024, 64, 64) > 1.8 * enc[0]  # twice the batch, twice the FLOPs
    too_big = dataclasses.replace(FULL, fig_n=4096, fig_steps=(4096,), fig_encoder_limit=1e9)
    est = estimate(too_big)
    assert not est["fits"] and "figure5" in est["over_share"]


# ----------------------------------------------------------------------------- the checks can fail
def _ctx(plan=QUICK) -> Context:
    return Context(plan, torch.device("cpu"), 0, Part("correctness", 60), time.monotonic() + 60)


def test_the_cache_check_fails_when_a_logit_is_wrong(monkeypatch):
    from aogpt.generation import generate as gen

    real = gen.generate

    def corrupted(*args, **kwargs):
        res = real(*args, **kwargs)
        res.logits[0, 5] += 0.5  # one query's logits off by a constant: its log-probabilities are not
        res.logits[0, 5, 0] += 3.0
        return res

    monkeypatch.setattr(gen, "generate", corrupted)
    ctx = _ctx()
    gpu_checks.cache_vs_recompute(ctx)
    cache = [c for c in ctx.part.checks if c.name.startswith("KV cache = recomputation")]
    assert len(cache) == 2 and all(c.passed is False for c in cache)


def test_the_law_check_rejects_a_sampler_that_draws_from_the_wrong_law(monkeypatch):
    from aogpt.generation import generate as gen

    real = gen.generate

    def left_to_right(model, **kwargs):  # the samples of a one-order sampler: not the any-order law
        kwargs["order"] = "l2r"
        return real(model, **kwargs)

    monkeypatch.setattr(gen, "generate", left_to_right)
    ctx = _ctx()
    gpu_checks.sampler_law(ctx)
    laws = [c for c in ctx.part.checks if "against the enumerated law" in c.name]
    assert laws and all(c.passed is False for c in laws)


def test_the_correctness_part_on_the_cpu_passes_and_skips_the_cuda_checks():
    ctx = _ctx()
    gpu_checks.run(ctx)
    checks = ctx.part.checks
    assert checks and not [c for c in checks if c.passed is False]
    skipped = {c.name for c in checks if c.passed is None}
    bf16 = capability.usable_precision(torch.bfloat16)  # without bf16 units (an AVX2 CPU, the switch) bf16 is skipped
    assert all("no CUDA device" in c.note or (not bf16 and "has no bf16 units" in c.note)
               for c in checks if c.passed is None)
    assert any(n.startswith("attention flash") for n in skipped)
    assert {f"training step, {v}, fp32 on the device vs the CPU" for v in ("aogpt", "gpt")} \
        <= skipped
    assert any(c.name.startswith("checkpoint") and c.passed for c in checks)


def test_the_distributed_worker_records_each_mode_apart(tmp_path):
    """Without torchrun the worker runs in one process: DDP is a no-op, FSDP2 is refused (it needs a
    process group), and the refusal is recorded for its mode while the others still run."""
    spec = {"size": [1, 16, 2, 32], "block": 8, "batch": 2, "steps": 2, "dtypes": ["fp32"], "device": "cpu",
            "seed": 0, "accum": 1, "threads": 1}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert gpu_distributed.main([str(tmp_path / "spec.json"), str(tmp_path / "out.json")]) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["ddp/fp32"] == gpu_distributed.train_losses(spec, "fp32", fsdp=False)
    assert "FSDP shards the model over several processes" in out["fsdp/fp32"]


def test_fp32_comparisons_run_with_tf32_off_though_a_trainer_turns_it_on(monkeypatch):
    """On CUDA building a Trainer turns TF32 on; the device-vs-CPU fp32 checks must still compare fp32."""
    from aogpt.train import step as step_module
    from aogpt.train import trainer as trainer_module

    build, call, seen = trainer_module.Trainer._build_model, step_module.OptimizerStep.__call__, []

    def build_like_cuda(self):
        build(self)
        torch.backends.cuda.matmul.allow_tf32 = True

    def recording(self, *args, **kwargs):
        seen.append(torch.backends.cuda.matmul.allow_tf32)
        return call(self, *args, **kwargs)

    monkeypatch.setattr(trainer_module.Trainer, "_build_model", build_like_cuda)
    monkeypatch.setattr(step_module.OptimizerStep, "__call__", recording)
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with gpu_checks.exact_fp32():
            gpu_checks.training_step_vs_cpu(_ctx())
        assert seen and not any(seen)
        assert torch.backends.cuda.matmul.allow_tf32 is True  # as it was before the checks
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_a_cpu_without_bf16_trains_the_quick_parts_in_fp32(as_cpu):
    """On an AVX2-only CPU (`--quick`), the training parts run in fp32 instead of being refused bf16."""
    from aogpt import capability
    from aogpt.bench.gpu.speed import train_precision

    assert train_precision(torch.device("cuda")) == "bf16"
    if capability.cpu().arch == "x86":
        as_cpu("avx2")
        assert train_precision(torch.device("cpu")) == "fp32"


def sleepy(ctx: Context) -> None:
    """A part that records one piece, then works past its share (run in a child process)."""
    ctx.check("the first piece", 0.0, 1.0)
    ctx.metric("pieces", 1)
    ctx.save()
    print("first piece done", flush=True)
    time.sleep(60)


def child_fails(ctx: Context) -> None:
    ctx.check("before the break", 0.0, 1.0)
    raise ValueError("broken in the child")


def test_a_part_in_its_own_process_is_ended_at_its_share_and_keeps_what_it_finished():
    from aogpt.bench.gpu.isolate import isolated

    plan = dataclasses.replace(QUICK, shares={"sleepy": 6.0, "fails": 30.0})
    lines = []
    t0 = time.monotonic()
    summary = Run(plan, torch.device("cpu"), say=lambda kind, line: lines.append(line),
                  parts={"sleepy": isolated("tests.bench.gpu.test_run:sleepy"),
                         "fails": isolated("tests.bench.gpu.test_run:child_fails")}).execute()
    took = time.monotonic() - t0
    sleepy_part, fails = summary["parts"]["sleepy"], summary["parts"]["fails"]
    assert sleepy_part["status"] == "error" and "ended at its time share" in sleepy_part["error"]
    assert sleepy_part["checks"][0]["passed"] is True and sleepy_part["metrics"] == {"pieces": 1}
    assert any("first piece done" in line for line in lines)  # the child's progress came through
    assert fails["status"] == "error" and fails["error"] == "ValueError: broken in the child"
    assert fails["checks"][0]["passed"] is True and "broken in the child" in fails["trace"]
    assert took < 6.0 + 30.0  # the sleeper did not get its 60 s
    assert summary["passed"] is False


def test_the_plan_travels_to_a_child_process_whole():
    from aogpt.bench.gpu.isolate import plan_from_dict

    assert plan_from_dict(dataclasses.asdict(FULL)) == FULL
    assert plan_from_dict(json.loads(json.dumps(dataclasses.asdict(QUICK)))) == QUICK


def test_the_eager_model_of_a_step_reproduces_the_h200_measurements_within_2x():
    """The only GPU measurements of decode steps (docs/gpu.md, eager, before CUDA graphs): the plan's
    model of an eager step's host work must reproduce them, or its estimates are not honest."""
    from aogpt.bench.gpu.plan import EAGER_H200

    for (method, T), ms in EAGER_H200.items():
        steps = T if method == "aogpt" else 1024
        est = generation_seconds(method, FULL.fig_size, 1024, 32, T, graphs=False) / steps * 1e3
        assert ms / 2 <= est <= 2 * ms, (method, T, est, ms)


def test_figure5_and_training_run_first_and_training_in_its_own_process_when_it_compiles():
    from aogpt.bench.gpu.run import default_parts

    assert PARTS[:2] == ("figure5", "training") and list(default_parts(FULL)) == list(PARTS)
    assert default_parts(FULL)["training"].__name__.startswith("isolated")
    assert not default_parts(QUICK)["training"].__name__.startswith("isolated")  # --quick does not compile
