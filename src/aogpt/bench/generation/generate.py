"""`aogpt bench generate`: the paper's Figure 5 (generation time against steps) on your hardware.

One run times, at the same model size, batch and length n, the generation of a batch of sequences
by every contender, side by side in this process, interleaved round by round (so a change in the
machine's load hits all alike), reporting medians of wall and CPU time, forward passes and slot
evaluations (real and padded):

- ``aogpt``: AO-GPT with its KV cache and Lemma 4.1 (Bernoulli unmasking; the model evaluated only
  at revealed positions; ragged steps packed);
- ``aogpt-count``: AO-GPT with the count schedule (every sequence reveals the same number per step);
- ``aogpt-nocache``: AO-GPT recomputing every decided slot at every step;
- ``encoder`` / ``encoder-noskip``: the encoder-only MDM (MDLM/SEDD style), T full bidirectional
  passes, with and without skipping steps where nothing is revealed;
- ``encoder-est``: the encoder estimated as T x one timed full pass (for long sequences, where
  running it is too slow; labelled as an estimate everywhere);
- ``gpt``: our left-to-right GPT with its KV cache (n steps, one token each);
- ``hf-gpt2``: Hugging Face `transformers` GPT-2 `generate()` with its KV cache, same size, when
  `transformers` is installed (`aogpt.bench.generation.hf_gpt2`);
- ``aogpt-reference`` / ``gpt-reference``: AO-GPT (Bernoulli) and our GPT on the reference decode path
  (``decode_path="reference"``: the model's own layers with torch's default kernels, `aogpt.inference`):
  the fast path's speed-up, side by side.

With FLOPs counted (the default), every step is also set against its roofline (`aogpt.bench.roofline`):
the run measures one thread's memory read rate (`aogpt.bench.limits.memory_bandwidth`, before and
after the timings, the faster kept) beside the matrix rate, counts each contender's bytes per step,
and reports its milliseconds per step over max(FLOPs / peak, bytes / bandwidth).

Every aogpt contender goes through `aogpt.generation.generate.generate`, the code users call. Random weights
by default: the cost of generation does not depend on what the weights are.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aogpt.bench.common import (
    QUICK_SIZE,
    Size,
    build_model,
    check_memory,
    default_size,
    interleaved_timings,
    timed_cpu,
    write_outputs,
)
from aogpt.bench.environment import environment, finish_environment
from aogpt.bench.generation import hf_gpt2
from aogpt.bench.generation.generate_report import ratios, to_markdown
from aogpt.bench.limits import counted_matmul_flops, matmul_rate, memory_bandwidth, model_shapes
from aogpt.bench.roofline import StepBytes, decoder_bytes, pass_bytes, roofline
from aogpt.device import resolve_device
from aogpt.errors import AOGPTError


@dataclass(frozen=True)
class Method:
    """A contender: which model, which generation settings, and whether it runs at every T."""

    variant: str | None  # None: the transformers GPT-2
    label: str
    settings: dict[str, Any] = field(default_factory=dict)
    every_t: bool = True  # False: one token per step, so only T = n
    skip_noop: bool = True
    estimate: bool = False  # T x one timed pass instead of a run


METHODS: dict[str, Method] = {
    "aogpt": Method("aogpt", "AO-GPT, KV cache + Lemma 4.1 (Bernoulli)", dict(policy="bernoulli")),
    "aogpt-count": Method("aogpt", "AO-GPT, KV cache, count schedule", dict(policy="count")),
    "aogpt-nocache": Method("aogpt", "AO-GPT without KV cache (Bernoulli)", dict(policy="bernoulli", use_cache=False)),
    "encoder": Method("encoder-mdm", "encoder-only MDM (no-op steps skipped)", dict(policy="bernoulli")),
    "encoder-noskip": Method("encoder-mdm", "encoder-only MDM (no skipping)", dict(policy="bernoulli"),
                             skip_noop=False),
    "encoder-est": Method("encoder-mdm", "encoder-only MDM, estimated: T x one timed pass", estimate=True),
    "gpt": Method("gpt", "our GPT, KV cache (n steps)", dict(policy="count", order="l2r"), every_t=False),
    "hf-gpt2": Method(None, "transformers GPT-2 generate(), KV cache (n steps)", every_t=False),
    "aogpt-reference": Method("aogpt", "AO-GPT, Bernoulli, on the reference decode path",
                              dict(policy="bernoulli", decode_path="reference")),
    "gpt-reference": Method("gpt", "our GPT on the reference decode path (n steps)",
                            dict(policy="count", order="l2r", decode_path="reference"), every_t=False),
}
REFERENCE = {"aogpt-reference": "aogpt", "gpt-reference": "gpt"}  # the reference decode path -> the fast one
DEFAULT_METHODS = ("aogpt", "aogpt-count", "aogpt-nocache", "encoder", "encoder-noskip", "gpt", "hf-gpt2")
DEFAULT_STEPS = (16, 32, 64, 128, 256)
QUICK = dict(n=32, batch=2, steps=(4, 8, 32), size=QUICK_SIZE, repeats=1, memory_buffer=64 * 2 ** 20)


def check_methods(methods: list[str] | tuple[str, ...]) -> list[str]:
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise AOGPTError(f"unknown method(s) {', '.join(bad) or '(none given)'}",
                         f"choose from: {', '.join(METHODS)}")
    return list(dict.fromkeys(methods))


def _cache_dtype(model: Any, settings: dict[str, Any]) -> torch.dtype:
    """The dtype the contender's KV cache keeps keys in (the fast path measures it)."""
    from aogpt.generation.generate import decode_path
    from aogpt.generation.settings import settings_from
    from aogpt.inference import for_inference
    from aogpt.kv_cache import storage_dtype

    p = next(model.parameters())
    runner = for_inference(model, path=decode_path(settings_from(None, **settings)))
    return runner.kernels.cache_store or storage_dtype(p.device, p.dtype)


def _step_bytes(method: str, model: Any, result: Any, n: int, batch: int, T: int) -> StepBytes:
    """What one forward of `method` reads and writes (`aogpt.bench.roofline`); `model` is ours (for
    transformers' GPT-2: our GPT of the same size), `result` its run's `GenerationResult` (None:
    transformers, or the estimated encoder)."""
    spec = METHODS[method]
    if spec.variant is not None and spec.variant.startswith("encoder") or spec.settings.get("use_cache") is False:
        forwards = T if result is None else max(int(result.timing["forwards"]), 1)
        head = batch * n / forwards  # every position is drawn once over the run
        rows = batch * n if result is None or spec.variant.startswith("encoder") else \
            result.timing["slot_evaluations"] / forwards
        return pass_bytes(model, int(rows), int(round(head)))
    if result is None:  # transformers GPT-2: one token per step, as our GPT
        counts = np.ones((batch, n), dtype=np.int64)
        return decoder_bytes(model, next(model.parameters()).dtype, counts, n, batch * n, batch * n)
    t = result.timing
    return decoder_bytes(model, _cache_dtype(model, spec.settings), result.step_counts.numpy(), int(t["forwards"]),
                         int(t["slot_evaluations"]), batch * n)


def _encoder_pass(model: Any, n: int, batch: int, T: int, seed: int) -> Callable[[], Any]:
    """One full bidirectional pass over (batch, n), half the positions masked, the head at the
    ceil(n / T) positions a step reveals: the encoder's cost per step."""
    g = torch.Generator().manual_seed(seed)
    dev = next(model.parameters()).device
    tokens = torch.randint(model.config.vocab_size, (batch, n), generator=g).to(dev)
    tokens[:, ::2] = -1
    pos = torch.arange(1, n + 1, device=dev).expand(batch, n)
    select = torch.arange(math.ceil(n / T), device=dev).expand(batch, -1)

    def call() -> Any:
        with torch.inference_mode():
            return model.forward_slots(tokens, pos, select=select)

    return call


def _estimate_slow_encoder(keys: list[tuple[str, int, str]], one_pass: Callable[[int, str], Callable[[], Any]],
                           dev: torch.device, limit: float) -> tuple[list[tuple[str, int, str]], dict[str, list[int]]]:
    """The timing keys with ``encoder`` replaced by ``encoder-est`` wherever T x one timed pass (the
    run's cost without skipping) exceeds `limit` seconds; and the T values so replaced."""
    out, estimated, seconds = [], [], {}
    for m, T, d in keys:
        if m == "encoder":
            if d not in seconds:
                seconds[d] = min(timed_cpu(one_pass(T, d), dev)[0] for _ in range(2))
            if T * seconds[d] > limit:
                m = "encoder-est"
                estimated.append(T)
        if (m, T, d) not in out:
            out.append((m, T, d))
    return out, ({"encoder": sorted(set(estimated))} if estimated else {})


def _flops(T: int, forwards: int | None, run: Callable[[], Any], one_pass: Callable[[], Any],
           encoder: bool) -> float:
    """The matrix-product FLOPs of one run: counted in an untimed run, or for the encoder its forwards
    x one pass's count (every pass has the same shape; only the head's few rows differ)."""
    if encoder:
        return counted_matmul_flops(one_pass()) * (forwards or T)
    return counted_matmul_flops(run)


def bench_generate(*, n: int = 256, batch: int = 8, steps: tuple[int, ...] | list[int] = DEFAULT_STEPS,
                   size: Size | None = None, methods: tuple[str, ...] | list[str] = DEFAULT_METHODS, repeats: int = 3,
                   long_run: float = 20.0, device: str = "cpu", seed: int = 0, top_p: float = 1.0,
                   temperature: float = 1.0, checkpoints: dict[str, Path] | None = None,
                   dtypes: str | list[str] | tuple[str, ...] | None = None, out: Path | None = None,
                   progress: Callable[[int, str], None] | None = None, encoder_limit: float | None = None,
                   count_flops: bool = True, deadline: float | None = None, cutoff: float | None = None,
                   memory_buffer: int | None = None, expected: dict[tuple[str, int], float] | None = None
                   ) -> dict[str, Any]:
    """Time every method at every T; write DIR/generate.{md,json,png} when `out` is given.

    encoder_limit: run the encoder only at the T where T x one timed full pass stays under this many
    seconds; elsewhere it is estimated (``encoder-est``, labelled so; None: always run). count_flops:
    count every contender's matrix-product FLOPs in one extra untimed run (the encoder's as its
    passes x one pass's) and report the model FLOPs utilisation against this machine's measured
    matmul rate (`aogpt.bench.limits`), and set every step against its roofline (`aogpt.bench.roofline`),
    with the memory read rate of a buffer of `memory_buffer` bytes (default: beyond the last-level cache).
    deadline: a `time.monotonic()` value past which no further repeat starts (every measurement still
    runs once); cutoff: one past which no run starts at all, nor one expected to end past it (its last
    run's time, or before its first `expected[(method, T)]`, the caller's estimate of a run's seconds;
    a time-boxed caller: the measurements not run are absent from the result).

    dtypes: the precisions the models' weights are in (``fp32``, ``bf16``, ``auto``; default auto:
    bf16 where the hardware has bf16 units). With several, every (method, T, precision) is timed in
    the same interleaved rounds: the result holds one report per precision (``by_dtype``) and the
    ratios between them (``dtype_ratios``, each precision's time over the first's).
    progress(done, label) is called after each run. Returns the summary (see `to_markdown`).
    """
    from aogpt.precision import name_of, parse_list, resolve_precision

    methods = check_methods(methods)
    steps = sorted(set(int(t) for t in steps))
    dtypes = parse_list(dtypes)
    if n < 1 or batch < 1 or repeats < 1:
        raise AOGPTError("n, batch and repeats must be positive", "e.g. --n 256 --batch 8 --repeats 3")
    if steps[0] < 1 or steps[-1] > n:
        raise AOGPTError(f"steps {steps} must lie in 1..n = {n}", f"drop the steps above {n}, or raise --n")
    if not 0.0 < top_p <= 1.0 or not temperature > 0.0 or not math.isfinite(temperature):
        raise AOGPTError(f"top-p {top_p} / temperature {temperature} out of range",
                         "use top-p in (0, 1], temperature > 0")
    dev = resolve_device(device)
    env = environment(dev, list(dtypes))
    checkpoints = checkpoints or {}
    size = default_size(checkpoints, size)
    check_memory(size, n, batch, dev, sorted({METHODS[m].variant or "gpt" for m in methods}), "generate")
    skipped: dict[str, str] = {}
    if "hf-gpt2" in methods and not hf_gpt2.available():
        skipped["hf-gpt2"] = "transformers is not installed (pip install transformers)"
        methods = [m for m in methods if m != "hf-gpt2"]
    precision = {d: resolve_precision(d, dev) for d in dtypes}
    weights = {d: p[0] or torch.float32 for d, p in precision.items()}
    models: dict[tuple[str, str], Any] = {}
    for d in dtypes:
        for m in methods:
            variant = METHODS[m].variant
            key = (variant or m, d)
            if key not in models:
                models[key] = (hf_gpt2.build(size, n, dev, seed) if variant is None
                               else build_model(variant, size, n, dev, seed, checkpoints.get(variant)))
                models[key] = models[key].to(weights[d])
    from aogpt.generation.generate import generate

    last: dict[tuple[str, int, str], Any] = {}

    def call(method: str, T: int, d: str, length: int = n) -> Callable[[], None]:
        spec = METHODS[method]
        if spec.variant is None:
            return hf_gpt2.generate_call(models[(method, d)], length, batch, seed, top_p, temperature)
        model = models[(spec.variant, d)]
        if spec.estimate:
            return _encoder_pass(model, length, batch, T, seed)

        def run() -> None:
            last[(method, T, d)] = generate(model, num_samples=batch, length=length,
                                            steps=length if not spec.every_t else T, batch_size=batch, seed=seed,
                                            top_p=top_p, temperature=temperature, skip_noop=spec.skip_noop,
                                            **spec.settings)

        return run

    for d in dtypes:
        for m in methods:  # warm-up: allocator, kernels, lazy imports; not timed
            timed_cpu(call(m, min(4, n), d, length=min(n, 16)), dev)
    bandwidth = memory_bandwidth(largest=memory_buffer) if count_flops and dev.type == "cpu" else None
    keys = [(m, T, d) for d in dtypes for m in methods for T in (steps if METHODS[m].every_t else [n])]
    estimated: dict[str, list[int]] = {}
    if encoder_limit is not None and "encoder" in methods:
        keys, estimated = _estimate_slow_encoder(keys, lambda T, d: call("encoder-est", T, d), dev, encoder_limit)
        methods += ["encoder-est"] if estimated and "encoder-est" not in methods else []
    calls = {key: call(*key) for key in keys}
    done = [0]

    def tick(key: tuple[str, int, str]) -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], f"{key[0]} T={key[1]}" + (f" {key[2]}" if len(dtypes) > 1 else ""))

    guess = {(m, T, d): (expected or {}).get(("encoder", T), 0.0) / T if m == "encoder-est"
             else (expected or {}).get((m, T), 0.0) for m, T, d in keys}  # an estimate's run is one pass
    timings = interleaved_timings(calls, dev, repeats, long_run, tick, deadline, cutoff, guess)
    if bandwidth is not None:  # measured again after the timings: a busy moment during one does not lower it
        again = memory_bandwidth(largest=memory_buffer)
        faster = {k: max(v, again["by_bytes"][k]) for k, v in bandwidth["by_bytes"].items()}
        bandwidth = {**bandwidth, "by_bytes": faster, "memory": max(bandwidth["memory"], again["memory"])}
    base = {"benchmark": "generate", "n": n, "batch": batch, "steps": steps, "methods": methods, "skipped": skipped,
            "labels": {m: METHODS[m].label for m in methods}, "size": size.to_dict(), "repeats": repeats,
            "long_run_s": long_run, "seed": seed, "top_p": top_p, "temperature": temperature,
            "checkpoints": {k: str(v) for k, v in checkpoints.items()}, "environment": finish_environment(env),
            "encoder_estimated": estimated, "encoder_limit_s": encoder_limit, "memory_bandwidth": bandwidth}
    by_dtype: dict[str, Any] = {}
    counted: dict[tuple[str, int], float] = {}
    for d in dtypes:
        r: dict[str, Any] = {**base, "dtype": d, "precision": name_of(precision[d][0]),
                             "precision_why": precision[d][1].replace(" autocast", " weights"),
                             **{k: {m: {} for m in methods} for k in ("seconds", "cpu_seconds", "runs", "forwards",
                                                                       "slots", "padded_slots", "ms_per_step",
                                                                       "cpu_ms_per_step", "flops", "mfu",
                                                                       "roofline")}}
        if count_flops:
            r["matmul_rate"] = matmul_rate(model_shapes(batch, size.n_embd) + model_shapes(batch * n, size.n_embd),
                                           weights[d], dev, repeats=3)
        for (m, T, dd), sec in timings.wall.items():
            if dd != d:
                continue
            factor = T if METHODS[m].estimate else 1
            r["seconds"][m][str(T)] = sec * factor
            r["cpu_seconds"][m][str(T)] = timings.cpu[(m, T, d)] * factor
            r["runs"][m][str(T)] = [w * factor for w in timings.wall_runs[(m, T, d)]]
            forwards = T if METHODS[m].estimate else None
            if (m, T, d) in last:
                t = last[(m, T, d)].timing
                forwards = r["forwards"][m][str(T)] = int(t["forwards"])
                r["slots"][m][str(T)] = int(t["slot_evaluations"])
                r["padded_slots"][m][str(T)] = int(t["padded_slots"])
            elif METHODS[m].variant is None:
                forwards = n
            if forwards:
                r["ms_per_step"][m][str(T)] = sec * factor / forwards * 1e3
                r["cpu_ms_per_step"][m][str(T)] = timings.cpu[(m, T, d)] * factor / forwards * 1e3
            if count_flops:  # the same in every precision: counted once
                if (m, T) not in counted:
                    counted[(m, T)] = _flops(T, forwards, calls[(m, T, d)], lambda T=T, d=d: call("encoder-est", T, d),
                                             METHODS[m].variant == "encoder-mdm")
                flops = r["flops"][m][str(T)] = counted[(m, T)]
                r["mfu"][m][str(T)] = flops / (sec * factor) / r["matmul_rate"]["best"]
                if bandwidth is not None and forwards:
                    ours = models[(METHODS[m].variant or "gpt", d)] if (METHODS[m].variant or "gpt", d) in models \
                        else build_model("gpt", size, n, dev, seed).to(weights[d])
                    nbytes = _step_bytes(m, ours, last.get((m, T, d)), n, batch, T)
                    line = roofline(nbytes, flops / forwards, r["matmul_rate"]["best"], bandwidth)
                    step_s = {"wall": sec * factor / forwards, "cpu": timings.cpu[(m, T, d)] * factor / forwards}
                    line["over_memory"] = {k: v / line["memory_s"] for k, v in step_s.items()}  # the step ÷ its limit
                    r["roofline"][m][str(T)] = line
        r["ratios"] = ratios(r, "seconds")
        r["cpu_ratios"] = ratios(r, "cpu_seconds")
        by_dtype[d] = r
    result = by_dtype[dtypes[0]] if len(dtypes) == 1 else {
        **base, "dtypes": dtypes, "by_dtype": by_dtype,
        # a step count timed in one precision and estimated past the time limit in another has a
        # figure in each, but one measured only in one of them (the encoder's run) has no ratio
        "dtype_ratios": {d: {m: {T: by_dtype[d]["seconds"][m][T] / by_dtype[dtypes[0]]["seconds"][m][T]
                                 for T in by_dtype[d]["seconds"][m] if T in by_dtype[dtypes[0]]["seconds"][m]}
                             for m in methods} for d in dtypes}}
    if out is not None:
        from aogpt.bench.plot import plot_generation

        main = by_dtype[dtypes[-1]]  # the plot shows the last precision asked for
        result["files"] = write_outputs(out, "generate", to_markdown(result), result,
                                        plot=lambda res, path: plot_generation(main, path))
    return result


def resolve_steps(specs: list[str] | tuple[str, ...], n: int) -> list[int]:
    """Generation steps for length `n` from specs: an integer, ``n``, or ``n/K`` (n divided by K,
    rounded down, at least 1), so one list serves several lengths."""
    out = []
    for spec in specs:
        text = str(spec).strip().replace(" ", "")
        try:
            value = n if text == "n" else max(1, n // int(text[2:])) if text.startswith("n/") else int(text)
            if value < 1 or text.startswith("n/") and int(text[2:]) < 1:
                raise ValueError
        except (ValueError, ZeroDivisionError):
            raise AOGPTError(f"bad steps list entry {spec!r}",
                             "give positive integers, n or n/K separated by commas, e.g. 16,64 or n,n/8") from None
        out.append(value)
    return sorted(set(out))


def bench_lengths(lengths: list[int], steps: list[str] | tuple[str, ...], out: Path | None = None,
                  **kwargs: Any) -> dict[str, Any]:
    """`bench_generate` at every length (each its own interleaved rounds; `steps` as `resolve_steps`
    specs); one report with a summary across lengths first (``by_n``). One length: its own report."""
    if len(lengths) == 1:
        return bench_generate(n=lengths[0], steps=resolve_steps(steps, lengths[0]), out=out, **kwargs)
    progress, done = kwargs.pop("progress", None), [0]
    by_n = {}
    for n in lengths:
        def tick(k: int, label: str, base: int = done[0], n: int = n) -> None:
            done[0] = base + k
            if progress is not None:
                progress(base + k, f"n={n} {label}")

        by_n[str(n)] = bench_generate(n=n, steps=resolve_steps(steps, n), progress=tick, **kwargs)
    result: dict[str, Any] = {"benchmark": "generate", "lengths": list(lengths), "by_n": by_n}
    if out is not None:
        from aogpt.bench.plot import plot_generation

        last = by_n[str(lengths[-1])]
        main = last["by_dtype"][last["dtypes"][-1]] if "by_dtype" in last else last
        result["files"] = write_outputs(out, "generate", to_markdown(result), result,
                                        plot=lambda res, path: plot_generation(main, path))
    return result
