"""`aogpt bench gpu`: one command that checks and measures every GPU path, planned for under 7 minutes.

The parts (`aogpt.bench.gpu.plan.PARTS`) run one after another on the first CUDA device: the paper's
Figure 5 and the training throughput first (`aogpt.bench.gpu.speed`), then the correctness checks
(`aogpt.bench.gpu.checks`) and DDP / FSDP2 under torchrun (`aogpt.bench.gpu.distributed`). Each part
is isolated: an exception is recorded with its message and the next part runs. Each has a time share
it cannot overrun: its loops start nothing that would end past it, and a part whose work no loop can
stop (compiling) runs in its own process, ended at its share (`aogpt.bench.gpu.isolate`). The report
(markdown, JSON and the Figure 5 PNG, `aogpt.bench.gpu.report`) is rewritten before and after every
part, so a run stopped by a time limit still leaves every finished part on disk. The run passes when
every check of every part passed; a skipped check (no CUDA device, in ``--quick`` on a CPU) does not
fail it. docs/gpu.md.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aogpt.bench.environment import finish_environment
from aogpt.bench.gpu.parts import Context, Part, PartError, PartFn, Skipped
from aogpt.bench.gpu.plan import PARTS, TITLES, Plan, estimate


def default_parts(plan: Plan | None = None) -> dict[str, PartFn]:
    """The parts in the order they run (`aogpt.bench.gpu.plan.PARTS`): the figures first. Training
    runs in its own process, ended at its share, when it compiles (`aogpt.bench.gpu.isolate`)."""
    from aogpt.bench.gpu import checks, distributed, speed
    from aogpt.bench.gpu.isolate import isolated

    training = isolated("aogpt.bench.gpu.speed:training") if plan is not None and plan.train_compile \
        else speed.training
    fns = {"figure5": speed.figure5, "training": training, "correctness": checks.run, "distributed": distributed.run}
    return {name: fns[name] for name in PARTS}


class Run:
    """One `aogpt bench gpu` run: its parts in order, the report rewritten as they finish."""

    def __init__(self, plan: Plan, device: torch.device, *, seed: int = 0, out: Path | None = None,
                 parts: dict[str, PartFn] | None = None, say: Callable[[str, str], None] | None = None):
        self.plan, self.device, self.seed, self.out = plan, device, seed, out
        self.functions = parts if parts is not None else default_parts(plan)
        self.parts = {p: Part(p, plan.shares.get(p, 60.0)) for p in self.functions}
        self._say = say
        self.started = time.time()
        self.environment = environment(device)
        self.files: dict[str, str] = {}
        self.estimate = estimate(plan, torch.cuda.device_count() if device.type == "cuda" else 1)

    def say(self, kind: str, line: str) -> None:
        """Tell the caller: kind "start" or "end" of a part, or "detail" (a step within one)."""
        if self._say is not None:
            self._say(kind, line)

    def execute(self) -> dict[str, Any]:
        """Run every part (each isolated, each within its share as far as its loops can tell)."""
        self.save()
        names = list(self.parts)
        for i, name in enumerate(names, 1):
            part = self.parts[name]
            part.status = "running"
            self.save()
            self.say("start", f"[{i}/{len(names)}] {TITLES.get(name, name)}: started (share {part.share_s:.0f} s)")
            start = time.monotonic()
            try:
                self.functions[name](Context(self.plan, self.device, self.seed, part, start + part.share_s,
                                             save=self.save, say=lambda line: self.say("detail", line)))
                if part.checks and any(c.passed is False for c in part.checks):
                    part.status = "failed"
                elif part.checks and all(c.passed is None for c in part.checks):
                    part.status = "skipped"
                else:
                    part.status = "passed"
            except Skipped as exc:
                part.status, part.error = "skipped", str(exc)
            except PartError as exc:
                part.status, part.error = "error", str(exc)
            except Exception as exc:  # noqa: BLE001 - a part's failure is reported, the next part runs
                part.status, part.error = "error", f"{type(exc).__name__}: {exc}"
                part.trace = "".join(traceback.format_exception(exc)[-6:])
            finally:
                part.seconds = time.monotonic() - start
                _release(self.device)
            over = " (over its share)" if part.seconds > part.share_s else ""
            self.say("end", f"{TITLES.get(name, name)}: {part.status}"
                     + (f" ({part.error})" if part.error else "") + f", {part.seconds:.0f} s{over}")
            self.save()
        return self.summary(finished=True)

    @property
    def passed(self) -> bool:
        return all(p.status in ("passed", "skipped") for p in self.parts.values())

    def summary(self, finished: bool = False) -> dict[str, Any]:
        parts = {n: p.to_dict() for n, p in self.parts.items()}
        return {"benchmark": "gpu", "quick": self.plan.quick, "finished": finished,
                "passed": self.passed if finished else None, "seconds": time.time() - self.started,
                "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.started)),
                "device": str(self.device), "environment": finish_environment(self.environment),
                "plan": self.plan.to_dict(),
                "estimate": self.estimate, "parts": parts,
                "checks": {"passed": sum(c["passed"] is True for p in parts.values() for c in p["checks"]),
                           "failed": sum(c["passed"] is False for p in parts.values() for c in p["checks"]),
                           "skipped": sum(c["passed"] is None for p in parts.values() for c in p["checks"])},
                "files": self.files}

    def save(self, finished: bool = False) -> None:
        """Write DIR/gpu.md and DIR/gpu.json (atomically) as things stand."""
        if self.out is None:
            return
        from aogpt.bench.gpu.report import write_report

        self.files.update(write_report(self.out, self.summary(finished=finished or self._all_done())))

    def _all_done(self) -> bool:
        return all(p.status not in ("pending", "running") for p in self.parts.values())


def _release(device: torch.device) -> None:
    """Free what a part left cached on the device, so the next part's memory checks see it free."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def environment(device: torch.device) -> dict[str, Any]:
    """The shared record (`aogpt.bench.environment`) with the CUDA device's, driver's and libraries'
    versions the figures come from."""
    from importlib import metadata

    from aogpt.bench.environment import environment as shared

    env: dict[str, Any] = {**shared(device, ["fp32", "bf16"]), "cuda": torch.version.cuda}
    for lib in ("transformers", "numpy", "scipy"):  # read from the installed metadata: nothing imported
        try:
            env[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            env[lib] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update({"gpu": torch.cuda.get_device_name(device), "gpus": torch.cuda.device_count(),
                    "capability": f"{props.major}.{props.minor}",
                    "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                    "cudnn": torch.backends.cudnn.version(), "driver": _driver()})
        try:
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - a build without NCCL
            env["nccl"] = None
    return env


def _driver() -> str | None:
    """The NVIDIA driver version (nvidia-smi; None where it is not installed)."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


__all__ = ["Run", "default_parts", "environment"]
