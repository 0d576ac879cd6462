"""`aogpt bench generate`: the paper's Figure 5 on your hardware.

One run times, at the same model size, batch and length n, the generation of a batch of sequences:

- ``aogpt``: AO-GPT with its KV cache and Lemma 4.1 (Bernoulli unmasking, the model evaluated only
  at revealed positions);
- ``aogpt-nocache``: the same sampler recomputing every decided slot at every step;
- ``encoder``: the encoder-only MDM (MDLM/SEDD style), T full bidirectional passes, skipping steps
  where nothing is revealed (MDLM's trick), the head evaluated only at revealed positions;
- ``encoder-noskip``: the same without skipping;
- ``gpt``: the left-to-right GPT with its KV cache (always n steps: one token per step);
- optional ``aogpt-count``: AO-GPT with the deterministic count schedule (every sequence of the
  batch reveals the same number of positions, so steps need no padding or attention mask).

for T in `steps`, reporting the median of `repeats` runs, ratio columns and the issue's targets.
All go through `aogpt.generate.generate`, the code users call. Random weights by default: the cost
of generation does not depend on what the weights are.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from aogpt.bench.common import (
    QUICK_SIZE,
    Size,
    Target,
    build_model,
    default_size,
    describe_environment,
    environment,
    fmt_ratio,
    fmt_seconds,
    interleaved_medians,
    markdown_table,
    write_outputs,
)
from aogpt.device import resolve_device
from aogpt.errors import AOGPTError

# method -> (variant, generate() keyword arguments)
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "aogpt": ("aogpt", dict(policy="bernoulli", use_cache=True)),
    "aogpt-count": ("aogpt", dict(policy="count", use_cache=True)),
    "aogpt-nocache": ("aogpt", dict(policy="bernoulli", use_cache=False)),
    "encoder": ("encoder-mdm", dict(policy="bernoulli", skip_noop=True)),
    "encoder-noskip": ("encoder-mdm", dict(policy="bernoulli", skip_noop=False)),
    "gpt": ("gpt", dict(policy="count", order="l2r")),
}
DEFAULT_METHODS = ("aogpt", "aogpt-nocache", "encoder", "encoder-noskip", "gpt")
DEFAULT_STEPS = (16, 32, 64, 128, 256)
QUICK = dict(n=32, batch=2, steps=(4, 8, 32), size=QUICK_SIZE, repeats=1)
# The targets (2 CPU cores, batch 8, n = 256, equal model sizes).
TARGET_ENCODER_SLOWER = 25.0
TARGET_AOGPT_VS_GPT = 1.3


def check_methods(methods: list[str] | tuple[str, ...]) -> list[str]:
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise AOGPTError(f"unknown method(s) {', '.join(bad) or '(none given)'}",
                         f"choose from: {', '.join(METHODS)}")
    return list(dict.fromkeys(methods))


def bench_generate(*, n: int = 256, batch: int = 8, steps: tuple[int, ...] | list[int] = DEFAULT_STEPS,
                   size: Size | None = None, methods: tuple[str, ...] | list[str] = DEFAULT_METHODS, repeats: int = 3,
                   long_run: float = 20.0, device: str = "cpu", seed: int = 0,
                   checkpoints: dict[str, Path] | None = None, out: Path | None = None,
                   progress: Callable[[int, str], None] | None = None) -> dict[str, Any]:
    """Time every method at every T; write DIR/generate.{md,json,png} when `out` is given.

    Every round of repeats runs each (method, T) once, so load changes hit all contenders alike.
    progress(done, label) is called after each run. Returns the summary (see `to_markdown`).
    """
    methods = check_methods(methods)
    steps = sorted(set(int(t) for t in steps))
    if n < 1 or batch < 1 or repeats < 1:
        raise AOGPTError("n, batch and repeats must be positive", "e.g. --n 256 --batch 8 --repeats 3")
    if steps[0] < 1 or steps[-1] > n:
        raise AOGPTError(f"steps {steps} must lie in 1..n = {n}", f"drop the steps above {n}, or raise --n")
    dev = resolve_device(device)
    checkpoints = checkpoints or {}
    size = default_size(checkpoints, size)
    models = {}
    for m in methods:
        variant = METHODS[m][0]
        if variant not in models:
            models[variant] = build_model(variant, size, n, dev, seed, checkpoints.get(variant))
    from aogpt.generate import generate

    def run(method: str, T: int, length: int = n) -> Callable[[], Any]:
        variant, kw = METHODS[method]
        T = length if method == "gpt" else T
        return lambda: generate(models[variant], num_samples=batch, length=length, steps=T, batch_size=batch,
                                seed=seed, **kw)

    for m in methods:  # warm-up: allocator, kernels, lazy imports; not timed
        run(m, min(4, n), length=min(n, 16))()
    last: dict[tuple[str, int], Any] = {}

    def measured(method: str, T: int) -> Callable[[], None]:
        fn = run(method, T)

        def call() -> None:
            last[(method, T)] = fn()

        return call

    calls = {(m, T): measured(m, T) for m in methods for T in ([n] if m == "gpt" else steps)}
    done = [0]

    def tick(key: tuple[str, int]) -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], f"{key[0]} T={key[1]}")

    medians, all_runs = interleaved_medians(calls, dev, repeats, long_run, tick)
    seconds: dict[str, dict[str, float]] = {m: {} for m in methods}
    runs: dict[str, dict[str, list[float]]] = {m: {} for m in methods}
    forwards: dict[str, dict[str, int]] = {m: {} for m in methods}
    for (m, T), sec in medians.items():
        seconds[m][str(T)], runs[m][str(T)] = sec, all_runs[(m, T)]
        forwards[m][str(T)] = int(last[(m, T)].timing["forwards"])
    result = {"benchmark": "generate", "n": n, "batch": batch, "steps": steps, "methods": methods,
              "size": size.to_dict(), "repeats": repeats, "long_run_s": long_run, "seed": seed,
              "checkpoints": {k: str(v) for k, v in checkpoints.items()},
              "seconds": seconds, "runs": runs, "forwards": forwards, "environment": environment(dev)}
    result["ratios"] = ratios(result)
    result["targets"] = [t.to_dict() for t in targets(result)]
    if out is not None:
        from aogpt.bench.plot import plot_generation

        result["files"] = write_outputs(out, "generate", to_markdown(result), result)
        png = plot_generation(result, Path(out) / "generate.png")
        if png is not None:
            result["files"]["png"] = str(png)
    return result


def _get(result: dict[str, Any], method: str, T: int) -> float | None:
    return result["seconds"].get(method, {}).get(str(T))


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def ratios(result: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Per T: encoder / AO-GPT, no-cache / cache, no-skip / skip; and AO-GPT at T = n / AR GPT."""
    out: dict[str, dict[str, float | None]] = {}
    for T in result["steps"]:
        out[str(T)] = {
            "encoder/aogpt": _ratio(_get(result, "encoder", T), _get(result, "aogpt", T)),
            "aogpt-nocache/aogpt": _ratio(_get(result, "aogpt-nocache", T), _get(result, "aogpt", T)),
            "encoder-noskip/encoder": _ratio(_get(result, "encoder-noskip", T), _get(result, "encoder", T)),
            "aogpt/gpt": _ratio(_get(result, "aogpt", T), _get(result, "gpt", result["n"])),
        }
    return out


def targets(result: dict[str, Any]) -> list[Target]:
    n, T = result["n"], max(result["steps"])
    note = "" if (n, result["batch"]) == (256, 8) else f"target set for n = 256, batch 8; this run n = {n}, " \
                                                       f"batch {result['batch']}"
    r = ratios(result)
    at_n = r.get(str(n), {}).get("aogpt/gpt")
    return [
        Target(f"encoder MDM at T = {T} is slower than AO-GPT at T = {T} by", r[str(T)]["encoder/aogpt"],
               TARGET_ENCODER_SLOWER, True, note),
        Target(f"AO-GPT at T = n = {n} over the AR gpt (n steps)", at_n, TARGET_AOGPT_VS_GPT, False, note),
    ]


def to_markdown(result: dict[str, Any]) -> str:
    methods = [m for m in result["methods"] if m != "gpt"]
    size, env = result["size"], result["environment"]
    columns = [(key, label) for key, label in (("encoder/aogpt", "encoder ÷ AO-GPT"),
                                               ("aogpt-nocache/aogpt", "no cache ÷ cache"),
                                               ("encoder-noskip/encoder", "no skip ÷ skip"))
               if all(m in methods for m in key.split("/"))]
    headers = ["T"] + methods + [label for _, label in columns]
    rows = [[str(T)] + [fmt_seconds(_get(result, m, T)) for m in methods]
            + [fmt_ratio(result["ratios"][str(T)][key]) for key, _ in columns] for T in result["steps"]]
    lines = [
        "# Generation speed (paper Figure 5)",
        "",
        f"Seconds to generate a batch of {result['batch']} sequences of n = {result['n']} tokens, median of "
        f"{result['repeats']} runs (runs over {result['long_run_s']:g} s are not repeated). Models of equal size: "
        f"{size['n_layer']} layers, width {size['n_embd']}, {size['n_head']} heads, vocabulary {size['vocab_size']}"
        f" ({'checkpoints: ' + ', '.join(result['checkpoints']) if result['checkpoints'] else 'random weights'}).",
        describe_environment(env),
        "",
        markdown_table(headers, rows),
    ]
    gpt = _get(result, "gpt", result["n"])
    if gpt is not None:
        line = f"AR gpt with KV cache, {result['n']} steps (one token per step): {fmt_seconds(gpt)}"
        at_n = result["ratios"].get(str(result["n"]), {}).get("aogpt/gpt")
        if at_n is not None:
            line += f"; AO-GPT at T = {result['n']} ÷ gpt: {fmt_ratio(at_n)}"
        lines += ["", line + "."]
    lines += ["", "Targets (issue 6):", *[t["line"] for t in result["targets"]]]
    return "\n".join(lines)
