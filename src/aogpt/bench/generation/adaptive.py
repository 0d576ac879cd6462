"""`aogpt bench adaptive`: where choosing the unmasking order from the model's confidence pays off.

One command, from nothing to the table:

1. prepare a synthetic task (`aogpt.data.synthetic`: by default ``walk``, running sums whose blanks
   follow from a known neighbour; or 4x4 Sudoku) with the bytes tokenizer;
2. train AO-GPT with uniform orders and the encoder-only MDM on it, with the trainer `aogpt train`
   runs (`aogpt.train.Trainer`), a few CPU minutes each at the default size (or take trained
   checkpoints: ``--checkpoint aogpt=RUN``);
3. solve fresh puzzles (infilling: the givens known, the blanks generated one per step)
   with random, left-to-right and each adaptive order (`aogpt.generation.adaptive`), over several
   seeds (each seed a new set of puzzles and its own random orders and draws), and report the solve
   rate with a 95% Wilson interval over all puzzles and the slot evaluations spent;
4. measure how much log p(x) differs across orders for the same x (`spread`): for a small AO-GPT
   trained on Shakespeare and for both models on the task's validation grids.

Trained runs are kept in the work directory and reused when asked for again with the same settings,
so a second invocation only re-evaluates.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aogpt.bench.common import Target, write_outputs
from aogpt.bench.environment import environment, finish_environment
from aogpt.bench.generation.adaptive_report import plot_solve_rates, to_markdown
from aogpt.device import resolve_device
from aogpt.errors import AOGPTError
from aogpt.orders import ADAPTIVE

ORDERS = ("random", "l2r", *ADAPTIVE)
MODELS = ("aogpt", "encoder-mdm")
LABELS = {"aogpt": "AO-GPT", "encoder-mdm": "encoder-only MDM"}
DEFAULT_WORK = Path("runs") / "bench-adaptive"  # prepared data and trained runs, kept for reuse
TARGET_RATIO = 2.0  # adaptive order should solve at least twice as many puzzles as random order


@dataclass(frozen=True)
class TrainSpec:
    """How the bench trains a model when no checkpoint is given (uniform orders for AO-GPT)."""

    variant: str
    corpus: str
    steps: int
    layers: int = 3
    width: int = 128
    heads: int = 4
    batch: int = 64
    lr: float = 5e-3
    block: int = 25
    seed: int = 0
    plain_start: bool = False  # True: no any-order start (aogpt.config.any_order_start), as before it existed

    @property
    def name(self) -> str:
        slug = self.corpus.replace(":", "-")
        return (f"{self.variant}-{slug}-b{self.block}-L{self.layers}-D{self.width}-H{self.heads}-s{self.steps}"
                f"-bs{self.batch}-lr{self.lr:g}-seed{self.seed}" + ("-plain" if self.plain_start else ""))


DEFAULTS = dict(task="walk", train_steps=2500, solutions=None, puzzles=200, seeds=3, layers=3, width=128, heads=4,
                batch=64, lr=5e-3, text_steps=600, text_block=64, spread_sequences=64, spread_orders=16)
QUICK = dict(task="walk", train_steps=10, solutions=500, puzzles=4, seeds=2, layers=2, width=32, heads=2, batch=16,
             lr=5e-3, text_steps=10, text_block=32, spread_sequences=4, spread_orders=3)


def prepared_corpus(corpus: str, work: Path, seed: int, show_progress: bool, max_docs: int | None = None) -> Any:
    """The prepared data of `corpus` with the bytes tokenizer in the work directory (made once)."""
    from aogpt.data import PreparedData, prepare

    cap = "" if max_docs is None else f"-max{max_docs}"
    out = work / "data" / f"{corpus.replace(':', '-')}-bytes-seed{seed}{cap}"
    if not (out / "meta.json").is_file():
        prepare(corpus, "bytes", out, seed=seed, progress=show_progress, max_docs=max_docs)
    return PreparedData(out)


def trained_run(spec: TrainSpec, data: Any, work: Path, device: str, show_progress: bool) -> Path:
    """A run directory trained to `spec` (reused when a finished one exists in the work directory)."""
    from aogpt.checkpoint import list_checkpoints
    from aogpt.config import any_order_start, model_config, to_dict, train_config
    from aogpt.families import family
    from aogpt.io import write_json
    from aogpt.train import Trainer

    run = work / "runs" / spec.name
    done = run / "finished.json"
    if done.is_file() and list_checkpoints(run):
        return run
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    mcfg = model_config(spec.variant, n_layer=spec.layers, n_head=spec.heads, n_embd=spec.width,
                        block_size=spec.block, vocab_size=data.padded_vocab_size, pos_init="sinusoidal")
    start = {} if spec.plain_start or not family(spec.variant).target_position else any_order_start(
        "uniform", spec.steps, mcfg.target)  # the decoder leaves the unigram plateau early (docs/training.md)
    tcfg = train_config("tiny", spec.variant, order="uniform", **start,  # the encoder draws its own masks
                        batch_size=spec.batch, max_steps=spec.steps, lr=spec.lr, min_lr=spec.lr / 10,
                        warmup_steps=min(50, max(1, spec.steps // 10)),
                        eval_interval=spec.steps // 4 if spec.steps >= 100 else spec.steps,
                        ckpt_interval=spec.steps, keep_last=1, ema_decay=0.995, seed=spec.seed, device=device)
    trainer = Trainer(mcfg, tcfg, data, run, run_meta={"tokenizer": "bytes", "data": str(data.directory)},
                      tokenizer=data.tokenizer, show_progress=show_progress)
    summary = trainer.fit()
    if summary["step"] < spec.steps:  # stopped by a signal: keep it unfinished so the next run trains afresh
        raise AOGPTError(f"training {spec.variant} on {spec.corpus} stopped at step {summary['step']} of {spec.steps} "
                         f"({summary['stopped_by']})", "run the benchmark again to train it from the start")
    write_json(done, {"spec": asdict(spec), "model": to_dict(mcfg), "train": to_dict(tcfg),
                      **{k: v for k, v in summary.items() if k.startswith("val/") or k in ("step", "train_seconds")}})
    return run


def wilson(k: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k / n."""
    from scipy.stats import binomtest

    if n == 0:
        return (0.0, 1.0)
    ci = binomtest(k, n).proportion_ci(0.95, method="wilson")
    return float(ci.low), float(ci.high)


def puzzle_template(task: Any, puzzle: Any) -> list[int | None]:
    """Token ids of a puzzle for the bytes tokenizer: the givens' characters, None for blanks, the EOT id."""
    from aogpt.data.tokenizer import ByteTokenizer

    return [None if d is None else ord(task.text([d])) for d in puzzle.givens] + [ByteTokenizer.eot_id]


def answer_digits(task: Any, tokens: torch.Tensor) -> list[int]:
    """The values of a generated grid (-1 where a token is no digit: never correct)."""
    return task.parse("".join(chr(t) if t < 128 else "?" for t in tokens[:task.cells].tolist()))


def solve(model: torch.nn.Module, task: Any, puzzles: list[Any], order: str, seed: int, *,
          temperature: float | None = None, candidates: int | None = None, threshold: float | None = None,
          tick: Callable[[], None] | None = None) -> dict[str, Any]:
    """Solve every puzzle once in `order`, one position per step (greedy tokens unless a temperature
    is given). Returns which were solved, the slot evaluations spent and the seconds taken."""
    from aogpt.generation.generate import infill

    adaptive = order in ADAPTIVE
    opts: dict[str, Any] = dict(order=order, policy="count", prepack=False, num_samples=1)
    opts.update(greedy=True) if temperature is None else opts.update(temperature=temperature)
    if adaptive:
        opts.update(candidates=candidates, threshold=threshold)
    solved, slots, forwards = [], 0, 0
    start = time.perf_counter()
    for i, puzzle in enumerate(puzzles):
        res = infill(model, puzzle_template(task, puzzle), seed=seed * 100_003 + i, **opts)
        solved.append(bool(task.check(puzzle, answer_digits(task, res.tokens[0]))))
        slots += res.timing["slot_evaluations"]
        forwards += res.timing["forwards"]
        if tick is not None:
            tick()
    return {"solved": solved, "slot_evaluations": slots, "forwards": forwards,
            "seconds": time.perf_counter() - start}


def spread(model: torch.nn.Module, data: Any, sequences: int, orders: int, block: int, seed: int) -> dict[str, Any]:
    """How much log p(x) differs across orders for the same x: the exact NLL of each of `sequences`
    validation windows under `orders` uniform orders each (`aogpt.evaluation.evaluate.evaluate` with explicit
    orders: one pass per order for a decoder, n passes for the encoder), and under left to right."""
    from aogpt.evaluation.evaluate import evaluate

    batches = data.iter_eval_batches("val", sequences, block, max_batches=1)
    idx = next(iter(batches))
    M, n = idx.shape
    gen = torch.Generator().manual_seed(seed)
    nll = np.stack([np.asarray(evaluate(model, idx, order=torch.rand(M, n, generator=gen).argsort(dim=1),
                                        per_sequence=True, batch_size=M).sequence_nlls[0]) for _ in range(orders)])
    l2r = np.asarray(evaluate(model, idx, order="l2r", per_sequence=True, batch_size=M).sequence_nlls[0])
    mixture = -(np.logaddexp.reduce(-nll, axis=0) - math.log(orders))  # -log of the mean probability over orders
    return {"sequences": M, "length": n, "orders": orders,
            "mean_nll": float(nll.mean()), "l2r_nll": float(l2r.mean()),
            "sd_across_orders": float(nll.std(axis=0, ddof=1).mean()) if orders > 1 else 0.0,
            "range_across_orders": float((nll.max(axis=0) - nll.min(axis=0)).mean()),
            "best_order_nll": float(nll.min(axis=0).mean()), "order_mixture_nll": float(mixture.mean())}


def check_orders(orders: list[str] | tuple[str, ...]) -> None:
    """Refuse an unknown order name (before anything runs)."""
    bad = [o for o in orders if o not in ORDERS]
    if bad or not orders:
        raise AOGPTError(f"unknown order(s) {', '.join(bad) or '(none given)'}", f"choose from: {', '.join(ORDERS)}")


def bench_adaptive(*, task: str = "walk", train_steps: int = 2500, solutions: int | None = None,
                   puzzles: int = 200, seeds: int = 3,
                   layers: int = 3, width: int = 128, heads: int = 4, batch: int = 64, lr: float = 5e-3,
                   orders: tuple[str, ...] | list[str] = ORDERS, temperature: float | None = None,
                   candidates: int | None = None, threshold: float | None = None,
                   checkpoints: dict[str, Path] | None = None, text: bool = True, text_steps: int = 600,
                   text_block: int = 64, text_checkpoint: Path | None = None, text_data: Path | None = None,
                   spread_sequences: int = 64, spread_orders: int = 16, device: str = "cpu", seed: int = 0,
                   plain_start: bool = False,
                   work: Path | None = None, out: Path | None = None, show_progress: bool = True,
                   progress: Callable[[int, str], None] | None = None) -> dict[str, Any]:
    """Everything in the module docstring; returns the summary (and writes DIR/adaptive.md/.json/.png).
    `solutions` caps the task's training (and validation) solutions (default: the corpus's 20,000)."""
    from aogpt.checkpoint import load
    from aogpt.data import PreparedData
    from aogpt.data.synthetic import PREFIX
    from aogpt.data.synthetic import puzzles as make_puzzles
    from aogpt.data.synthetic import task as get_task

    t = get_task(task)
    check_orders(orders)
    if min(train_steps, puzzles, seeds, spread_sequences, spread_orders) < 1:
        raise AOGPTError("steps, puzzles, seeds and spread sizes must be positive", "e.g. --puzzles 200 --seeds 3")
    checkpoints = dict(checkpoints or {})
    work = Path(work if work is not None else DEFAULT_WORK)
    dev = resolve_device(device)
    # trained at the training default (auto), puzzles solved and spreads scored with the loaded fp32 weights
    env = environment(dev, ["auto", "fp32"])
    corpus = PREFIX + t.name
    data = prepared_corpus(corpus, work, seed, show_progress, solutions)
    block = data.record_tokens
    runs: dict[str, str] = {}
    for variant in MODELS:
        if variant not in checkpoints:
            spec = TrainSpec(variant, corpus, train_steps, layers, width, heads, batch, lr, block, seed, plain_start)
            checkpoints[variant] = trained_run(spec, data, work, str(dev), show_progress)
        runs[variant] = str(checkpoints[variant])
    models = {v: load(p, device=dev).model for v, p in checkpoints.items()}
    for v, m in models.items():
        if m.config.variant != v:
            raise AOGPTError(f"checkpoint {checkpoints[v]} holds a {m.config.variant} model, not {v}",
                             f"pass an {v} checkpoint as {v}=PATH, or leave it out to train one")
        if m.config.block_size < block:
            raise AOGPTError(f"the {v} checkpoint has a context of {m.config.block_size}, the task needs {block}",
                             f"train it on {corpus} with --block-size {block}")
    sets = [make_puzzles(t, puzzles, seed + s) for s in range(seeds)]
    done = [0]

    def tick(label: str) -> Callable[[], None]:
        def step() -> None:
            done[0] += 1
            if progress is not None:
                progress(done[0], label)
        return step

    rows = []
    for variant, model in models.items():
        for order in orders:
            per_seed = [solve(model, t, sets[s], order, seed + s, temperature=temperature, candidates=candidates,
                              threshold=threshold, tick=tick(f"{variant} {order}")) for s in range(seeds)]
            solved = sum(sum(r["solved"]) for r in per_seed)
            n = seeds * puzzles
            rows.append({"model": variant, "order": order, "solved": solved, "attempts": n, "rate": solved / n,
                         "ci95": wilson(solved, n), "per_seed": [float(np.mean(r["solved"])) for r in per_seed],
                         "slot_evaluations_per_puzzle": sum(r["slot_evaluations"] for r in per_seed) / n,
                         "forwards_per_puzzle": sum(r["forwards"] for r in per_seed) / n,
                         "seconds": sum(r["seconds"] for r in per_seed)})
    spreads = []
    for variant, model in models.items():
        spreads.append({"model": variant, "data": corpus, **spread(model, data, spread_sequences, spread_orders,
                                                                    block, seed)})
    text_run, trained_text = None, False
    if text:
        if text_checkpoint is None:
            trained_text = True
            text_data_dir = prepared_corpus("shakespeare", work, seed, show_progress)
            spec = TrainSpec("aogpt", "shakespeare", text_steps, layers, width, heads, 32, lr, text_block, seed,
                             plain_start)
            text_checkpoint = trained_run(spec, text_data_dir, work, str(dev), show_progress)
        else:
            if text_data is None:
                raise AOGPTError("--text-checkpoint needs the text it is measured on", "add --text-data DIR")
            text_data_dir = PreparedData(text_data)
        text_run = str(text_checkpoint)
        text_model = load(text_checkpoint, device=dev).model
        length = min(text_block, text_model.config.block_size)
        spreads.append({"model": "aogpt", "data": str(text_data_dir.meta.get("corpus")),
                        **spread(text_model, text_data_dir, spread_sequences, spread_orders, length, seed)})
    result = {"benchmark": "adaptive", "task": t.name, "task_summary": t.summary, "cells": t.cells, "block": block,
              "puzzles": puzzles,
              "seeds": seeds, "orders": list(orders), "tokens": "greedy" if temperature is None else
              f"temperature {temperature:g}", "candidates": candidates, "threshold": threshold,
              "train": {"steps": train_steps, "solutions": data.meta["splits"]["train"]["documents"], "layers": layers,
                        "width": width, "heads": heads, "batch": batch,
                        "lr": lr, "text_steps": text_steps if trained_text else None, "plain_start": plain_start},
              "runs": runs, "text_run": text_run, "seed": seed, "solve": rows, "spread": spreads,
              "environment": finish_environment(env)}
    result["targets"] = targets(rows)
    if out is not None:
        result["files"] = write_outputs(out, "adaptive", to_markdown(result), result)
        png = plot_solve_rates(result, Path(out) / "adaptive.png")
        if png is not None:
            result["files"]["png"] = str(png)
    return result


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adaptive against random order, per model and adaptive policy: the ratio of solve rates."""
    out = []
    for variant in MODELS:
        base = next((r for r in rows if r["model"] == variant and r["order"] == "random"), None)
        for r in rows:
            if r["model"] != variant or r["order"] not in ADAPTIVE or base is None:
                continue
            # no ratio when random order solved nothing: one lucky solve against none is no evidence of 2x
            ratio = r["rate"] / base["rate"] if base["rate"] > 0 else None
            note = "" if ratio is not None else f"random order solved none; {r['order']} solved {r['rate']:.1%}"
            out.append(Target(f"{LABELS[variant]}: {r['order']} order solves ÷ random order solves", ratio,
                              TARGET_RATIO, True, note).to_dict())
    return out


__all__ = ["DEFAULTS", "MODELS", "ORDERS", "QUICK", "TrainSpec", "bench_adaptive", "check_orders", "prepared_corpus",
           "solve", "spread", "targets", "trained_run", "wilson"]
