"""Where a benchmark's numbers come from, recorded the same way in every report.

A timing means little without the machine behind it: the CPU and its class (`aogpt.capability`: an
AVX2-only CPU and one with AMX take different paths, and the lesser-CPU switch makes one behave as the
other), the precision the contenders computed in, torch's threads and version, and how busy the
machine was before and after (on a shared machine the load moves the figures more than most changes
do). `environment` records it when a benchmark starts, `finish_environment` adds the load when it
ends; every report's JSON carries the result under the key "environment" and its markdown says it in
the one line of `describe_environment`. `aogpt bench gpu` adds the CUDA device's fields.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from typing import Any

import torch

from aogpt import capability


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the system has none)."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def environment(device: torch.device | str, precision: str | Sequence[str] | None) -> dict[str, Any]:
    """The record at a benchmark's start. `precision`: the short name(s) of `aogpt.precision` the
    contenders compute in (``auto`` is recorded with what it means on `device`), or None where no model
    computes (tokenization)."""
    from aogpt.precision import auto_precision

    device = torch.device(device)
    names = [precision] if isinstance(precision, str) else list(precision) if precision is not None else None
    cpu = capability.cpu()
    env: dict[str, Any] = {
        "device": str(device), "cpu": cpu.name, "cpu_class": cpu.cpu_class,
        "cpu_native_class": cpu.native_class, "torch_kernels": torch.backends.cpu.get_cpu_capability(),
        "precision": names, "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "torch": torch.__version__,
        "python": platform.python_version(), "machine": platform.machine(), "load_average": load_average(),
    }
    if names is not None and "auto" in names:
        env["auto_precision"] = auto_precision(device)[1]
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def finish_environment(env: dict[str, Any]) -> dict[str, Any]:
    """`env` with the load average at the end of the run (the figures were taken between the two)."""
    return {**env, "load_average_after": load_average()}


def describe_environment(env: dict[str, Any]) -> str:
    """One line for a markdown report, with a warning when the machine was busier than it has CPUs:
    torch's threads then wait on each other and timings swing by an order of magnitude."""
    cls = env.get("cpu_class")
    if cls and env.get("cpu_native_class") not in (None, cls):
        cls = f"{cls} (AOGPT_CPU on an {env['cpu_native_class']} CPU)"
    line = f"Device {env['device']}"
    if env.get("gpu"):
        line += f" ({env['gpu']})"
    if cls:
        line += f", CPU class {cls}" + (f" ({env['cpu']})" if env.get("cpu") else "")
    if env.get("precision"):
        line += ", precision " + ", ".join(env["precision"])
        if env.get("auto_precision"):
            line += f" ({env['auto_precision']})"
    line += f", {env['threads']} threads, torch {env['torch']}"
    load, after = env.get("load_average"), env.get("load_average_after")
    if load is not None:
        line += f", load average {load}" + (f" before, {after} after" if after is not None else "")
    line += "."
    busiest = max((x[0] for x in (load, after) if x is not None), default=None)
    if busiest is not None and env.get("cpus") and env["device"] == "cpu" and busiest > env["cpus"]:
        line += f" **Warning: the machine was busy (load {busiest} on {env['cpus']} CPUs); timings are unreliable."
        if env.get("threads", 1) > 1:
            line += " On a shared machine `--threads 1` avoids thread over-subscription."
        line += "**"
    return line

