"""`aogpt.bench.environment`: one record of where the figures come from, the same in every report."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from aogpt import capability
from aogpt.bench.environment import describe_environment, environment, finish_environment
from aogpt.precision import auto_precision

BENCH = Path(__file__).resolve().parents[2] / "src" / "aogpt" / "bench"


def test_the_record_names_the_cpu_class_precision_threads_torch_and_load():
    env = environment("cpu", "auto")
    c = capability.cpu()
    assert env["cpu_class"] == c.cpu_class and env["cpu_native_class"] == c.native_class and env["cpu"] == c.name
    assert env["precision"] == ["auto"] and env["auto_precision"] == auto_precision("cpu")[1]
    assert env["threads"] == torch.get_num_threads() and env["torch"] == torch.__version__
    assert env["device"] == "cpu" and env["torch_kernels"] == torch.backends.cpu.get_cpu_capability()
    assert env["load_average"] is None or len(env["load_average"]) == 3
    assert environment(torch.device("cpu"), ["fp32", "bf16"])["precision"] == ["fp32", "bf16"]
    assert "auto_precision" not in environment("cpu", "fp32")
    assert environment("cpu", None)["precision"] is None  # no model computes (tokenization)


def test_finishing_adds_the_load_after_and_leaves_the_start_alone():
    env = environment("cpu", "fp32")
    done = finish_environment(env)
    assert "load_average_after" not in env and set(done) == {*env, "load_average_after"}
    assert done["load_average_after"] is None or len(done["load_average_after"]) == 3


def _env(**kw):
    base = {"device": "cpu", "cpu": "Some CPU", "cpu_class": "avx2", "cpu_native_class": "avx2", "precision": ["fp32"],
            "threads": 2, "cpus": 4, "torch": "2.x", "load_average": [1.0, 1.0, 1.0]}
    return {**base, **kw}


def test_the_line_says_class_precision_threads_and_load_before_and_after():
    line = describe_environment(_env(load_average_after=[2.0, 1.0, 1.0]))
    assert line == ("Device cpu, CPU class avx2 (Some CPU), precision fp32, 2 threads, torch 2.x, load average "
                    "[1.0, 1.0, 1.0] before, [2.0, 1.0, 1.0] after.")
    emulated = describe_environment(_env(cpu_native_class="amx", precision=["auto"], auto_precision="fp32 (why)"))
    assert "CPU class avx2 (AOGPT_CPU on an amx CPU) (Some CPU), precision auto (fp32 (why))" in emulated


@pytest.mark.parametrize("before,after,busy", [([1.0, 1, 1], [2.0, 1, 1], False), ([5.0, 1, 1], None, True),
                                               ([1.0, 1, 1], [9.0, 1, 1], True)])
def test_a_busy_machine_before_or_after_is_warned_of(before, after, busy):
    line = describe_environment(_env(load_average=before, load_average_after=after))
    assert ("**Warning: the machine was busy" in line) is busy
    assert ("`--threads 1`" in line) is busy  # 2 threads: over-subscription is named


def _calls(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            f = node.func
            names.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return names


def test_every_report_records_the_one_environment():
    """Every module that writes a report (`write_outputs`) records the shared environment (GPU: through
    its runner), and `environment` is defined once (the GPU runner's extends it with CUDA's fields)."""
    writers = {p for p in BENCH.rglob("*.py") if "write_outputs" in _calls(p)}
    assert len(writers) >= 12  # the checker sees the reports
    runner = BENCH / "gpu" / "run.py"
    for path in writers:
        recorded = _calls(runner if path == BENCH / "gpu" / "report.py" else path)
        assert {"environment", "finish_environment"} & recorded or "_environment" in recorded, path
    defined = sorted(str(p.relative_to(BENCH)) for p in BENCH.rglob("*.py")
                     if any(isinstance(n, ast.FunctionDef) and n.name in ("environment", "describe_environment")
                            for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))))
    assert defined == ["environment.py", "gpu/run.py"]
