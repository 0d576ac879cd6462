"""The report of `aogpt bench adaptive` (`aogpt.bench.generation.adaptive`): markdown tables and a bar chart."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from aogpt.bench.common import markdown_table
from aogpt.bench.environment import describe_environment
from aogpt.plots import pyplot

LABELS = {"aogpt": "AO-GPT", "encoder-mdm": "encoder-only MDM"}
ORDER_LABELS = {"random": "random", "l2r": "left to right", "confidence": "confidence (adaptive)",
                "margin": "margin (adaptive)", "entropy": "entropy (adaptive)"}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def to_markdown(result: dict[str, Any]) -> str:
    tr = result["train"]
    how = "greedy tokens" if result["tokens"] == "greedy" else result["tokens"]
    extra = []
    if result.get("candidates"):
        extra.append(f"{result['candidates']} random candidates per step")
    if result.get("threshold"):
        extra.append(f"confidence threshold {result['threshold']:g}")
    rows = [[LABELS.get(r["model"], r["model"]), ORDER_LABELS.get(r["order"], r["order"]),
             f"{r['solved']}/{r['attempts']} = {_pct(r['rate'])}",
             f"{_pct(r['ci95'][0])} – {_pct(r['ci95'][1])}", ", ".join(_pct(x) for x in r["per_seed"]),
             f"{r['slot_evaluations_per_puzzle']:.0f}", f"{r['forwards_per_puzzle']:.1f}", f"{r['seconds']:.1f} s"]
            for r in result["solve"]]
    spread_rows = [[LABELS.get(s["model"], s["model"]), s["data"], f"{s['sequences']} × {s['orders']}",
                    str(s["length"]), f"{s['l2r_nll']:.2f}", f"{s['mean_nll']:.2f}", f"{s['sd_across_orders']:.2f}",
                    f"{s['range_across_orders']:.2f}", f"{s['best_order_nll']:.2f}", f"{s['order_mixture_nll']:.2f}"]
                   for s in result["spread"]]
    runs = ", ".join(f"{LABELS.get(k, k)} `{v}`" for k, v in result["runs"].items())
    lines = [
        f"# Adaptive unmasking orders on synthetic:{result['task']} ({result['cells']} cells)",
        "",
        f"Puzzles: {result['task_summary']}; {result['seeds']} seeds × "
        f"{result['puzzles']} puzzles, each solved once per order, one position per step, {how}"
        + (f", {', '.join(extra)}" if extra else "") + ". A puzzle counts as solved when the answer is correct "
        "(each puzzle has exactly one). 95% Wilson intervals over all puzzles; per seed: the solve rate of each seed's "
        f"puzzle set. Models trained by this benchmark: {tr['layers']} layers, width {tr['width']}, "
        f"{tr['heads']} heads, {tr['steps']} steps of {tr['batch']} sequences, uniform orders"
        + (" from step 0 (no any-order start)" if tr.get("plain_start") else
           ", AO-GPT with the any-order start (a curriculum from left to right, docs/training.md)")
        + f"; runs: {runs}.",
        "",
        markdown_table(["model", "order", "solved", "95% CI", "per seed", "slot evaluations / puzzle",
                        "forwards / puzzle", "time"], rows),
        "",
        "Slot evaluations count every slot a forward computes: for the decoder the query slots of every "
        "candidate position plus catch-ups, for the encoder the whole sequence at every step.",
        "",
        "Goal (adaptive order solves at least twice as many puzzles as random order):",
        *[t["line"] for t in result["targets"]],
        "",
        "## How much log p(x) depends on the order",
        "",
        "Exact negative log-likelihood of the same sequences (nats per sequence) under left to right and "
        "under uniform random orders; sd and range are taken across the orders of each sequence, then "
        "averaged over the sequences. The best-order figure picks, per sequence, its most likely of the "
        "orders; the mixture is −log of the probability averaged over the orders. A model whose "
        "conditionals formed one joint distribution would give every order the same value.",
        "",
        markdown_table(["model", "data", "sequences × orders", "tokens", "left to right", "mean over orders",
                        "sd across orders", "range", "best order", "mixture of orders"], spread_rows),
    ]
    if result.get("text_run"):
        lines += ["", f"Text model: `{result['text_run']}`"
                  + (f" ({tr['text_steps']} steps on Shakespeare, bytes)" if tr.get("text_steps") else "") + "."]
    lines += ["", describe_environment(result["environment"])]
    return "\n".join(lines)


def plot_solve_rates(result: dict[str, Any], out_png: Path) -> Path | None:
    """Solve rate per order with its 95% interval, one group of bars per model. Never raises."""
    try:
        plt = pyplot()
        orders = result["orders"]
        models = list(dict.fromkeys(r["model"] for r in result["solve"]))
        fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=120)
        width = 0.8 / max(1, len(models))
        for i, model in enumerate(models):
            rows = {r["order"]: r for r in result["solve"] if r["model"] == model}
            xs = [j + (i - (len(models) - 1) / 2) * width for j in range(len(orders))]
            rates = [100 * rows[o]["rate"] for o in orders]
            err = [[100 * (rows[o]["rate"] - rows[o]["ci95"][0]) for o in orders],
                   [100 * (rows[o]["ci95"][1] - rows[o]["rate"]) for o in orders]]
            ax.bar(xs, rates, width, yerr=err, capsize=3, label=LABELS.get(model, model))
        ax.set_xticks(range(len(orders)), [ORDER_LABELS.get(o, o).replace(" (adaptive)", "\n(adaptive)")
                                           for o in orders], fontsize=8)
        ax.set_ylabel("puzzles solved (%)")
        ax.set_title(f"{result['task']}: solve rate by unmasking order", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        out_png = Path(out_png)
        tmp = out_png.with_suffix(".tmp.png")
        fig.savefig(tmp)
        plt.close(fig)
        os.replace(tmp, out_png)
        return out_png
    except Exception as exc:  # noqa: BLE001 - a plot must never lose the measured numbers
        warnings.warn(f"could not write plot {out_png}: {exc}", stacklevel=2)
        return None
