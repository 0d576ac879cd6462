"""A part of `aogpt bench gpu` run in its own process, ended when its time share is.

Most parts stop themselves: their loops watch `Context.left` and start nothing that would not fit.
Work that no loop can stop (compiling a training step takes what it takes: an assumed minute or two
that no GPU run has measured yet) runs in a child process instead, killed at the end of its share.
The child records exactly what the part would record in-process, rewriting it to a file after each
piece (`Context.save`); the parent takes whatever arrived, so a part ended at its share keeps its
finished pieces and says it was ended. The child's progress lines come through as the part's own.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from importlib import import_module
from pathlib import Path
from typing import Any

import torch

from aogpt.bench.common import Size
from aogpt.bench.gpu.parts import Check, Context, Part, PartError, PartFn, Skipped
from aogpt.bench.gpu.plan import Plan

GRACE_S = 3.0  # after its share, the child is killed at once; what it wrote by then is kept


def isolated(function: str) -> PartFn:
    """A part that runs `function` (``"module:name"``, a part function) in a child process ended at
    the part's share (module docstring)."""

    def part(ctx: Context) -> None:
        run_child(function, ctx)

    part.__name__ = f"isolated {function}"
    return part


def run_child(function: str, ctx: Context) -> None:
    """Run the part function `function` in a child process (module docstring) and record into
    `ctx.part` what it recorded; raise `Skipped` or `PartError` as it ended."""
    fd, result = tempfile.mkstemp(prefix="aogpt-gpu-part-", suffix=".json")
    os.close(fd)
    share = max(1.0, ctx.left())
    cmd = [sys.executable, "-m", "aogpt.bench.gpu.isolate", function, "--name", ctx.part.name,
           "--plan", json.dumps(dataclasses.asdict(ctx.plan)), "--device", str(ctx.device), "--seed", str(ctx.seed),
           "--share", f"{share:.1f}", "--result", result]
    src = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own group: ending it ends what it started
    lines: list[str] = []
    reader = threading.Thread(target=_forward, args=(proc, ctx, lines), daemon=True)
    reader.start()
    ended = False
    try:
        proc.wait(timeout=share + GRACE_S)
    except subprocess.TimeoutExpired:
        ended = True
        _end(proc)
    finally:
        if proc.poll() is None:
            _end(proc)
        reader.join(timeout=5)
        recorded = _read(result)
        Path(result).unlink(missing_ok=True)
    _merge(ctx.part, recorded)
    if ended:
        raise PartError(f"ended at its time share ({share:.0f} s): what it finished is kept")
    if recorded is None:
        tail = "\n".join(lines[-5:])
        said = f": {tail}" if tail else ""
        raise PartError(f"its process ended (status {proc.returncode}) without a record{said}")
    if recorded["status"] == "skipped":
        raise Skipped(recorded["error"])
    if recorded["status"] == "error":
        ctx.part.trace = recorded.get("trace")
        raise PartError(recorded["error"])


def _forward(proc: subprocess.Popen, ctx: Context, lines: list[str]) -> None:
    """The child's printed lines, as the part's progress (and the last few kept for an error)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        if line:
            lines.append(line)
            ctx.progress(line)


def _end(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def _read(path: str) -> dict[str, Any] | None:
    try:
        text = Path(path).read_text()
        return json.loads(text) if text else None
    except (OSError, json.JSONDecodeError):
        return None


def _merge(part: Part, recorded: dict[str, Any] | None) -> None:
    if recorded is None:
        return
    part.checks.extend(Check(**c) for c in recorded["checks"])
    part.metrics.update(recorded["metrics"])
    part.lines.extend(recorded["lines"])


def plan_from_dict(d: dict[str, Any]) -> Plan:
    """The `Plan` a parent serialised (`dataclasses.asdict`): sizes and tuples rebuilt."""
    fields = {f.name: f for f in dataclasses.fields(Plan)}
    out: dict[str, Any] = {}
    for name, value in d.items():
        kind = fields[name].type
        if isinstance(value, dict) and "n_layer" in value:
            value = Size(**value)
        elif isinstance(value, list) and str(kind).startswith("tuple"):
            value = tuple(value)
        out[name] = value
    return Plan(**out)


def main(argv: list[str] | None = None) -> int:
    """The child: run one part function and keep its record in a file (module docstring)."""
    p = argparse.ArgumentParser(prog="python -m aogpt.bench.gpu.isolate")
    p.add_argument("function")
    p.add_argument("--name", required=True)
    p.add_argument("--plan", required=True)
    p.add_argument("--device", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--share", type=float, required=True)
    p.add_argument("--result", required=True)
    args = p.parse_args(argv)
    module, _, name = args.function.partition(":")
    fn: PartFn = getattr(import_module(module), name)
    part = Part(args.name, args.share, status="running")

    def save() -> None:
        tmp = args.result + ".tmp"
        Path(tmp).write_text(json.dumps(part.to_dict(), default=str))
        os.replace(tmp, args.result)

    ctx = Context(plan_from_dict(json.loads(args.plan)), torch.device(args.device), args.seed, part,
                  time.monotonic() + args.share, save=save, say=lambda line: print(line, flush=True))
    try:
        fn(ctx)
        part.status = "done"
    except Skipped as exc:
        part.status, part.error = "skipped", str(exc)
    except Exception as exc:  # noqa: BLE001 - recorded for the parent, which reports it
        part.status, part.error = "error", f"{type(exc).__name__}: {exc}"
        part.trace = "".join(traceback.format_exception(exc)[-6:])
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["isolated", "main", "plan_from_dict", "run_child"]
