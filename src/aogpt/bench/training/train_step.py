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
    fmt_ratio,
    fmt_seconds,
    markdown_table,
    sync,
    timed_cpu,
    write_outputs,
)
from aogpt.bench.environment import describe_environment, environment, finish_environment
from aogpt.device import resolve_device
from aogpt.errors import AOGPTError

VARIANTS = ("gpt", "sigma", "aogpt", "encoder-mdm")
QUICK = dict(block=32, batch=2, size=QUICK_SIZE, steps=2, warmup=1)
TARGET_AOGPT_VS_GPT = 1.10


PATHS = ("eager", "compiled", "reference")
PATH_NOTES = {
    "eager": "aogpt's kernels (attention chosen per device and precision, any-order reads laid out by target, fused "
             "norms), not compiled",
    "compiled": "the same, with the model's forward and backward compiled by torch.compile (what `aogpt train` "
                "uses for long runs)",
    "reference": "the plain path: torch's SDPA attention, slots in reading order (adaLN rows gathered per slot), "
                 "not compiled",
}


def contender(variant: str, dtype: str, several: bool, path: str = "eager") -> str:
    """A contender's key: the variant, with its precision when several are timed (``aogpt/bf16``) and its
    path when not the eager default (``aogpt/bf16/compiled``)."""
    key = f"{variant}/{dtype}" if several else variant
    return key if path == "eager" else f"{key}/{path}"


def bench_train(*, block: int = 256, batch: int = 8, size: Size | None = None,
                variants: tuple[str, ...] | list[str] = VARIANTS, steps: int = 5, warmup: int = 2,
                device: str = "cpu", seed: int = 0, dtypes: str | list[str] | tuple[str, ...] | None = None,
                preset: str | None = None, profile: bool = False, paths: tuple[str, ...] | list[str] = ("eager",),
                limit: bool = True, out: Path | None = None,
                progress: Callable[[int, str], None] | None = None) -> dict[str, Any]:
    """Median seconds per optimizer step over `steps` timed steps (after `warmup` untimed ones), every
    (variant, precision, path) contender's steps interleaved. `dtypes`: the precisions (default ``auto``);
    `paths`: ``eager`` (aogpt's kernels), ``compiled`` (the same under torch.compile; its compile time is
    reported) and ``reference`` (the plain path: SDPA, slots in reading order); `preset`: that preset's
    model and training recipe (the size's vocabulary) instead of the default recipe; `profile`: also the
    share of one step's time by operator (`aogpt.bench.training.train_profile`); `limit`: also this machine's
    matrix-product rate at the model's shapes, and each step's share at that rate
    (`aogpt.bench.limits`)."""
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise AOGPTError(f"unknown variant(s) {', '.join(bad) or '(none given)'}",
                         f"choose from: {', '.join(VARIANTS)}")
    bad = [p for p in paths if p not in PATHS]
    if bad or not paths:
        raise AOGPTError(f"unknown path(s) {', '.join(bad) or '(none given)'}", f"choose from: {', '.join(PATHS)}")
    if block < 1 or batch < 1 or steps < 1 or warmup < 0:
        raise AOGPTError("block, batch and steps must be positive", "e.g. --block 256 --batch 8 --steps 5")
    import os
    import statistics

    import torch

    from aogpt.config import get_preset, model_config, train_config
    from aogpt.model import Kernels
    from aogpt.precision import name_of, parse_list, resolve_precision
    from aogpt.train import RandomTokens, Trainer

    dev = resolve_device(device)
    size = default_size({}, size)
    variants, paths = list(dict.fromkeys(variants)), list(dict.fromkeys(paths))
    dtypes = parse_list(dtypes)
    env = environment(dev, list(dtypes))
    if preset is not None:
        get_preset(preset)  # refuse an unknown name before any work
    if "compiled" in paths:
        from aogpt import compiling

        compiling.check_compiler(dev)
    check_memory(size, block, batch, dev, variants, "train")
    several = len(dtypes) > 1
    precision = {d: resolve_precision(d, dev) for d in dtypes}
    keys = [(v, d, p) for p in paths for d in dtypes for v in variants]
    names = [contender(v, d, several, p) for v, d, p in keys]
    trainers: dict[str, Any] = {}
    compile_seconds: dict[str, float] = {}
    for (v, d, path), name in zip(keys, names, strict=True):
        tcfg = train_config(preset, v, batch_size=batch, max_steps=10 ** 9, max_minutes=0.0, warmup_steps=10,
                            eval_interval=10 ** 9, ckpt_interval=10 ** 9, device=str(dev), seed=seed, dtype=d,
                            compile="on" if path == "compiled" else "off")
        mcfg = size.config(v, block) if preset is None else model_config(
            v, preset, n_layer=size.n_layer, n_embd=size.n_embd, n_head=size.n_head, vocab_size=size.vocab_size,
            block_size=block)
        trainer = Trainer(mcfg, tcfg, RandomTokens(size.vocab_size), None, show_progress=False)
        if path == "reference":
            trainer.raw.kernels = Kernels.reference()
        if path == "compiled":
            compile_seconds[name] = trainer.warm_up()
        for _ in range(warmup):
            trainer.train_step()
        trainers[name] = trainer
    sync(dev)
    matmul: dict[str, Any] = {}
    if limit:
        from aogpt.bench.limits import counted_matmul_flops, matmul_rate, model_shapes

        shapes = model_shapes(block * batch, size.n_embd)

        def measure_rates() -> dict[str, Any]:
            return {d: matmul_rate(shapes, precision[d][0] or torch.float32, dev) for d in dtypes}

        rates = measure_rates()
        flops = {}
        for (v, _, path), name in zip(keys, names, strict=True):
            if path == "eager" and v not in flops:  # the same products on every path and in every precision
                flops[v] = counted_matmul_flops(trainers[name].train_step)
        matmul = {"rates": rates, "flops_per_step": flops}
    profiles = {}
    if profile:
        from aogpt.bench.training.train_profile import profile_step

        profiles = {name: profile_step(trainers[name].train_step) for name in names}
    # Round robin: step s of every contender runs back to back, so a change in the machine's load hits
    # all of them alike instead of whichever happened to run then.
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
    if matmul:  # measured again after the steps: the faster of the two, shape by shape (aogpt.bench.limits)
        from aogpt.bench.limits import faster_of

        after = measure_rates()
        matmul["rates"] = {d: faster_of(r, after[d]) for d, r in matmul["rates"].items()}
    seconds = {name: statistics.median(r) for name, r in runs.items()}
    cpu_seconds = {name: statistics.median(r) for name, r in cpu_runs.items()}
    trainers.clear()  # free the models before the caller goes on
    tokens = batch * block
    result = {"benchmark": "train", "block": block, "batch": batch, "size": size.to_dict(), "variants": variants,
              "dtypes": dtypes, "paths": paths, "contenders": names, "preset": preset,
              "precision": {d: {"name": name_of(p[0]), "why": p[1]} for d, p in precision.items()},
              "steps": steps, "warmup": warmup, "seed": seed, "seconds_per_step": seconds, "runs": runs,
              "cpu_seconds_per_step": cpu_seconds, "cpu_runs": cpu_runs, "compile_seconds": compile_seconds,
              "tokens_per_second": {n: tokens / s for n, s in seconds.items()}, "last_loss": losses,
              "load_average": load, "environment": finish_environment(env)}
    if profiles:
        result["profile"] = profiles
    result["ratio_to_gpt"], result["speedup_over_first"] = {}, {}
    result["cpu_ratio_to_gpt"], result["cpu_speedup_over_first"] = {}, {}
    result["speedup_over_reference"], result["matmul_share"] = {}, {}
    for v, d, path in keys:
        name, gpt_name = contender(v, d, several, path), contender("gpt", d, several, path)
        first = contender(v, dtypes[0], several, path)
        for sec, ratio, speedup in ((seconds, "ratio_to_gpt", "speedup_over_first"),
                                    (cpu_seconds, "cpu_ratio_to_gpt", "cpu_speedup_over_first")):
            result[ratio][name] = sec[name] / sec[gpt_name] if gpt_name in sec else None
            result[speedup][name] = sec[first] / sec[name]
        reference = contender(v, d, several, "reference")
        result["speedup_over_reference"][name] = seconds[reference] / seconds[name] if reference in seconds else None
        if matmul and v in matmul["flops_per_step"]:
            at_peak = matmul["flops_per_step"][v] / matmul["rates"][d]["best"]
            result["matmul_share"][name] = {"seconds_at_peak": at_peak, "share": at_peak / seconds[name]}
    result["matmul"] = matmul
    default = (block, batch, size, preset) == (256, 8, Size(), None)
    note = "" if default else "goal set for 4 layers/256 wide/4 heads/vocab 8192, block 256, batch 8"
    result["targets"] = [Target(f"AO-GPT step time over gpt ({d}{'' if p == 'eager' else ', ' + p})",
                                result["ratio_to_gpt"].get(contender("aogpt", d, several, p)),
                                TARGET_AOGPT_VS_GPT, False, note).to_dict()
                         for p in paths if p != "reference" for d in dtypes]
    if out is not None:
        result["files"] = write_outputs(out, "train", to_markdown(result), result)
    return result


def to_markdown(result: dict[str, Any]) -> str:
    size, env = result["size"], result["environment"]
    dtypes = result.get("dtypes", ["auto"])
    paths = result.get("paths", ["eager"])
    several = len(dtypes) > 1
    cpu = "cpu_seconds_per_step" in result
    shares = result.get("matmul_share") or {}
    with_reference = "reference" in paths and len(paths) > 1

    def both(table: str, n: str) -> str:
        cell = fmt_ratio(result[table][n])
        return cell + (f" / {fmt_ratio(result['cpu_' + table][n])}" if cpu and "cpu_" + table in result else "")

    rows = []
    for p in paths:
        for d in dtypes:
            for v in result["variants"]:
                n = contender(v, d, several, p)
                row = [v, result["precision"][d]["name"] + (" (auto)" if d == "auto" else ""), p,
                       fmt_seconds(result["seconds_per_step"][n])
                       + (f" / {fmt_seconds(result['cpu_seconds_per_step'][n])}" if cpu else ""),
                       f"{result['tokens_per_second'][n]:,.0f}", both("ratio_to_gpt", n),
                       both("speedup_over_first", n)]
                if with_reference:
                    row.append(fmt_ratio(result["speedup_over_reference"].get(n)))
                if shares:
                    share = shares.get(n)
                    row.append(f"{100 * share['share']:.0f}% ({fmt_seconds(share['seconds_at_peak'])})" if share
                               else "-")
                rows.append(row)
    header = ["variant", "precision", "path", "s / step (wall / CPU)", "tokens / s (wall)", "÷ gpt (wall / CPU)",
              f"speed-up over {dtypes[0]} (wall / CPU)"]
    if with_reference:
        header.append("speed-up over reference (wall)")
    if shares:
        header.append("matrix products at peak (share of the step)")
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
        "Paths: " + "; ".join(f"{p}: {PATH_NOTES[p]}" for p in paths) + ".",
        "",
        markdown_table(header, rows),
        "",
        "CPU time (all threads of this process) leaves out time spent waiting for a core: on a busy machine "
        "it is the steadier measure of the work a step does.",
    ]
    if result.get("compile_seconds"):
        lines += ["", "Compile time (once per run, cached on disk for the next): " + ", ".join(
            f"{n} {s:.0f} s" for n, s in result["compile_seconds"].items()) + "."]
    if result.get("matmul"):
        m = result["matmul"]
        rates = "; ".join(f"{r['dtype']} {r['best'] / 1e9:,.0f} GFLOP/s (" + ", ".join(
            f"{shape} {rate / 1e9:,.0f}" for shape, rate in r["rates"].items()) + ")" for r in m["rates"].values())
        flops = ", ".join(f"{v} {f / 1e9:.3g} GFLOP" for v, f in m["flops_per_step"].items())
        lines += ["", f"The machine's limit, measured in this run: matrix products at the model's shapes, "
                  f"{env['threads']} thread(s): {rates}. A step's matrix products (counted by torch's "
                  f"FlopCounterMode, forward and backward): {flops}. The last column is their time at the fastest "
                  "of these rates and its share of the step: the rest of the step is the distance to the limit."]
    lines += ["", "Goals:", *[t["line"] for t in result["targets"]]]
    if result.get("profile"):
        from aogpt.bench.training.train_profile import profile_markdown

        lines += ["", profile_markdown(result["profile"])]
    return "\n".join(lines)
