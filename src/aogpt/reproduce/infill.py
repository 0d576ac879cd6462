"""The infilling finding of `aogpt reproduce`: AO-GPT given both sides of a gap against a
fill-in-the-middle GPT given both sides and a GPT given the prefix, on equal tokens, at two budgets.

`infill` (the analysis, one seed) scores the three models of each budget on the same held-out spans
(`aogpt.evaluation.infill`: cuts drawn once from the validation text with the plan's first seed, so
every model and seed reads the same spans): per span, bits per byte of

- AO-GPT given both sides, the span read in its own order (left to right or its confidence order,
  whichever is likelier on other spans), and given the prefix only;
- GPT-FIM given both sides (the span and its END token: the probability that the gap holds exactly the
  span), the END token's share of it, and GPT-FIM given the prefix only;
- GPT given the prefix only.

`tables` gathers, over seeds, every row with its 95% interval, the paired gaps between the three
models, the left-to-right price each pays (its final validation loss against the GPT's, in bits per
byte: a ``bytes`` token is one byte) and a sentence that says which model fills gaps best at each
budget; `markdown` renders them and `figure` draws bits per byte against the span length.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from aogpt import stats
from aogpt.plots import save_png
from aogpt.progress import progress
from aogpt.reproduce.findings import INFILL_BUDGET_NAMES, INFILL_LENGTHS, INFILL_MODELS, curve, infill_key, value

MODELS = {m[0]: m[1] for m in INFILL_MODELS}
ROWS = (("aogpt", "both", "AO-GPT, both sides (its own order)"),
        ("fim", "both", "GPT-FIM, both sides (span + end)"),
        ("gpt", "prefix", "GPT, prefix only"),
        ("aogpt", "prefix", "AO-GPT, prefix only"),
        ("fim", "prefix", "GPT-FIM, prefix only"),
        ("fim", "end", "GPT-FIM: the end token's share"))
CONTENDERS = ROWS[:3]  # what a user would pick to fill a gap


def infill(plan: Any, data: Any, seed: int, device: str = "cpu", show_progress: bool = True) -> dict[str, Any]:
    """Per span, bits per byte of every row (module docstring) for both budgets at `seed`."""
    from aogpt.checkpoint import load
    from aogpt.evaluation.infill import FIM_ROW, calibration_cuts, make_cuts, score_cuts

    scale = plan.scale
    ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in data.shards("val")])
    lengths = data.tokenizer.byte_lengths()
    cut_seed = plan.seeds[0]
    values: dict[str, dict[str, Any]] = {}
    orders: dict[str, str] = {}
    budgets = range(len(INFILL_BUDGET_NAMES))
    with progress(total=len(budgets) * len(INFILL_LENGTHS), desc="reproduce: infilling", unit="length",
                  disable=not show_progress) as bar:
        for b in budgets:
            models = {m: load(plan.run(f"infill-{m}-{b}", seed).dir, weights="ema", device=device).model
                      for m in MODELS}
            for n in INFILL_LENGTHS:
                cuts = make_cuts(ids, n, num_cuts=scale.infill_cuts, context=scale.infill_context, seed=cut_seed,
                                 eot_id=data.eot_id)
                calib = calibration_cuts(ids, cuts, cut_seed, data.eot_id)
                scores = {m: score_cuts(model, cuts, num_orders=1, seed=seed, byte_lengths=lengths,
                                        calibration=calib) for m, model in models.items()}
                group = f"spans of {n} tokens"
                rows = {("aogpt", "both"): scores["aogpt"].bpb("both/best"),
                        ("aogpt", "prefix"): scores["aogpt"].bpb("prefix/l2r"),
                        ("fim", "both"): scores["fim"].bpb(FIM_ROW), ("fim", "prefix"): scores["fim"].bpb("prefix/l2r"),
                        ("gpt", "prefix"): scores["gpt"].bpb("prefix/l2r")}
                end = [e / nb / math.log(2) for e, nb in zip(scores["fim"].end_nll, scores["fim"].bytes, strict=True)]
                rows[("fim", "end")] = stats.Measurement.of(end, "spans")
                for (model, sides), m in rows.items():
                    values[infill_key(model, sides, n, b)] = {"values": list(m.values), "group": group}
                orders[infill_key("aogpt", "both", n, b)] = scores["aogpt"].best_order or ""
                bar.update(1)
    return {"units": "spans", "values": values,
            "extra": {"orders": orders, "cuts": scale.infill_cuts, "context": scale.infill_context,
                      "cut_seed": cut_seed}}


def _entry(e: stats.Estimate, scale: float = 1.0) -> dict[str, Any]:
    finite = math.isfinite(e.low)
    return {"mean": e.value * scale, "interval": [e.low * scale, e.high * scale] if finite else None, "n": e.n,
            "units": e.units}


def tables(plan: Any, lookup: Any, analyses: dict[str, Any]) -> dict[str, Any]:
    """Rows, gaps, the left-to-right price and the verdict sentence (module docstring)."""
    budgets = range(len(INFILL_BUDGET_NAMES))
    rows = {infill_key(m, s, n, b): _entry(stats.mean_interval(lookup(value("infill", infill_key(m, s, n, b)))))
            for b in budgets for n in INFILL_LENGTHS for m, s, _ in ROWS}
    gaps: dict[str, dict[str, Any]] = {}
    for b in budgets:
        for n in INFILL_LENGTHS:
            q = {(m, s): lookup(value("infill", infill_key(m, s, n, b))) for m, s, _ in CONTENDERS}
            gaps[f"fim-aogpt L={n} {b}"] = _entry(stats.difference(q["fim", "both"], q["aogpt", "both"]))
            gaps[f"gpt-aogpt L={n} {b}"] = _entry(stats.difference(q["gpt", "prefix"], q["aogpt", "both"]))
            gaps[f"gpt-fim L={n} {b}"] = _entry(stats.difference(q["gpt", "prefix"], q["fim", "both"]))
    price: dict[str, dict[str, Any]] = {}
    bits = 1 / math.log(2)  # nats per token -> bits per byte, a bytes token being one byte
    for b in budgets:
        gpt = lookup(curve(f"infill-gpt-{b}", "l2r"))
        for m in MODELS:
            own = lookup(curve(f"infill-{m}-{b}", "l2r"))
            price[f"{m} {b}"] = {"l2r": _entry(stats.mean_interval(own), bits),
                                 "vs_gpt": _entry(stats.difference(own, gpt), bits) if m != "gpt" else None}
    steps = [plan.run(f"infill-gpt-{b}", plan.seeds[0]).train_cfg.max_steps for b in budgets]
    orders = {k: sorted({r["extra"]["orders"][k] for r in analyses["infill"].values()})
              for k in next(iter(analyses["infill"].values()))["extra"]["orders"]}
    extra = next(iter(analyses["infill"].values()))["extra"]
    out = {"rows": rows, "gaps": gaps, "price": price, "steps": steps, "orders": orders,
           "tokens": [s * plan.scale.batch_size * plan.scale.infill_block_size for s in steps],
           "cuts": extra["cuts"], "context": extra["context"]}
    out["sentence"] = sentence(out)
    return out


def _best(rows: dict[str, Any], gaps: dict[str, Any], n: int, b: int) -> str:
    """Which contender has the lowest mean at (n, b), and whether the interval to the runner-up decides it."""
    means = sorted((rows[infill_key(m, s, n, b)]["mean"], m) for m, s, _ in CONTENDERS)
    (_, first), (_, second) = means[0], means[1]
    pair = {("fim", "aogpt"): "fim-aogpt", ("gpt", "aogpt"): "gpt-aogpt", ("gpt", "fim"): "gpt-fim"}
    key = pair.get((second, first)) or pair[(first, second)]
    gap = gaps[f"{key} L={n} {b}"]
    decided = gap["interval"] is not None and (gap["interval"][0] > 0 or gap["interval"][1] < 0)
    name = {"aogpt": "AO-GPT", "fim": "GPT-FIM", "gpt": "GPT"}
    return name[first] + ("" if decided else f" (not told apart from {name[second]})")


def sentence(t: dict[str, Any]) -> str:
    """Which model fills gaps best at each budget and length, and how AO-GPT's gap to GPT-FIM moves."""
    parts = []
    for b, budget in enumerate(INFILL_BUDGET_NAMES):
        best = ", ".join(f"{n} tokens: {_best(t['rows'], t['gaps'], n, b)}" for n in INFILL_LENGTHS)
        parts.append(f"at the {budget} budget ({t['steps'][b]:,} steps) the lowest bits per byte is {best}")
    moves = "; ".join(
        f"{n} tokens {t['gaps'][f'fim-aogpt L={n} 0']['mean']:+.3f} -> {t['gaps'][f'fim-aogpt L={n} 1']['mean']:+.3f}"
        for n in INFILL_LENGTHS)
    return ("Fills best: " + "; ".join(parts) + ". GPT-FIM minus AO-GPT, both given both sides (positive: AO-GPT "
            f"better), from the smaller to the larger budget: {moves} bits/byte.")


def _num(e: dict[str, Any] | None, digits: int = 3, sign: bool = False) -> str:
    if not e:
        return "-"
    fmt = f"{'+' if sign else ''}.{digits}f"
    text = format(e["mean"], fmt)
    if e.get("interval"):
        text += f" [{format(e['interval'][0], fmt)}, {format(e['interval'][1], fmt)}]"
    return text


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|",
            *("| " + " | ".join(r) + " |" for r in rows), ""]


def markdown(f: dict[str, Any]) -> list[str]:
    """The finding's tables as markdown lines."""
    t = f["infill"]
    seeds = len(f.get("seeds") or [])
    over = f"over {seeds} seeds" if seeds > 1 else "over the spans (one seed)"
    head = ["budget", "row", *(f"{n} tokens" for n in INFILL_LENGTHS)]
    rows = [[f"{budget} ({t['steps'][b]:,} steps)", label,
             *(_num(t["rows"][infill_key(m, s, n, b)]) for n in INFILL_LENGTHS)]
            for b, budget in enumerate(INFILL_BUDGET_NAMES) for m, s, label in ROWS]
    gap_rows = [[f"{budget}", what, *(_num(t["gaps"][f"{key} L={n} {b}"], sign=True) for n in INFILL_LENGTHS)]
                for b, budget in enumerate(INFILL_BUDGET_NAMES)
                for key, what in (("fim-aogpt", "GPT-FIM both sides - AO-GPT both sides"),
                                  ("gpt-aogpt", "GPT prefix only - AO-GPT both sides"),
                                  ("gpt-fim", "GPT prefix only - GPT-FIM both sides"))]
    price = [[f"{budget}", MODELS[m], _num(t["price"][f"{m} {b}"]["l2r"]),
              _num(t["price"][f"{m} {b}"]["vs_gpt"], sign=True)]
             for b, budget in enumerate(INFILL_BUDGET_NAMES) for m in MODELS]
    orders = ", ".join(f"{k.split(' ', 2)[2]}: {'/'.join(v)}" for k, v in t["orders"].items())
    return [f"**{t['sentence']}**", "",
            f"Bits per byte of the span (mean {over} [95% interval]; every model reads the same "
            f"{t['cuts']} spans per length, {t['context']} tokens of text on each side):", "",
            *_table(head, rows),
            "Paired gaps (bits per byte; positive: the second model is better):", "", *_table(head[:1] + ["gap"] +
                                                                                                head[2:], gap_rows),
            "The left-to-right price (final validation loss, left to right, in bits per byte; the difference to "
            "the GPT trained alongside, paired by seed):", "",
            *_table(["budget", "model", "left to right", "minus GPT"], price),
            f"AO-GPT's own order, chosen on other spans (per length and budget, over seeds): {orders}.", ""]


def figure(t: dict[str, Any], out: Path) -> Path | None:
    """Bits per byte against the span length: the three contenders at both budgets."""

    def draw(ax: Any) -> None:
        colors = {"aogpt": "tab:blue", "fim": "tab:green", "gpt": "tab:gray"}
        for b, budget in enumerate(INFILL_BUDGET_NAMES):
            for m, s, label in CONTENDERS:
                es = [t["rows"][infill_key(m, s, n, b)] for n in INFILL_LENGTHS]
                lo = [e["mean"] - (e["interval"] or [e["mean"]] * 2)[0] for e in es]
                hi = [(e["interval"] or [e["mean"]] * 2)[1] - e["mean"] for e in es]
                ax.errorbar(INFILL_LENGTHS, [e["mean"] for e in es], yerr=[lo, hi], marker="o", capsize=3,
                            color=colors[m], linestyle="-" if b else "--", label=f"{label}, {budget} budget")
        ax.set_xscale("log", base=2)
        ax.set_xticks(INFILL_LENGTHS, [str(n) for n in INFILL_LENGTHS])
        ax.set_xlabel("span length (tokens)")
        ax.set_ylabel("bits per byte of the span")
        ax.set_title("Infilling: a gap given both sides (or the prefix)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)

    return save_png(draw, out, figsize=(6.5, 4.6), dpi=110)
