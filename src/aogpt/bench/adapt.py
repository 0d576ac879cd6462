"""`aogpt bench adapt`: does adapting a trained left-to-right GPT beat training AO-GPT from scratch
at the same compute?

Per seed, on Shakespeare (bpe:512), with the quickstart model size and recipe:

1. **gpt**: our left-to-right GPT trained for a CPU budget B;
2. **adapted**: its EMA weights adapted to AO-GPT (`aogpt.adaptation.adapt`, equal to the GPT left to
   right at step 0) and fine-tuned for another B, its orders going from left to right through a
   Mallows ramp to AO-GPT's mixture (`aogpt.config.any_order_start`), with the quickstart's rates;
   **adapted-frozen**: the same, its backbone frozen for the first third of the steps (only the
   target pathway learns) and a lower peak rate (`FROZEN`), so the GPT's skills are disturbed less;
3. **scratch**: AO-GPT trained from scratch for 2B with the same order schedule fitted to its steps.

Budgets are CPU time at a fixed thread count (process time, so waiting for a core on a shared
machine does not count): a short probe measures each model's CPU seconds per step and it trains as
many steps as its budget buys (`aogpt.bench.recipe`). A GPT step costs less than an AO-GPT step, so
phase 1 + 2 spend at most what phase 3 spends. Everything is scored on the held-out plays in bits
per byte, left to right and under one random order, with the EMA weights; along the way every
`curve_every` steps, for the PNG.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aogpt.bench.common import cpu_seconds, describe_environment, environment, markdown_table, write_outputs
from aogpt.bench.recipe import data_for, eval_windows
from aogpt.config import any_order_start, model_config, train_config

TOKENIZER = "bpe:512"
PRESET = "quickstart"
ORDER = "mixture"
EVAL_BATCH = 16
PROBE_STEPS = (2, 4)
FROZEN = dict(lr=1e-3, min_lr=1e-4)  # adapted-frozen: these rates, the backbone frozen for a third of the steps
ADAPTED = ("adapted", "adapted-frozen")


def _train_cfg(variant: str, steps: int, seed: int, **fields: Any) -> Any:
    base = dict(max_steps=steps, max_minutes=0.0, seed=seed, eval_interval=10**9, ckpt_interval=10**9,
                curriculum="", log_interval=10**6)
    if variant != "gpt":
        base.update(order=ORDER, **any_order_start(ORDER, steps))
    return train_config(PRESET, variant, **{**base, **fields})


def _trainer(model_cfg: Any, train_cfg: Any, data: Any) -> Any:
    from aogpt.train import Trainer

    return Trainer(model_cfg, train_cfg, data, None, show_progress=False)


def _probe(model_cfg: Any, data: Any, seed: int) -> float:
    """CPU seconds of one training step of this model (after warm-up steps)."""
    trainer = _trainer(model_cfg, _train_cfg(model_cfg.variant, 10**6, seed), data)
    warm, timed = PROBE_STEPS
    for _ in range(warm):
        trainer.train_step()
    start = cpu_seconds()
    for _ in range(timed):
        trainer.train_step()
    return (cpu_seconds() - start) / timed


def _score(model: torch.nn.Module, windows: torch.Tensor, lengths: Any, seed: int, any_order: bool) -> dict[str, float]:
    from aogpt.evaluation.evaluate import evaluate

    out = {"l2r": evaluate(model, windows, order="l2r", batch_size=EVAL_BATCH, byte_lengths=lengths).bpb}
    if any_order:
        out["any"] = evaluate(model, windows, order="random", num_orders=1, batch_size=EVAL_BATCH, seed=seed,
                              byte_lengths=lengths).bpb
    return out


def _train(trainer: Any, steps: int, windows: torch.Tensor, lengths: Any, seed: int, curve_every: int,
           cpu_offset: float, label: str, progress: Callable[[str], None] | None) -> tuple[list[dict[str, Any]], float]:
    """Train `steps` steps; the curve (CPU seconds since the start of the whole path, scores) and the CPU time."""
    curve, cpu = [], 0.0
    for step in range(steps):
        start = cpu_seconds()
        loss = trainer.train_step().loss
        cpu += cpu_seconds() - start
        if (curve_every and (step + 1) % curve_every == 0) or step + 1 == steps:
            point = _score(trainer.ema.model, windows, lengths, seed, trainer.family.any_order)
            curve.append({"step": step + 1, "cpu": cpu_offset + cpu, **point})
            if progress is not None:
                progress(f"{label} (seed {seed}): step {step + 1}/{steps}, loss {loss:.3f}, "
                         + ", ".join(f"{k} {v:.3f}" for k, v in point.items()) + " bits/byte")
    return curve, cpu


def run_seed(data_root: Path, seed: int, budget: float, *, eval_bytes: int | None = 100_000, curve_every: int = 50,
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The three paths of one seed (module docstring)."""
    from aogpt.adaptation import adapt
    from aogpt.checkpoint import save

    data = data_for(TOKENIZER, data_root)
    lengths = data.token_byte_lengths()
    gpt_cfg = model_config("gpt", preset=PRESET, vocab_size=data.padded_vocab_size)
    scratch_cfg = model_config("aogpt", preset=PRESET, vocab_size=data.padded_vocab_size)
    windows = eval_windows(data, gpt_cfg.block_size, eval_bytes)
    row: dict[str, Any] = {"seed": seed, "budget": budget}
    started = time.perf_counter()

    steps = max(1, int(budget / _probe(gpt_cfg, data, seed)))
    gpt = _trainer(gpt_cfg, _train_cfg("gpt", steps, seed), data)
    curve, cpu = _train(gpt, steps, windows, lengths, seed, curve_every, 0.0, "gpt", progress)
    row["gpt"] = {"steps": steps, "cpu_seconds": cpu, "curve": curve, **curve[-1]}
    with tempfile.TemporaryDirectory(prefix="aogpt-bench-adapt-") as tmp:
        save(gpt.raw, Path(tmp) / "gpt", tokenizer=data.tokenizer, ema=gpt.ema.model, step=steps)
        adapted = adapt(Path(tmp) / "gpt", "aogpt", Path(tmp) / "adapted", seed=seed)
        start_scores = _score(adapted.model, windows, lengths, seed, True)
        row["adapted_start"] = start_scores
        steps_a = max(1, int(budget / _probe(adapted.config, data, seed)))
        for name in ADAPTED:
            extra = {**FROZEN, "freeze_backbone_steps": steps_a // 3} if name == "adapted-frozen" else {}
            cfg = _train_cfg("aogpt", steps_a, seed, init_from=str(Path(tmp) / "adapted"), **extra)
            curve_a, cpu_a = _train(_trainer(adapted.config, cfg, data), steps_a, windows, lengths, seed, curve_every,
                                    cpu, name, progress)
            row[name] = {"steps": steps_a, "cpu_seconds": cpu_a, **curve_a[-1],
                         "curve": [{"step": 0, "cpu": cpu, **start_scores}, *curve_a]}
    steps_s = max(1, int(2 * budget / _probe(scratch_cfg, data, seed)))
    scratch = _trainer(scratch_cfg, _train_cfg("aogpt", steps_s, seed), data)
    curve_s, cpu_s = _train(scratch, steps_s, windows, lengths, seed, curve_every, 0.0, "scratch", progress)
    row["scratch"] = {"steps": steps_s, "cpu_seconds": cpu_s, "curve": curve_s, **curve_s[-1]}
    row["wall_seconds"] = time.perf_counter() - started
    row["load_average"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return row


def run(data_root: Path, *, budget: float = 120.0, seeds: int = 3, seed: int = 0, eval_bytes: int | None = 100_000,
        curve_every: int = 50, out: Path | None = None,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every seed in turn; the table and plot are rewritten after each, so an interrupted run keeps them."""
    result: dict[str, Any] = {"benchmark": "adapt", "budget": budget, "seeds": seeds, "eval_bytes": eval_bytes,
                              "threads": torch.get_num_threads(), "tokenizer": TOKENIZER, "preset": PRESET,
                              "rows": []}
    for s in range(seed, seed + seeds):
        result["rows"].append(run_seed(data_root, s, budget, eval_bytes=eval_bytes, curve_every=curve_every,
                                       progress=progress))
        result["environment"] = environment(torch.device("cpu"))
        result["summary"] = summary(result)
        if out is not None:
            result["files"] = write_outputs(out, "adapt", to_markdown(result), result, plot=plot)
    return result


def _estimate(values: list[float]) -> dict[str, float]:
    from aogpt.stats import Measurement, mean_interval

    est = mean_interval(Measurement.of(values, "seeds"))
    return {"mean": est.value, "low": est.low, "high": est.high, "n": len(values)}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Means and 95% intervals over seeds, and the paired differences adapted - scratch."""
    rows = result["rows"]
    out: dict[str, Any] = {}
    for path, key in (("gpt", "l2r"), ("adapted_start", "l2r"), ("adapted_start", "any"), ("scratch", "l2r"),
                      ("scratch", "any"), *((a, k) for a in ADAPTED for k in ("l2r", "any"))):
        out[f"{path}/{key}"] = _estimate([r[path][key] for r in rows])
    for a in ADAPTED:
        for key in ("l2r", "any"):
            out[f"{a}-scratch/{key}"] = _estimate([r[a][key] - r["scratch"][key] for r in rows])
        out[f"{a}-gpt/l2r"] = _estimate([r[a]["l2r"] - r["gpt"]["l2r"] for r in rows])
    return out


def _fmt(e: dict[str, float]) -> str:
    if e["n"] < 2:
        return f"{e['mean']:.3f}"
    return f"{e['mean']:.3f} [{e['low']:.3f}, {e['high']:.3f}]"


def to_markdown(result: dict[str, Any]) -> str:
    s, rows = result["summary"], result["rows"]
    b = result["budget"]
    paths = ("gpt", *ADAPTED, "scratch")
    steps = {p: "/".join(str(r[p]["steps"]) for r in rows) for p in paths}
    cpu = {p: sum(r[p]["cpu_seconds"] for r in rows) / len(rows) for p in paths}
    table = [
        ["gpt (B)", steps["gpt"], f"{cpu['gpt']:.0f}", _fmt(s["gpt/l2r"]), "-"],
        ["adapted, step 0", "0", f"{cpu['gpt']:.0f}", _fmt(s["adapted_start/l2r"]), _fmt(s["adapted_start/any"])],
        *([f"{a} + fine-tuned (B + B)", steps[a], f"{cpu['gpt'] + cpu[a]:.0f}", _fmt(s[f"{a}/l2r"]),
           _fmt(s[f"{a}/any"])] for a in ADAPTED),
        ["AO-GPT from scratch (2B)", steps["scratch"], f"{cpu['scratch']:.0f}", _fmt(s["scratch/l2r"]),
         _fmt(s["scratch/any"])],
        *([f"{a} - scratch", "", "", _fmt(s[f"{a}-scratch/l2r"]), _fmt(s[f"{a}-scratch/any"])] for a in ADAPTED),
        *([f"{a} - gpt (left to right lost)", "", "", _fmt(s[f"{a}-gpt/l2r"]), ""] for a in ADAPTED),
    ]
    scored = f"the first {result['eval_bytes']:,} bytes of" if result["eval_bytes"] else "all of"
    return "\n".join([
        "# Adapting a trained GPT against AO-GPT from scratch, at equal compute",
        "",
        f"Shakespeare ({result['tokenizer']}), the {result['preset']} model size and recipe; B = {b:g} CPU seconds at "
        f"{result['threads']} thread(s); {len(rows)} seed(s), mean [95% interval over seeds]. Scored on {scored} the "
        "held-out plays in bits per byte (lower is better), EMA weights, left to right and under one random order. "
        "Steps per seed; CPU seconds: the mean cumulative training CPU time of the path. "
        + describe_environment(result.get("environment", {})),
        "",
        markdown_table(["path", "steps", "CPU s", "left to right", "random order"], table),
    ])


def plot(result: dict[str, Any], out_png: Path) -> Path | None:
    from aogpt.plots import save_png

    def draw(axes: Any) -> None:
        for ax, key, title in ((axes[0, 0], "l2r", "left to right"), (axes[0, 1], "any", "random order")):
            for path, colour in (("gpt", "tab:gray"), ("adapted", "tab:blue"), ("adapted-frozen", "tab:green"),
                                 ("scratch", "tab:orange")):
                for i, r in enumerate(result["rows"]):
                    pts = [p for p in r[path]["curve"] if key in p]
                    if pts:
                        ax.plot([p["cpu"] / 60 for p in pts], [p[key] for p in pts], color=colour, alpha=0.8,
                                label=path if i == 0 else None, marker="." if len(pts) < 3 else None)
            ax.set_xlabel("training CPU minutes")
            ax.set_ylabel("bits per byte (held-out)")
            ax.set_title(title)
            ax.legend()

    return save_png(draw, out_png, figsize=(10, 4.2), grid=(1, 2))


__all__ = ["run", "run_seed", "summary", "to_markdown", "plot"]
