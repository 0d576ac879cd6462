"""`aogpt bench eval`: how fast evaluation is, against training and per ensemble member.

One AO-GPT model (random weights, float32) and one batch of random tokens; timed side by side in one
process run, repeats interleaved, medians of wall and of CPU time:

- ``train``: one training step on the batch (forward under fresh random orders, backward, AdamW).
  It is written here, not taken from the trainer, so that model, batch and dtype are exactly the
  evaluation's (`aogpt bench train` times the trainer's full step);
- ``eval-l2r``: `aogpt.evaluation.evaluate.evaluate` of the same batch left to right (the exact NLL, inference mode);
- ``eval-random``: the same under one random order (one draw of the any-order bound);
- ``ensemble-base``: random-order evaluation of a few of the sequences;
- ``ensemble``: the same with M context-order members per conditional (`aogpt.evaluation.ensemble`; member 0
  is the base order, each other member needs one causal pass per step over that step's prefix).

Ratios come only from these medians: training time over evaluation time of the same tokens (target:
left to right >= 3x), and the cost of one extra ensemble member, (ensemble - base) / (M - 1), in
units of the base evaluation of the same sequences.
"""

from __future__ import annotations

import math
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
    interleaved_timings,
    markdown_table,
    write_outputs,
)
from aogpt.bench.environment import describe_environment, environment, finish_environment
from aogpt.device import resolve_device
from aogpt.errors import AOGPTError

VARIANT = "aogpt"
CONTENDERS = ("train", "eval-l2r", "eval-random", "ensemble-base", "ensemble")
QUICK = dict(n=32, batch=4, size=QUICK_SIZE, repeats=2, ensemble_sequences=1)
DEFAULTS = dict(n=128, batch=16, repeats=5, ensemble_sequences=2, members=4)
TARGET_EVAL_OVER_TRAIN = 3.0
LABELS = {
    "train": "training step (forward, backward, AdamW)",
    "eval-l2r": "evaluation, left to right (exact NLL)",
    "eval-random": "evaluation, one random order",
    "ensemble-base": "random order, the ensemble's sequences",
    "ensemble": "the same, ensemble of {m} members",
}


def ratios(seconds: dict[str, float], members: int) -> dict[str, float | None]:
    """Time ratios of the medians: training over evaluation (the same tokens), and one extra ensemble
    member over the base evaluation of the same sequences."""

    def div(a: float, b: float) -> float | None:
        return a / b if b > 0 else None

    return {
        "train/eval-l2r": div(seconds["train"], seconds["eval-l2r"]),
        "train/eval-random": div(seconds["train"], seconds["eval-random"]),
        "member/ensemble-base": div((seconds["ensemble"] - seconds["ensemble-base"]) / (members - 1),
                                    seconds["ensemble-base"]),
    }


def bench_eval(*, n: int = 128, batch: int = 16, size: Size | None = None, members: int = 4,
               ensemble_sequences: int = 2, repeats: int = 5, long_run: float = math.inf, device: str = "cpu",
               seed: int = 0, out: Path | None = None,
               progress: Callable[[int, str], None] | None = None) -> dict[str, Any]:
    """Time every contender (module docstring); write DIR/eval.{md,json} when `out` is given.
    progress(done, label) is called after each run. Returns the summary (see `to_markdown`)."""
    if n < 3 or batch < 1 or repeats < 1:
        raise AOGPTError("n must be at least 3, batch and repeats positive", "e.g. --n 128 --batch 16 --repeats 5")
    if members < 2:
        raise AOGPTError(f"the ensemble needs at least 2 members, got {members}", "e.g. --members 4")
    if not 1 <= ensemble_sequences <= batch:
        raise AOGPTError(f"ensemble sequences must lie in 1..batch = {batch}, got {ensemble_sequences}",
                         "use fewer ensemble sequences or a larger --batch")
    if not long_run > 0:
        raise AOGPTError(f"--long-run must be positive, got {long_run}", "e.g. --long-run 20")
    from aogpt.evaluation.evaluate import evaluate

    dev = resolve_device(device)
    env = environment(dev, "fp32")
    size = default_size({}, size)
    check_memory(size, n, batch, dev, [VARIANT], "train")
    model = build_model(VARIANT, size, n, dev, seed)
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(size.vocab_size, (batch, n), generator=g).to(dev)
    few = data[:ensemble_sequences]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, betas=(0.9, 0.95))
    last: dict[str, float] = {}

    def train_step() -> None:
        model.train()
        order = torch.rand(batch, n, generator=g).argsort(dim=1).to(dev)
        loss = model(data, order)[1].mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        last["train"] = float(loss.detach())

    def evaluation(key: str, tokens: torch.Tensor, **kw: Any) -> Callable[[], None]:
        def call() -> None:
            last[key] = evaluate(model, tokens, batch_size=batch, seed=seed, **kw).nll

        return call

    calls: dict[str, Callable[[], None]] = {
        "train": train_step,
        "eval-l2r": evaluation("eval-l2r", data, order="l2r"),
        "eval-random": evaluation("eval-random", data, order="random", num_orders=1),
        "ensemble-base": evaluation("ensemble-base", few, order="random", num_orders=1),
        "ensemble": evaluation("ensemble", few, order="random", num_orders=1, ensemble=members),
    }
    for fn in calls.values():  # warm-up: allocator, kernels, lazy imports; not timed
        fn()
    done = [0]

    def tick(key: str) -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], key)

    t = interleaved_timings(calls, dev, repeats, long_run, tick)
    tokens = {k: (ensemble_sequences if k.startswith("ensemble") else batch) * n for k in CONTENDERS}
    result: dict[str, Any] = {
        "benchmark": "eval", "variant": VARIANT, "n": n, "batch": batch, "size": size.to_dict(), "members": members,
        "ensemble_sequences": ensemble_sequences, "repeats": repeats, "long_run_s": long_run, "seed": seed,
        "dtype": "float32", "contenders": {k: LABELS[k].format(m=members) for k in CONTENDERS}, "tokens": tokens,
        "seconds": t.wall, "cpu_seconds": t.cpu, "runs": t.wall_runs, "cpu_runs": t.cpu_runs,
        "tokens_per_second": {k: tokens[k] / s for k, s in t.wall.items()},
        "ratios": ratios(t.wall, members), "cpu_ratios": ratios(t.cpu, members),
        "seconds_per_member_per_sequence": (t.wall["ensemble"] - t.wall["ensemble-base"]) / (members - 1)
        / ensemble_sequences,
        "nll_per_token": {k: v for k, v in last.items() if k != "train"}, "last_train_loss": last["train"],
        "environment": finish_environment(env),
    }
    default = (n, batch, size) == (DEFAULTS["n"], DEFAULTS["batch"], Size())
    note = "" if default else f"measured at n = {n}, batch {batch}"
    result["targets"] = [Target("evaluating text left to right runs faster than training on it, by",
                                result["ratios"]["train/eval-l2r"], TARGET_EVAL_OVER_TRAIN, True, note).to_dict()]
    if out is not None:
        result["files"] = write_outputs(out, "eval", to_markdown(result), result)
    return result


def to_markdown(result: dict[str, Any]) -> str:
    size, env, n = result["size"], result["environment"], result["n"]
    rows = [[result["contenders"][k], f"{result['tokens'][k]:,}", fmt_seconds(result["seconds"][k]),
             fmt_seconds(result["cpu_seconds"][k]), f"{result['tokens_per_second'][k]:,.0f}"] for k in CONTENDERS]
    r, c = result["ratios"], result["cpu_ratios"]
    lines = [
        "# Evaluation speed",
        "",
        f"One AO-GPT of {size['n_layer']} layers, width {size['n_embd']}, {size['n_head']} heads, vocabulary "
        f"{size['vocab_size']} (random weights, float32); a batch of {result['batch']} sequences of n = {n} tokens, "
        f"{result['ensemble_sequences']} of them for the ensemble. Median of {result['repeats']} interleaved runs, "
        "wall and CPU time (all threads). " + describe_environment(env),
        "",
        markdown_table(["what", "tokens", "wall", "CPU", "tokens / s (wall)"], rows),
        "",
        f"Training ÷ evaluation of the same tokens: left to right {fmt_ratio(r['train/eval-l2r'])} "
        f"(CPU time: {fmt_ratio(c['train/eval-l2r'])}), one random order {fmt_ratio(r['train/eval-random'])} "
        f"(CPU time: {fmt_ratio(c['train/eval-random'])}).",
        f"One extra ensemble member: {fmt_seconds(result['seconds_per_member_per_sequence'])} per sequence of "
        f"{n} tokens, {fmt_ratio(r['member/ensemble-base'])} one random-order evaluation of it "
        f"(CPU time: {fmt_ratio(c['member/ensemble-base'])}; M = {result['members']}).",
        "",
        "Target:",
        *[t["line"] for t in result["targets"]],
    ]
    return "\n".join(lines)
