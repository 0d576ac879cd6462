"""The measurements beyond training curves: ensembles (Finding 6), generation perplexity (Finding 8.2),
the generation benchmark (Findings 7 / 8.1) and infilling (`aogpt.reproduce.infill`), each on the
trained runs of one seed.

Each analysis returns ``{"units": ..., "values": {key: {"values": [...], "group": ...}}, "extra":
{...}}``: per key, one value per unit (a held-out sequence, a generated sample, a timing repeat).
Values of the same `group` come from the same units and are compared paired (the decoder and the
encoder score the same sequences; every contender is timed in the same interleaved rounds); samples
of two models are not. Results are cached in DIR/analyses/ keyed by what they were computed from, so
a rerun recomputes only what changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aogpt.io import ensure_writable_dir, read_json, write_json
from aogpt.progress import progress
from aogpt.reproduce.findings import ANNEALING, ENSEMBLE_SIZES, FINDINGS
from aogpt.reproduce.runner import Plan
from aogpt.stats import json_safe

SPEED_METHODS = ("aogpt", "encoder", "gpt")


def _load(run_dir: Path, device: str) -> Any:
    from aogpt.checkpoint import load

    return load(run_dir, weights="ema", device=device)


def held_out(data: Any, count: int, block_size: int) -> torch.Tensor:
    """The first `count` validation windows (count, block_size): the same for every model."""
    rows = torch.cat(list(data.iter_eval_batches("val", count, block_size, 1)))
    return rows[:count]


def ensemble(plan: Plan, data: Any, seed: int, device: str = "cpu", show_progress: bool = True) -> dict[str, Any]:
    """Any-order NLL per token of each held-out sequence: the decoder (the AO-GPT recipe run) with
    context-order ensembles of M = 1, 2, 4, 8 members, and the encoder-only MDM (its Monte-Carlo
    bound, averaged over several draws). The decoder's M members share their base orders, so the
    values are paired across M and with the encoder by sequence."""
    from aogpt.evaluation.evaluate import evaluate

    scale = plan.scale
    seqs = held_out(data, scale.ensemble_sequences, scale.block_size)
    n = seqs.shape[1]
    decoder = _load(plan.run("mixture", seed).dir, device).model
    encoder = _load(plan.run("encoder", seed).dir, device).model
    values: dict[str, dict[str, Any]] = {}
    with progress(total=len(ENSEMBLE_SIZES) + 1, desc="reproduce: ensembles", unit="model",
                  disable=not show_progress) as bar:
        for m in ENSEMBLE_SIZES:
            res = evaluate(decoder, seqs, order="random", num_orders=scale.ensemble_orders, ensemble=m,
                           ensemble_positions=scale.ensemble_positions if m > 1 else None, batch_size=16,
                           seed=seed, per_sequence=True)
            per_seq = np.mean(np.asarray(res.sequence_nlls), axis=0) / n
            values[f"decoder M={m}"] = {"values": per_seq.tolist(), "group": "held-out sequences"}
            bar.update(1)
        res = evaluate(encoder, seqs, order="random", num_orders=scale.encoder_draws, batch_size=16, seed=seed,
                       per_sequence=True)
        values["encoder"] = {"values": (np.mean(np.asarray(res.sequence_nlls), axis=0) / n).tolist(),
                             "group": "held-out sequences"}
        bar.update(1)
    return {"units": "sequences", "values": values,
            "extra": {"sequences": int(seqs.shape[0]), "orders": scale.ensemble_orders,
                      "positions": scale.ensemble_positions, "encoder_draws": scale.encoder_draws}}


def genppl(plan: Plan, data: Any, seed: int, device: str = "cpu", show_progress: bool = True) -> dict[str, Any]:
    """Generation perplexity of AO-GPT (the recipe run) and the encoder-only MDM under no / mild /
    appropriate annealing, float64 draws, T = n steps, scored by the left-to-right run of the same
    seed: per sample, its NLL per evaluator token."""
    from aogpt.evaluation.genppl import generate_texts, make_evaluator, score_samples

    scale = plan.scale
    evaluator = make_evaluator(str(plan.run("l2r", seed).dir), device=device)
    values: dict[str, dict[str, Any]] = {}
    extra: dict[str, Any] = {}
    models = (("aogpt", "mixture"), ("encoder", "encoder"))
    with progress(total=len(models) * len(ANNEALING), desc="reproduce: generation perplexity", unit="setting",
                  disable=not show_progress) as bar:
        for name, run_key in models:
            loaded = _load(plan.run(run_key, seed).dir, device)
            for setting, top_p, temperature in ANNEALING:
                texts = generate_texts(loaded, scale.gen_samples, seed, steps=scale.block_size, top_p=top_p,
                                       temperature=temperature, dtype=torch.float64, batch_size=16)
                scored = score_samples(evaluator, texts)
                key = f"{name} {setting}"
                values[key] = {"values": scored.per_sample_nll, "group": f"samples of {name}"}
                extra[key] = {"genppl": scored.genppl, "entropy": scored.entropy, "top_p": top_p,
                              "temperature": temperature, "example": texts[0][:160]}
                bar.update(1)
    return {"units": "samples", "values": values, "extra": extra}


def speed(plan: Plan, out: Path, vocab_size: int, device: str = "cpu", seed: int = 0,
          show_progress: bool = True) -> dict[str, Any]:
    """`aogpt bench generate` at the runs' size (random weights), in interleaved timing rounds.

    Computation (Finding 7) is counted, not timed: the positions run through the model (slot
    evaluations; KV-cache padding is reported beside) at every T, and the log-log slope of that
    count against T, an exact number. Speed (Finding 8.1) is timed: the log wall time at T = n of
    each contender in every round (rounds pair the contenders)."""
    from aogpt.bench.common import Size
    from aogpt.bench.generation.generate import bench_generate

    scale = plan.scale
    size = Size(scale.n_layer, scale.n_embd, scale.n_head, vocab_size)
    steps = list(scale.bench_steps)
    calls = (len(steps) * 2 + 1) * scale.bench_repeats
    with progress(total=calls, desc="reproduce: generation speed", unit="run", disable=not show_progress) as bar:
        result = bench_generate(n=scale.block_size, batch=scale.bench_batch, steps=steps, size=size,
                                methods=SPEED_METHODS, repeats=scale.bench_repeats, long_run=1e9, device=device,
                                seed=seed, out=out, progress=lambda done, label: bar.update(1))
    runs, n = result["runs"], scale.block_size
    log_t = np.log(np.asarray(steps, dtype=np.float64))
    values: dict[str, dict[str, Any]] = {}
    time_slopes = {}
    for method in ("aogpt", "encoder"):
        slots = np.log(np.asarray([result["slots"][method][str(t)] for t in steps], dtype=np.float64))
        values[f"slots slope {method}"] = {"values": [float(np.polyfit(log_t, slots, 1)[0])], "group": "count",
                                           "exact": True}
        times = np.log(np.asarray([runs[method][str(t)] for t in steps], dtype=np.float64))  # (T, rounds)
        time_slopes[method] = [float(np.polyfit(log_t, times[:, r], 1)[0]) for r in range(times.shape[1])]
        values[f"log time {method}"] = {"values": times[steps.index(n)].tolist(), "group": "timing rounds"}
    values["log time gpt"] = {"values": np.log(runs["gpt"][str(n)]).tolist(), "group": "timing rounds"}
    extra = {"seconds": result["seconds"], "slots": result["slots"], "padded_slots": result["padded_slots"],
             "time_slopes": time_slopes, "n": n, "batch": scale.bench_batch, "steps": steps,
             "environment": result["environment"], "files": result.get("files", {})}
    return {"units": "timing rounds", "values": values, "extra": extra}


ANALYSES = {"ensemble": ("mixture", "encoder"), "genppl": ("mixture", "encoder", "l2r"), "speed": (),
            "infill": FINDINGS["infill"].runs}
FORMAT = 2  # of the cached results: a change of what an analysis stores recomputes it


def _identity(plan: Plan, name: str, seed: int | None) -> dict[str, Any]:
    runs = {}
    if seed is not None:
        for key in ANALYSES[name]:
            done = plan.run(key, seed).dir / "done.json"
            runs[key] = read_json(done, "run summary") if done.is_file() else None
    return json.loads(json.dumps({"format": FORMAT, "scale": plan.scale.to_dict(), "seed": seed, "runs": runs},
                                 default=str))


def run_analysis(plan: Plan, name: str, data: Any, device: str = "cpu", show_progress: bool = True
                 ) -> dict[int | str, dict[str, Any]]:
    """The analysis `name` for every seed of the plan (once for the speed benchmark), cached."""
    folder = plan.out / "analyses"
    ensure_writable_dir(folder)
    seeds: list[int | None] = [None] if name == "speed" else list(plan.seeds)
    results: dict[int | str, dict[str, Any]] = {}
    for seed in seeds:
        path = folder / (f"{name}.json" if seed is None else f"{name}-seed{seed}.json")
        identity = _identity(plan, name, seed)
        if path.is_file():
            cached = read_json(path, "analysis result")
            if cached.get("identity") == identity:
                results["all" if seed is None else seed] = cached["result"]
                continue
        if name == "ensemble":
            result = ensemble(plan, data, seed, device, show_progress)
        elif name == "genppl":
            result = genppl(plan, data, seed, device, show_progress)
        elif name == "infill":
            from aogpt.reproduce.infill import infill

            result = infill(plan, data, seed, device, show_progress)
        else:
            result = speed(plan, folder / "speed", int(data.tokenizer.padded_vocab_size), device, plan.seeds[0],
                           show_progress)
        write_json(path, {"identity": identity, "result": json_safe(result)})
        results["all" if seed is None else seed] = result
    return results
