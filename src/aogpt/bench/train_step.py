"""`aogpt bench train`: training-step throughput of every variant at equal width and depth.

Times the real training step, `aogpt.train.Trainer.train_step()` (batch draw, order draw, forward,
backward, gradient clipping, AdamW, EMA), on uniform random tokens (`RandomTokens`), so the numbers
are what `aogpt train` pays per step minus data loading, validation and checkpoints. Reports the
median step time, tokens per second and the ratio to the left-to-right GPT, all measured side by
side in this run (never against figures measured elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from aogpt.bench.common import (
    QUICK_SIZE,
    Size,
    Target,
    check_memory,
    default_size,
    describe_environment,
    environment,
    fmt_ratio,
    fmt_seconds,
    markdown_table,
    sync,
    timed_cpu,
    write_outputs,
)
from aogpt.device import resolve_device
from aogpt.errors import AOGPTError

VARIANTS = ("gpt", "sigma", "aogpt", "encoder-mdm")
QUICK = dict(block=32, batch=2, size=QUICK_SIZE, steps=2, warmup=1)
TARGET_AOGPT_VS_GPT = 1.10


def parse_dtypes(spec: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """Precisions to time, e.g. ``fp32,bf16,auto`` (`aogpt.device.resolve_precision` names)."""
    names = [d.strip() for d in spec.split(",")] if isinstance(spec, str) else list(spec or ["auto"])
    allowed = ("auto", "fp32", "float32", "bf16", "bfloat16")
    bad = [d for d in names if d not in allowed]
    if bad or not names:
        raise AOGPTError(f"unknown precision(s) {', '.join(bad) or '(none given)'}",
                         f"choose from: {', '.join(allowed)}")
    return list(dict.fromkeys(names))


def contender(variant: str, dtype: str, several: bool) -> str:
    """A contender's key: the variant, with its precision when several are timed (``aogpt/bf16``)."""
    return f"{variant}/{dtype}" if several else variant


def bench_train(*, block: int = 256, batch: int = 8, size: Size | None = None,
                variants: tuple[str, ...] | list[str] = VARIANTS, steps: int = 5, warmup: int = 2,
                device: str = "cpu", seed: int = 0, dtypes: str | list[str] | tuple[str, ...] | None = None,
                preset: str | None = None, profile: bool = False, out: Path | None = None,
                progress: Callable[[int, str], None] | None = None) -> dict[str, Any]:
    """Median seconds per optimizer step over `steps` timed steps (after `warmup` untimed ones), every
    (variant, precision) contender's steps interleaved. `dtypes`: the precisions (default ``auto``);
    `preset`: that preset's model and training recipe (the size's vocabulary) instead of the default
    recipe; `profile`: also the share of one step's time by operator (`aogpt.bench.train_profile`)."""
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise AOGPTError(f"unknown variant(s) {', '.join(bad) or '(none given)'}",
                         f"choose from: {', '.join(VARIANTS)}")
    if block < 1 or batch < 1 or steps < 1 or warmup < 0:
        raise AOGPTError("block, batch and steps must be positive", "e.g. --block 256 --batch 8 --steps 5")
    import statistics

    from aogpt.config import get_preset, model_config, train_config
    from aogpt.device import PRECISION_NAMES, resolve_precision
    from aogpt.train import RandomTokens, Trainer

    dev = resolve_device(device)
    size = default_size({}, size)
    variants = list(dict.fromkeys(variants))
    dtypes = parse_dtypes(dtypes)
    if preset is not None:
        get_preset(preset)  # refuse an unknown name before any work
    check_memory(size, block, batch, dev, variants, "train")
    several = len(dtypes) > 1
    precision = {d: resolve_precision(d, dev) for d in dtypes}
    keys = [(v, d) for d in dtypes for v in variants]
    names = [contender(v, d, several) for v, d in keys]
    trainers: dict[str, Any] = {}
    for (v, d), name in zip(keys, names, strict=True):
        tcfg = train_config(preset, v, batch_size=batch, max_steps=10 ** 9, max_minutes=0.0, warmup_steps=10,
                            eval_interval=10 ** 9, ckpt_interval=10 ** 9, device=str(dev), seed=seed, dtype=d)
        mcfg = size.config(v, block) if preset is None else model_config(
            v, preset, n_layer=size.n_layer, n_embd=size.n_embd, n_head=size.n_head, vocab_size=size.vocab_size,
            block_size=block)
        trainers[name] = Trainer(mcfg, tcfg, RandomTokens(size.vocab_size), None, show_progress=False)
        for _ in range(warmup):
            trainers[name].train_step()
    sync(dev)
    profiles = {}
    if profile:
        from aogpt.bench.train_profile import profile_step

        profiles = {name: profile_step(trainers[name].train_step) for name in names}
    # Round robin: step s of every contender runs back to back, so a change in the machine's load hits
    # all of them alike instead of whichever happened to run then.
    import os

    load = [os.getloadavg()[0]] if hasattr(os, "getloadavg") else []
    runs: dict[str, list[float]] = {name: [] for name in names}
    cpu_runs: dict[str, list[float]] = {name: [] for name in names}
    losses: dict[str, float] = {}
    for s in range(steps):
        for name in names:
            wall, cpu = timed_cpu(lambda n=name: losses.__setitem__(n, trainers[n].train_step().loss), dev)
            runs[name].append(wall)
            cpu_runs[name].append(cpu)
        if progress is not None:
            progress(s + 1, f"step {s + 1}")
    if load:
        load.append(os.getloadavg()[0])
    seconds = {name: statistics.median(r) for name, r in runs.items()}
    cpu_seconds = {name: statistics.median(r) for name, r in cpu_runs.items()}
    trainers.clear()  # free the models before the caller goes on
    tokens = batch * block
    result = {"benchmark": "train", "block": block, "batch": batch, "size": size.to_dict(), "variants": variants,
              "dtypes": dtypes, "contenders": names, "preset": preset,
              "precision": {d: {"name": PRECISION_NAMES[p[0]], "why": p[1]} for d, p in precision.items()},
              "steps": steps, "warmup": warmup, "seed": seed, "seconds_per_step": seconds, "runs": runs,
              "cpu_seconds_per_step": cpu_seconds, "cpu_runs": cpu_runs,
              "tokens_per_second": {n: tokens / s for n, s in seconds.items()}, "last_loss": losses,
              "load_average": load, "environment": environment(dev)}
    if profiles:
        result["profile"] = profiles
    result["ratio_to_gpt"] = {}
    result["speedup_over_first"] = {}
    result["cpu_ratio_to_gpt"], result["cpu_speedup_over_first"] = {}, {}
    for v, d in keys:
        name, gpt_name = contender(v, d, several), contender("gpt", d, several)
        first = contender(v, dtypes[0], several)
        for sec, ratio, speedup in ((seconds, "ratio_to_gpt", "speedup_over_first"),
                                    (cpu_seconds, "cpu_ratio_to_gpt", "cpu_speedup_over_first")):
            result[ratio][name] = sec[name] / sec[gpt_name] if gpt_name in sec else None
            result[speedup][name] = sec[first] / sec[name]
    default = (block, batch, size, preset) == (256, 8, Size(), None)
    note = "" if default else "goal set for 4 layers/256 wide/4 heads/vocab 8192, block 256, batch 8"
    result["targets"] = [Target(f"AO-GPT step time over gpt ({d})",
                                result["ratio_to_gpt"].get(contender("aogpt", d, several)),
                                TARGET_AOGPT_VS_GPT, False, note).to_dict() for d in dtypes]
    if out is not None:
        result["files"] = write_outputs(out, "train", to_markdown(result), result)
    return result


def to_markdown(result: dict[str, Any]) -> str:
    size, env = result["size"], result["environment"]
    dtypes = result.get("dtypes", ["auto"])
    several = len(dtypes) > 1
    rows = []
    for d in dtypes:
        for v in result["variants"]:
            n = contender(v, d, several)
            cpu = "cpu_seconds_per_step" in result
            rows.append([v, result["precision"][d]["name"] + (" (auto)" if d == "auto" else ""),
                         fmt_seconds(result["seconds_per_step"][n])
                         + (f" / {fmt_seconds(result['cpu_seconds_per_step'][n])}" if cpu else ""),
                         f"{result['tokens_per_second'][n]:,.0f}",
                         fmt_ratio(result["ratio_to_gpt"][n])
                         + (f" / {fmt_ratio(result['cpu_ratio_to_gpt'][n])}" if cpu else ""),
                         fmt_ratio(result["speedup_over_first"][n])
                         + (f" / {fmt_ratio(result['cpu_speedup_over_first'][n])}" if cpu else "")])
    recipe = f"the {result['preset']} preset's recipe" if result.get("preset") else "the default recipe"
    load = result.get("load_average") or []
    lines = [
        "# Training-step throughput",
        "",
        f"One optimizer step (forward, backward, clipping, AdamW, EMA) on batch {result['batch']} x block "
        f"{result['block']}, median of {result['steps']} steps after {result['warmup']} warm-up steps, every "
        f"contender's steps interleaved. Equal size: {size['n_layer']} layers, width {size['n_embd']}, "
        f"{size['n_head']} heads, vocabulary {size['vocab_size']}; {recipe}. " + describe_environment(env)
        + (f" Load average {load[0]:.2f} at the start, {load[-1]:.2f} at the end." if load else ""),
        "",
        "Precisions: " + "; ".join(f"{d}: {p['why']}" for d, p in result["precision"].items()) + ".",
        "",
        markdown_table(["variant", "precision", "s / step (wall / CPU)", "tokens / s (wall)", "÷ gpt (wall / CPU)",
                        f"speed-up over {dtypes[0]} (wall / CPU)"], rows),
        "",
        "CPU time (all threads of this process) leaves out time spent waiting for a core: on a busy machine "
        "it is the steadier measure of the work a step does.",
        "",
        "Goals:",
        *[t["line"] for t in result["targets"]],
    ]
    if result.get("profile"):
        from aogpt.bench.train_profile import profile_markdown

        lines += ["", profile_markdown(result["profile"])]
    return "\n".join(lines)
