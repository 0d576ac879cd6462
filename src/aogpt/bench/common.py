"""What every benchmark shares: equal-size models, timing with medians, tables, outputs, targets.

Benchmarks compare variants *side by side in one process run*, at the same width, depth, heads and
vocabulary, so ratios are meaningful on any machine; absolute times are not (docs/benchmarks.md).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from aogpt.config import ModelConfig, model_config
from aogpt.errors import AOGPTError
from aogpt.io import atomic_write_text, ensure_writable_dir, write_json
from aogpt.model import Transformer


@dataclass(frozen=True)
class Size:
    """The shared model size (the paper compares models of equal size)."""

    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 4
    vocab_size: int = 8192

    def config(self, variant: str, block_size: int) -> ModelConfig:
        extra = {"target_dim": min(128, self.n_embd)} if variant == "aogpt" else {}
        return model_config(variant, n_layer=self.n_layer, n_embd=self.n_embd, n_head=self.n_head,
                            vocab_size=self.vocab_size, block_size=block_size, **extra)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


DEFAULT_SIZE = Size()  # the reference configuration: 4 layers, width 256, 4 heads, vocabulary 8192
QUICK_SIZE = Size(n_layer=2, n_embd=64, n_head=2, vocab_size=256)


def parse_checkpoints(specs: list[str] | None, allowed: tuple[str, ...]) -> dict[str, Path]:
    """``VARIANT=PATH`` pairs: trained weights to time instead of random ones."""
    out: dict[str, Path] = {}
    for spec in specs or []:
        variant, sep, path = spec.partition("=")
        if not sep or variant not in allowed or not path:
            raise AOGPTError(f"bad --checkpoint {spec!r}",
                             f"write VARIANT=PATH with VARIANT one of {', '.join(allowed)}")
        out[variant] = Path(path)
    return out


def build_model(variant: str, size: Size, block_size: int, device: torch.device, seed: int,
                checkpoint: Path | None = None) -> Transformer:
    """A model of `size` for `variant`: random weights (seeded), or a checkpoint of that variant and size."""
    if checkpoint is not None:
        from aogpt.checkpoint import load

        try:
            model = load(checkpoint, device=device).model
        except AOGPTError as exc:  # timing does not depend on the weights: raw ones do when there is no EMA
            if "holds no ema weights" not in str(exc):
                raise
            model = load(checkpoint, weights="raw", device=device).model
        cfg = model.config
        if cfg.variant != variant:
            raise AOGPTError(f"checkpoint {checkpoint} holds a {cfg.variant} model, not {variant}",
                             f"pass it as {cfg.variant}=PATH")
        theirs = (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab_size)
        ours = (size.n_layer, size.n_embd, size.n_head, size.vocab_size)
        if theirs != ours:
            raise AOGPTError(f"checkpoint {checkpoint} has layers/width/heads/vocab {theirs}, the benchmark {ours}",
                             "models of unequal size make an unfair comparison: pass --layers/--width/--heads/--vocab")
        if cfg.block_size < block_size:
            raise AOGPTError(f"checkpoint {checkpoint} has a context of {cfg.block_size} < n = {block_size}",
                             f"use --n {cfg.block_size} or less")
        return model.eval()
    torch.manual_seed(seed)
    return Transformer(size.config(variant, block_size)).to(device).eval()


def check_memory(size: Size, n: int, batch: int, device: torch.device, variants: list[str] | tuple[str, ...],
                 work: str) -> None:
    """Refuse a benchmark whose models and largest piece of work cannot fit in memory (before any
    model is built): `work` is "train" (one training step), "generate" (the worst contender: T = 1
    without a cache) or "score" (one scoring forward; the encoder's n passes run one at a time)."""
    from aogpt.memory import check_fits, evaluation_bytes, generation_bytes, training_bytes, weights_bytes

    cfgs = [size.config(v, n) for v in variants]
    weights = sum(weights_bytes(c) for c in cfgs)
    if work == "train":
        per = max(training_bytes(c, batch) for c in cfgs)
    elif work == "generate":
        per = max(generation_bytes(c, batch, n, 1, batch, use_cache=False, kv_cache=False) for c in cfgs)
    else:
        per = max(evaluation_bytes(c, batch, n) for c in cfgs)
    check_fits(weights + per, device, f"the {work} benchmark", "--n (or --block), --batch or the model size "
               "(--layers, --width, --vocab)")


def default_size(checkpoints: dict[str, Path], size: Size | None) -> Size:
    """An explicit size; else the first checkpoint's; else the default size."""
    if size is not None:
        return size
    if not checkpoints:
        return DEFAULT_SIZE
    from aogpt.checkpoint import find_checkpoint, read_config

    cfg = read_config(find_checkpoint(next(iter(checkpoints.values()))))["model"]
    return Size(int(cfg["n_layer"]), int(cfg["n_embd"]), int(cfg["n_head"]), int(cfg["vocab_size"]))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cpu_seconds() -> float:
    """CPU seconds used so far by this process (all its threads) and by its finished child processes
    (e.g. tokenizer workers, counted once the pool has been joined)."""
    t = os.times()
    return time.process_time() + t.children_user + t.children_system


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Wall time of one call, with the device synchronised on both sides."""
    return timed_cpu(fn, device)[0]


def timed_cpu(fn: Callable[[], Any], device: torch.device) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one call, with the device synchronised on both sides. CPU time
    sums every thread's time and leaves out time spent waiting for a core, so other load on the
    machine inflates it much less than wall time (it includes the busy-waiting of idle threads)."""
    sync(device)
    start, cpu = time.perf_counter(), cpu_seconds()
    fn()
    sync(device)
    return time.perf_counter() - start, cpu_seconds() - cpu


@dataclass
class Timings:
    """What `interleaved_timings` measured: medians and every run, by wall and by CPU time."""

    wall: dict[Any, float]
    cpu: dict[Any, float]
    wall_runs: dict[Any, list[float]]
    cpu_runs: dict[Any, list[float]]


def interleaved_timings(calls: dict[Any, Callable[[], Any]], device: torch.device, repeats: int,
                        long_run: float = math.inf, progress: Callable[[Any], None] | None = None,
                        deadline: float | None = None, cutoff: float | None = None,
                        expected: dict[Any, float] | None = None) -> Timings:
    """Median wall and CPU seconds of every call over `repeats` rounds. Each round runs every call once,
    in order, so a change in the machine's load hits all contenders alike. A call whose first run took
    longer than `long_run` seconds is not repeated (its relative noise is already small, and the slow
    baselines would otherwise dominate the run). Past `deadline` (a `time.monotonic()` value) no further
    repeat starts: every call still runs once; past `cutoff` no run starts at all, nor one expected to
    end past it (its last run's seconds, or before its first run `expected[key]`, the caller's
    estimate), and the calls not run are left out of the result (a time-boxed part reports them as
    not timed). progress(key) is called after every run, untimed."""
    wall: dict[Any, list[float]] = {k: [] for k in calls}
    cpu: dict[Any, list[float]] = {k: [] for k in calls}
    for r in range(repeats):
        for key, fn in calls.items():
            if cutoff is not None:
                last = wall[key][-1] if wall[key] else (expected or {}).get(key, 0.0)
                if time.monotonic() + last > cutoff:
                    continue
            if r and (not wall[key] or wall[key][0] > long_run or deadline is not None and time.monotonic() > deadline):
                continue
            w, c = timed_cpu(fn, device)
            wall[key].append(w)
            cpu[key].append(c)
            if progress is not None:
                progress(key)
    ran = [k for k in calls if wall[k]]
    return Timings({k: statistics.median(wall[k]) for k in ran}, {k: statistics.median(cpu[k]) for k in ran},
                   {k: wall[k] for k in ran}, {k: cpu[k] for k in ran})


def interleaved_medians(calls: dict[Any, Callable[[], Any]], device: torch.device, repeats: int, long_run: float,
                        progress: Callable[[Any], None] | None = None
                        ) -> tuple[dict[Any, float], dict[Any, list[float]]]:
    """Median wall seconds of every call and every run's seconds: `interleaved_timings` by wall time."""
    t = interleaved_timings(calls, device, repeats, long_run, progress)
    return t.wall, t.wall_runs


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.1f}x" if r >= 10 else f"{r:.2f}x"


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass
class Target:
    """A speed goal (a ratio and the bound we aim for) and whether this run reached it."""

    name: str
    value: float | None
    bound: float
    at_least: bool  # value must be >= bound (else <=)
    note: str = ""

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.bound if self.at_least else self.value <= self.bound

    def line(self) -> str:
        rel = ">=" if self.at_least else "<="
        status = {None: "not measured", True: "reached", False: "not reached"}[self.met]
        got = "-" if self.value is None else fmt_ratio(self.value)
        note = f" ({self.note})" if self.note else ""
        return f"- {self.name}: {got} (goal {rel} {self.bound:g}x: {status}){note}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "target": self.bound,
                "relation": ">=" if self.at_least else "<=", "met": self.met, "note": self.note, "line": self.line()}


def write_outputs(out: Path | None, name: str, markdown: str, summary: dict[str, Any],
                  plot: Callable[[dict[str, Any], Path], Path | None] | None = None) -> dict[str, str]:
    """DIR/NAME.md and DIR/NAME.json (atomic), and DIR/NAME.png when a `plot` is given and matplotlib
    draws it; returns the paths written."""
    if out is None:
        return {}
    out = Path(out)
    ensure_writable_dir(out)
    atomic_write_text(out / f"{name}.md", markdown + "\n")
    write_json(out / f"{name}.json", summary)
    files = {"markdown": str(out / f"{name}.md"), "json": str(out / f"{name}.json")}
    png = plot(summary, out / f"{name}.png") if plot is not None else None
    if png is not None:
        files["png"] = str(png)
    return files


def parse_int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise AOGPTError(f"bad {what} list {text!r}", "write integers separated by commas, e.g. 16,64,256") from None
    if not values or any(v < 1 for v in values):
        raise AOGPTError(f"bad {what} list {text!r}", "give positive integers, e.g. 16,64,256")
    return sorted(set(values))
