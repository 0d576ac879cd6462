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
    timed,
    write_outputs,
)
from aogpt.device import resolve_device
from aogpt.errors import AOGPTError

VARIANTS = ("gpt", "sigma", "aogpt", "encoder-mdm")
QUICK = dict(block=32, batch=2, size=QUICK_SIZE, steps=2, warmup=1)
TARGET_AOGPT_VS_GPT = 1.10


def bench_train(*, block: int = 256, batch: int = 8, size: Size | None = None,
                variants: tuple[str, ...] | list[str] = VARIANTS, steps: int = 5, warmup: int = 2,
                device: str = "cpu", seed: int = 0, out: Path | None = None,
                progress: Callable[[int, str], None] | None = None) -> dict[str, Any]:
    """Median seconds per optimizer step over `steps` timed steps (after `warmup` untimed ones), the
    variants' steps interleaved."""
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise AOGPTError(f"unknown variant(s) {', '.join(bad) or '(none given)'}",
                         f"choose from: {', '.join(VARIANTS)}")
    if block < 1 or batch < 1 or steps < 1 or warmup < 0:
        raise AOGPTError("block, batch and steps must be positive", "e.g. --block 256 --batch 8 --steps 5")
    import statistics

    from aogpt.config import train_config
    from aogpt.train import RandomTokens, Trainer

    dev = resolve_device(device)
    size = default_size({}, size)
    variants = list(dict.fromkeys(variants))
    check_memory(size, block, batch, dev, variants, "train")
    trainers: dict[str, Any] = {}
    for v in variants:
        tcfg = train_config(None, v, batch_size=batch, max_steps=10 ** 9, warmup_steps=10, eval_interval=10 ** 9,
                            ckpt_interval=10 ** 9, device=str(dev), seed=seed)
        trainers[v] = Trainer(size.config(v, block), tcfg, RandomTokens(size.vocab_size), None, show_progress=False)
        for _ in range(warmup):
            trainers[v].train_step()
    sync(dev)
    # Round robin: step s of every variant runs back to back, so a change in the machine's load hits
    # all variants alike instead of whichever happened to run then.
    runs: dict[str, list[float]] = {v: [] for v in variants}
    losses: dict[str, float] = {}
    for s in range(steps):
        for v in variants:
            runs[v].append(timed(lambda v=v: losses.__setitem__(v, trainers[v].train_step().loss), dev))
        if progress is not None:
            progress(s + 1, f"step {s + 1}")
    seconds = {v: statistics.median(r) for v, r in runs.items()}
    trainers.clear()  # free the models before the caller goes on
    tokens = batch * block
    result = {"benchmark": "train", "block": block, "batch": batch, "size": size.to_dict(), "variants": variants,
              "steps": steps, "warmup": warmup, "seed": seed, "seconds_per_step": seconds, "runs": runs,
              "tokens_per_second": {v: tokens / s for v, s in seconds.items()}, "last_loss": losses,
              "environment": environment(dev)}
    gpt = seconds.get("gpt")
    result["ratio_to_gpt"] = {v: (s / gpt if gpt else None) for v, s in seconds.items()}
    default = (block, batch, size) == (256, 8, Size())
    note = "" if default else "goal set for 4 layers/256 wide/4 heads/vocab 8192, block 256, batch 8"
    result["targets"] = [Target("AO-GPT step time over gpt", result["ratio_to_gpt"].get("aogpt"),
                                TARGET_AOGPT_VS_GPT, False, note).to_dict()]
    if out is not None:
        result["files"] = write_outputs(out, "train", to_markdown(result), result)
    return result


def to_markdown(result: dict[str, Any]) -> str:
    size, env = result["size"], result["environment"]
    rows = [[v, fmt_seconds(result["seconds_per_step"][v]), f"{result['tokens_per_second'][v]:,.0f}",
             fmt_ratio(result["ratio_to_gpt"][v])] for v in result["variants"]]
    lines = [
        "# Training-step throughput",
        "",
        f"One optimizer step (forward, backward, clipping, AdamW, EMA) on batch {result['batch']} x block "
        f"{result['block']}, median of {result['steps']} steps after {result['warmup']} warm-up steps. Equal size: "
        f"{size['n_layer']} layers, width {size['n_embd']}, {size['n_head']} heads, vocabulary {size['vocab_size']}."
        " " + describe_environment(env),
        "",
        markdown_table(["variant", "s / step", "tokens / s", "÷ gpt"], rows),
        "",
        "Goals:",
        *[t["line"] for t in result["targets"]],
    ]
    return "\n".join(lines)
