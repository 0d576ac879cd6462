"""`aogpt bench adapt`'s report: per fine-tuning length F, every path's figures over seeds, the paired
differences a user with a pretrained model asks for (against AO-GPT from scratch at F steps, and at S + F),
whether each model left the unigram plateau in a random order, the targets met or not, and both orders'
curves as a PNG.

Figures over seeds are means with a Student-t 95% interval (`aogpt.stats`); differences are paired by
seed (every path of a seed starts from the same source, data and evaluation order)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aogpt.bench.common import markdown_table
from aogpt.bench.environment import describe_environment
from aogpt.stats import Measurement, mean_interval

# The targets (docs/adapt.md): left to right kept within this much of the source; "off the plateau" in a random
# order: at least this much below the unigram level of the scored text.
KEEP_L2R = 0.03
OFF_PLATEAU = 0.4
REFERENCES = ("scratch", "scratch-sf", "l2r")  # the paths every candidate is compared with


def _estimate(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    est = mean_interval(Measurement.of(values, "seeds"))
    return {"mean": est.value, "low": est.low, "high": est.high, "n": len(values)}


def _get(row: dict[str, Any], path: str, key: str) -> float | None:
    value = (row.get(path) or {}).get(key)
    return None if value is None else float(value)


def _series(rows: list[dict[str, Any]], a: tuple[str, str], b: tuple[str, str] | None = None) -> list[float]:
    """Per seed, row[a] (minus row[b]), where the seeds have both."""
    out = []
    for r in rows:
        x, y = _get(r, *a), (_get(r, *b) if b else 0.0)
        if x is not None and y is not None:
            out.append(x - y)
    return out


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """For each F: estimates of every path's scores, the seeds off the plateau, and the paired differences of
    every candidate."""
    rows, unigram = result["rows"], result.get("unigram")
    out: dict[str, Any] = {"source/l2r": _estimate(_series(rows, ("source", "l2r"))),
                           "start/any": _estimate(_series(rows, ("adapted_start", "any"))), "unigram": unigram}
    for f in result["finetune"]:
        for path in (*REFERENCES, *result["candidates"]):
            k = f"{path}/F{f}"
            for key in ("l2r", "any"):
                out[f"F{f}/{path}/{key}"] = _estimate(_series(rows, (k, key)))
            anys = _series(rows, (k, "any"))
            if unigram is not None and anys:
                out[f"F{f}/{path}/off"] = {"seeds": sum(v <= unigram - OFF_PLATEAU for v in anys), "n": len(anys)}
        for c in result["candidates"]:
            k = f"{c}/F{f}"
            pairs = {"source/l2r": ((k, "l2r"), ("source", "l2r")),
                     "l2rmore/l2r": ((k, "l2r"), (f"l2r/F{f}", "l2r"))}
            for ref in ("scratch", "scratch-sf"):
                for key in ("any", "l2r"):
                    pairs[f"{ref}/{key}"] = ((k, key), (f"{ref}/F{f}", key))
            for name, (x, y) in pairs.items():
                out[f"F{f}/{c}-{name}"] = _estimate(_series(rows, x, y))
        for path in ("scratch", *result["candidates"]):  # the infilling, parameters and step time of each path
            k = f"{path}/F{f}"
            for row in INFILL_ROWS:
                out[f"F{f}/{path}/infill/{row}"] = _estimate(_infill_series(rows, k, row))
                out[f"F{f}/{path}-source/infill/{row}"] = _estimate(_infill_series(rows, k, row, ("source",
                                                                                                  "prefix/l2r")))
            out[f"F{f}/{path}/trained"] = _estimate([float(r[k]["trainable_parameters"]) for r in rows
                                                     if "trainable_parameters" in r.get(k, {})])
            out[f"F{f}/{path}/cpu_per_step"] = _estimate([r[k]["cpu_seconds"] / r[k]["steps"] for r in rows
                                                          if k in r and r[k].get("steps")])
    out["source/infill/prefix/l2r"] = _estimate(_infill_series(rows, "source", "prefix/l2r"))
    return out


INFILL_ROWS = ("both/l2r", "both/random", "prefix/l2r")  # of `aogpt.evaluation.infill.ROWS`: what the study scores


def _infill_series(rows: list[dict[str, Any]], path: str, row: str, minus: tuple[str, str] | None = None
                   ) -> list[float]:
    """Per seed, a path's infilling score (mean bits per byte over the spans) of `row` (minus another path's
    `minus` = (path, row): the same spans, paired by seed)."""
    out = []
    for r in rows:
        x = ((r.get(path) or {}).get("infill") or {}).get(row)
        y = 0.0 if minus is None else ((r.get(minus[0]) or {}).get("infill") or {}).get(minus[1])
        if x is not None and y is not None:
            out.append(float(x) - float(y))
    return out


def fmt(e: dict[str, float] | None) -> str:
    if e is None:
        return "-"
    if e["n"] < 2:
        return f"{e['mean']:+.3f}" if e["mean"] < 0 else f"{e['mean']:.3f}"
    return f"{e['mean']:+.3f} [{e['low']:+.3f}, {e['high']:+.3f}]" if e["mean"] < 0 or e["low"] < 0 else \
        f"{e['mean']:.3f} [{e['low']:.3f}, {e['high']:.3f}]"


def _met(e: dict[str, float] | None, limit: float) -> str:
    """Whether an estimate is below `limit`: with its whole interval (2 seeds or more), or its mean only."""
    if e is None:
        return "-"
    if e["n"] < 2:
        return "yes (1 seed)" if e["mean"] < limit else "no (1 seed)"
    return "yes" if e["high"] < limit else ("mean only" if e["mean"] < limit else "no")


def _off(s: dict[str, Any], key: str) -> str:
    off = s.get(key)
    return f"{off['seeds']}/{off['n']}" if off else "-"


def _cell(rows: list[dict[str, Any]], key: str, what: str) -> str:
    vals = [r[key][what] for r in rows if key in r]
    if not vals:
        return "-"
    return "/".join(str(v) for v in vals) if what == "steps" else f"{sum(vals) / len(vals):.0f}"


def gated_table(result: dict[str, Any]) -> list[str]:
    """The gated pathway's table (docs/adapt.md leads with it): per F, each path's left-to-right and
    random-order bits per byte, the random order's difference to scratch at F and the left-to-right
    difference to the source (paired by seed), the 32-token infilling given both sides (the model's own
    order) against the source given the prefix only, the parameters trained and the CPU time per step."""
    s, rows = result["summary"], result["rows"]
    gated = [c for c in result["candidates"] if c.startswith("gated")]
    if not gated:
        return []
    lines = ["## The gated pathway", "",
             "Mean [95% interval over seeds]; differences paired by seed. Infilling: 32-token spans of the held-out "
             "text with 32 tokens each side (`aogpt eval --infill`'s cuts), bits per byte of the span; given both "
             "sides, the span read left to right (both/l2r), minus the source given the prefix only. Trained: the "
             "parameters that train (a gated pathway: the pathway alone; plain and scratch: all). CPU ms/step: "
             "training CPU time per step at one thread, under the load given above.", ""]
    src_infill = fmt(s.get("source/infill/prefix/l2r"))
    lines.append(f"Source GPT: left to right {fmt(s['source/l2r'])}; 32-token infilling given the prefix only "
                 f"{src_infill}.")
    for f in result["finetune"]:
        table = []
        for path in ("scratch", *[c for c in result["candidates"] if not c.startswith("gated")], *gated):
            k = f"F{f}/{path}"
            if s.get(f"{k}/any") is None and s.get(f"{k}/l2r") is None:
                continue
            label = f"AO-GPT from scratch ({f} steps)" if path == "scratch" else f"adapted + {path}"
            l2r_d = s.get(f"F{f}/{path}-source/l2r") if path != "scratch" else _estimate(
                _series(rows, (f"scratch/F{f}", "l2r"), ("source", "l2r")))
            any_d = s.get(f"F{f}/{path}-scratch/any") if path != "scratch" else None
            trained = s.get(f"{k}/trained")
            step = s.get(f"{k}/cpu_per_step")
            table.append([label, fmt(s.get(f"{k}/l2r")), fmt(l2r_d), fmt(s.get(f"{k}/any")), fmt(any_d),
                          fmt(s.get(f"{k}/infill/both/l2r")), fmt(s.get(f"F{f}/{path}-source/infill/both/l2r")),
                          "-" if trained is None else f"{trained['mean']:,.0f}",
                          "-" if step is None else f"{1000 * step['mean']:.0f}"])
        lines += ["", f"### F = {f}", "",
                  markdown_table(["path", "left to right", "l2r - source", "random order", "random - scratch",
                                  "infill, both sides", "infill - source (prefix)", "trained", "CPU ms/step"],
                                 table)]
    return lines + [""]


def to_markdown(result: dict[str, Any]) -> str:
    s, rows = result["summary"], result["rows"]
    S, unigram = result["steps"], result.get("unigram")
    scored = f"the first {result['eval_bytes']:,} bytes of" if result["eval_bytes"] else "all of"
    width = result.get("width", 192)
    lines = [
        "# Adapting a trained GPT to AO-GPT: fine-tuning recipes against AO-GPT from scratch",
        "",
        f"Shakespeare ({result['tokenizer']}), the {result['preset']} model at width {width}; the source GPT trained "
        f"S = {S} steps; {len(rows)} seed(s) ({', '.join(str(r['seed']) for r in rows)}), mean [95% interval over "
        "seeds, paired]. "
        f"Scored on {scored} the held-out plays in bits per byte (lower is better), EMA weights, left to right and "
        "in one random order. Every path is a run budgeted for its own steps. Steps per seed; CPU s: mean training "
        f"CPU seconds of the path at {result['threads']} thread(s) (evaluation not counted). "
        + describe_environment(result.get("environment", {})),
        "",
        f"Source GPT (S steps): left to right {fmt(s['source/l2r'])}; adapted, step 0, random order "
        f"{fmt(s['start/any'])} (left to right: the source's)."
        + (f" The unigram plateau of the scored text: {unigram:.3f}; off the plateau: a random order at most "
           f"{unigram - OFF_PLATEAU:.3f} ({OFF_PLATEAU} below)." if unigram is not None else ""),
        "",
        *gated_table(result),
    ]
    for f in result["finetune"]:
        refs = [("scratch", f"AO-GPT from scratch ({f} steps)"),
                ("scratch-sf", f"AO-GPT from scratch ({S} + {f} steps)"), ("l2r", f"source + {f} steps left to right")]
        table = [[label, _cell(rows, f"{p}/F{f}", "steps"), _cell(rows, f"{p}/F{f}", "cpu_seconds"),
                  fmt(s[f"F{f}/{p}/l2r"]), fmt(s[f"F{f}/{p}/any"]), _off(s, f"F{f}/{p}/off")]
                 for p, label in refs if any(f"{p}/F{f}" in r for r in rows)]
        table += [[f"adapted + {c}", _cell(rows, f"{c}/F{f}", "steps"), _cell(rows, f"{c}/F{f}", "cpu_seconds"),
                   fmt(s[f"F{f}/{c}/l2r"]), fmt(s[f"F{f}/{c}/any"]), _off(s, f"F{f}/{c}/off")]
                  for c in result["candidates"]]
        seeds = sorted({str(r["seed"]) for r in rows for c in result["candidates"] if f"{c}/F{f}" in r})
        lines += ["", f"## F = {f} fine-tuning steps (seeds {', '.join(seeds) or 'none yet'})", "",
                  markdown_table(["path", "steps", "CPU s", "left to right", "random order", "off the plateau"],
                                 table), ""]
        diffs = [[c, fmt(s[f"F{f}/{c}-source/l2r"]), fmt(s[f"F{f}/{c}-scratch/any"]),
                  fmt(s[f"F{f}/{c}-scratch-sf/any"]), fmt(s[f"F{f}/{c}-scratch/l2r"]),
                  fmt(s[f"F{f}/{c}-scratch-sf/l2r"]), fmt(s[f"F{f}/{c}-l2rmore/l2r"])] for c in result["candidates"]]
        lines += ["Differences (candidate minus the other path, paired by seed):", "",
                  markdown_table(["candidate", "l2r - source", f"random - scratch {f}", f"random - scratch {S}+{f}",
                                  f"l2r - scratch {f}", f"l2r - scratch {S}+{f}", "l2r - source trained on"], diffs),
                  ""]
        targets = [[c, _met(s[f"F{f}/{c}-source/l2r"], KEEP_L2R), _met(s[f"F{f}/{c}-scratch/any"], 0.0),
                    _met(s[f"F{f}/{c}-scratch-sf/any"], 0.0), _off(s, f"F{f}/{c}/off")] for c in result["candidates"]]
        lines += ["Targets (yes: met with the whole 95% interval; mean only: by the mean only):", "",
                  markdown_table(["candidate", f"l2r within +{KEEP_L2R} of source", f"random below scratch {f}",
                                  f"random below scratch {S}+{f}", f"seeds off the plateau ({OFF_PLATEAU} below)"],
                                 targets)]
    return "\n".join(lines) + "\n"


COLOURS = ("tab:blue", "tab:green", "tab:red", "tab:purple", "tab:pink", "tab:olive", "tab:cyan", "tab:gray")


def plot(result: dict[str, Any], out_png: Path) -> Path | None:
    """Both orders' held-out curves against each path's own training steps, one row per F: the source's
    S steps (left to right), the adapted candidates' F fine-tuning steps (from the adapted model at step 0),
    AO-GPT from scratch for F and for S + F steps; the unigram plateau and the off-the-plateau line."""
    from aogpt.plots import save_png

    finetune, unigram = result["finetune"], result.get("unigram")

    def paths(f: int) -> list[tuple[str, str, str, str]]:
        out = [("source", "tab:gray", "--", "source GPT"), (f"scratch/F{f}", "tab:orange", "-", f"scratch {f}"),
               (f"scratch-sf/F{f}", "tab:brown", "-", f"scratch {result['steps']}+{f}"),
               (f"l2r/F{f}", "black", ":", "source, more l2r")]
        return out + [(f"{c}/F{f}", COLOURS[i % len(COLOURS)], "-", f"adapted + {c}")
                      for i, c in enumerate(result["candidates"])]

    def draw(axes: Any) -> None:
        for row, f in enumerate(finetune):
            for col, (key, title) in enumerate((("l2r", "left to right"), ("any", "random order"))):
                ax = axes[row, col]
                for path, colour, style, label in paths(f):
                    shown = False
                    for r in result["rows"]:
                        pts = [p for p in r.get(path, {}).get("curve", []) if key in p]
                        if pts:
                            ax.plot([p["step"] for p in pts], [p[key] for p in pts], color=colour, ls=style,
                                    alpha=0.8, lw=1, label=None if shown else label,
                                    marker="." if len(pts) < 3 else None)
                            shown = True
                if key == "any" and unigram is not None:
                    ax.axhline(unigram, color="tab:gray", lw=0.6, ls=":")
                    ax.axhline(unigram - OFF_PLATEAU, color="tab:gray", lw=0.6, ls="-.")
                ax.axvline(f, color="tab:gray", lw=0.5, ls=":")
                ax.set_xlabel("training steps of the path (adapted: fine-tuning steps)")
                ax.set_ylabel("bits per byte (held-out)")
                ax.set_title(f"{title}, F = {f}")
                ax.legend(fontsize=6)

    return save_png(draw, out_png, figsize=(11, 4.0 * len(finetune)), grid=(len(finetune), 2))


__all__ = ["INFILL_ROWS", "KEEP_L2R", "OFF_PLATEAU", "gated_table", "plot", "summary", "to_markdown"]
