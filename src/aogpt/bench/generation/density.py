"""`aogpt bench density`: the cost of one exact sequence likelihood (paper appendix, "Density
Estimation Efficiency").

A decoder gets all n conditionals of an order in one causal pass (`Transformer.forward`); the
encoder-only MDM needs one pass per conditional (`aogpt.families.encoder.order_nll`: n rows of n slots,
batched). Both are timed on the same random tokens and order, at equal size, and the ratio reported.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aogpt.bench.common import (
    QUICK_SIZE,
    Size,
    Target,
    build_model,
    check_memory,
    default_size,
    fmt_ratio,
    fmt_seconds,
    interleaved_medians,
    markdown_table,
    write_outputs,
)
from aogpt.bench.environment import describe_environment, environment, finish_environment
from aogpt.device import resolve_device
from aogpt.errors import AOGPTError

VARIANTS = ("aogpt", "gpt", "encoder-mdm")
QUICK = dict(n=32, batch=1, size=QUICK_SIZE, repeats=1)
TARGET_DECODER_CHEAPER = 100.0


def bench_density(*, n: int = 256, batch: int = 1, size: Size | None = None, repeats: int = 3,
                  long_run: float = 20.0, device: str = "cpu", seed: int = 0, token_budget: int | None = None,
                  checkpoints: dict[str, Path] | None = None, out: Path | None = None,
                  progress: Callable[[int, str], None] | None = None) -> dict[str, Any]:
    """Time the exact NLL of `batch` sequences of n tokens under one random order (l2r for gpt)."""
    if n < 1 or batch < 1 or repeats < 1:
        raise AOGPTError("n, batch and repeats must be positive", "e.g. --n 256 --batch 1 --repeats 3")
    from aogpt.families.encoder import order_nll

    dev = resolve_device(device)
    env = environment(dev, "fp32")  # the models are built in fp32, no autocast
    checkpoints = checkpoints or {}
    size = default_size(checkpoints, size)
    check_memory(size, n, batch, dev, VARIANTS, "score")
    models = {v: build_model(v, size, n, dev, seed, checkpoints.get(v)) for v in VARIANTS}
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(size.vocab_size, (batch, n), generator=g).to(dev)
    order = torch.rand(batch, n, generator=g).argsort(dim=1).to(dev)
    calls = {
        "aogpt": lambda: models["aogpt"](idx, order)[1].sum(1),
        "gpt": lambda: models["gpt"](idx)[1].sum(1),
        "encoder-mdm": lambda: order_nll(models["encoder-mdm"], idx, order, token_budget=token_budget).sum(1),
    }
    done = [0]

    def tick(key: str) -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], key)

    with torch.inference_mode():
        for fn in calls.values():
            fn()  # warm-up
        seconds, runs = interleaved_medians(calls, dev, repeats, long_run, tick)
        nll = {v: float(fn().mean()) / n for v, fn in calls.items()}
    result = {"benchmark": "density", "n": n, "batch": batch, "size": size.to_dict(), "repeats": repeats,
              "long_run_s": long_run, "seed": seed, "checkpoints": {k: str(v) for k, v in checkpoints.items()},
              "seconds": seconds, "runs": runs, "nll_per_token": nll, "forwards_per_sequence":
              {"aogpt": 1, "gpt": 1, "encoder-mdm": n}, "environment": finish_environment(env)}
    result["ratios"] = {f"encoder-mdm/{v}": seconds["encoder-mdm"] / seconds[v] for v in ("aogpt", "gpt")}
    note = "" if n == 256 else f"target set for n = 256; this run n = {n}"
    result["targets"] = [Target("exact likelihood: AO-GPT (1 pass) cheaper than the encoder (n passes) by",
                                result["ratios"]["encoder-mdm/aogpt"], TARGET_DECODER_CHEAPER, True, note).to_dict()]
    if out is not None:
        result["files"] = write_outputs(out, "density", to_markdown(result), result)
    return result


def to_markdown(result: dict[str, Any]) -> str:
    size, env, n = result["size"], result["environment"], result["n"]
    labels = {"aogpt": "AO-GPT (one causal pass, random order)", "gpt": "AR gpt (one causal pass, left to right)",
              "encoder-mdm": f"encoder-only MDM ({n} passes, random order)"}
    rows = [[labels[v], fmt_seconds(result["seconds"][v]), fmt_seconds(result["seconds"][v] / result["batch"]),
             fmt_ratio(result["seconds"]["encoder-mdm"] / result["seconds"][v])] for v in VARIANTS]
    lines = [
        "# Cost of one exact sequence likelihood",
        "",
        f"Exact NLL of {result['batch']} sequence(s) of n = {n} tokens under one order, median of {result['repeats']}"
        f" runs. Models of equal size: {size['n_layer']} layers, width {size['n_embd']}, {size['n_head']} heads, "
        f"vocabulary {size['vocab_size']}. " + describe_environment(env),
        "",
        markdown_table(["model", "time", "per sequence", "encoder ÷ this"], rows),
        "",
        "Goals:",
        *[t["line"] for t in result["targets"]],
    ]
    return "\n".join(lines)
