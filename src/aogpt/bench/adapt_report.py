"""`aogpt bench adapt`'s report: per fine-tuning length F, every path's figures over seeds, the paired
differences a researcher asks for, the targets met or not, and both orders' curves as a PNG.

Figures over seeds are means with a Student-t 95% interval (`aogpt.stats`); differences are paired by
seed (every path of a seed starts from the same source)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aogpt.bench.common import describe_environment, markdown_table
from aogpt.stats import Measurement, mean_interval

# The targets (docs/adapt.md): left to right kept within this much of the source; random order this much
# below the source's; random order within this much of the model's own left to right.
KEEP_L2R = 0.03
LEARN_ANY = 0.5
ORDER_GAP = 0.15


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
    """For each F: estimates of every path's scores, and the paired differences of every candidate."""
    rows = result["rows"]
    out: dict[str, Any] = {"source/l2r": _estimate(_series(rows, ("source", "l2r"))),
                           "start/any": _estimate(_series(rows, ("adapted_start", "any")))}
    for f in result["finetune"]:
        for path in ("l2r", "scratch", *result["candidates"]):
            for key in ("l2r", "any"):
                out[f"F{f}/{path}/{key}"] = _estimate(_series(rows, (f"{path}/F{f}", key)))
        for c in result["candidates"]:
            k = f"{c}/F{f}"
            pairs = {"scratch/any": ((k, "any"), (f"scratch/F{f}", "any")),
                     "scratch/l2r": ((k, "l2r"), (f"scratch/F{f}", "l2r")),
                     "source/l2r": ((k, "l2r"), ("source", "l2r")),
                     "l2rmore/l2r": ((k, "l2r"), (f"l2r/F{f}", "l2r")),
                     "start/any": ((k, "any"), ("adapted_start", "any")),
                     "own/any": ((k, "any"), (k, "l2r"))}
            for name, (x, y) in pairs.items():
                out[f"F{f}/{c}-{name}"] = _estimate(_series(rows, x, y))
    return out


def fmt(e: dict[str, float] | None) -> str:
    if e is None:
        return "-"
    if e["n"] < 2:
        return f"{e['mean']:.3f}"
    return f"{e['mean']:+.3f} [{e['low']:+.3f}, {e['high']:+.3f}]" if e["mean"] < 0 or e["low"] < 0 else \
        f"{e['mean']:.3f} [{e['low']:.3f}, {e['high']:.3f}]"


def _met(e: dict[str, float] | None, limit: float) -> str:
    """Whether an estimate is below `limit`: with its whole interval (3 seeds or more), or its mean only."""
    if e is None:
        return "-"
    if e["n"] < 2:
        return "yes (1 seed)" if e["mean"] < limit else "no (1 seed)"
    return "yes" if e["high"] < limit else ("mean only" if e["mean"] < limit else "no")


def _cell(rows: list[dict[str, Any]], key: str, what: str) -> str:
    vals = [r[key][what] for r in rows if key in r]
    if not vals:
        return "-"
    return "/".join(str(v) for v in vals) if what == "steps" else f"{sum(vals) / len(vals):.0f}"


def to_markdown(result: dict[str, Any]) -> str:
    s, rows = result["summary"], result["rows"]
    S = result["steps"]
    scored = f"the first {result['eval_bytes']:,} bytes of" if result["eval_bytes"] else "all of"
    lines = [
        "# Adapting a trained GPT to AO-GPT: fine-tuning recipes against AO-GPT from scratch at equal compute",
        "",
        f"Shakespeare ({result['tokenizer']}), the {result['preset']} model size; the source GPT trained S = {S} "
        f"steps; {len(rows)} seed(s) ({', '.join(str(r['seed']) for r in rows)}), mean [95% interval over seeds, "
        "paired]. "
        f"Scored on {scored} the held-out plays in bits per byte (lower is better), EMA weights, left to right and "
        "in one random order. Steps per seed; CPU s: mean training CPU seconds of the path at "
        f"{result['threads']} thread(s) (evaluation not counted). "
        + describe_environment(result.get("environment", {})),
        "",
        f"Source GPT (S steps): left to right {fmt(s['source/l2r'])}; adapted, step 0, random order "
        f"{fmt(s['start/any'])} (left to right: the source's).",
    ]
    for f in result["finetune"]:
        table = [[f"source + {f} steps left to right", _cell(rows, f"l2r/F{f}", "steps"),
                  _cell(rows, f"l2r/F{f}", "cpu_seconds"), fmt(s[f"F{f}/l2r/l2r"]), "-"],
                 [f"AO-GPT from scratch ({S} + {f} steps)", _cell(rows, f"scratch/F{f}", "steps"),
                  _cell(rows, f"scratch/F{f}", "cpu_seconds"), fmt(s[f"F{f}/scratch/l2r"]),
                  fmt(s[f"F{f}/scratch/any"])]]
        table += [[f"adapted + {c}", _cell(rows, f"{c}/F{f}", "steps"), _cell(rows, f"{c}/F{f}", "cpu_seconds"),
                   fmt(s[f"F{f}/{c}/l2r"]), fmt(s[f"F{f}/{c}/any"])] for c in result["candidates"]]
        seeds = [str(r["seed"]) for r in rows if f"scratch/F{f}" in r]
        lines += ["", f"## F = {f} fine-tuning steps (seeds {', '.join(seeds) or 'none yet'})", "",
                  markdown_table(["path", "steps", "CPU s", "left to right", "random order"], table), ""]
        diffs = [[c, fmt(s[f"F{f}/{c}-source/l2r"]), fmt(s[f"F{f}/{c}-l2rmore/l2r"]), fmt(s[f"F{f}/{c}-scratch/l2r"]),
                  fmt(s[f"F{f}/{c}-scratch/any"]), fmt(s[f"F{f}/{c}-start/any"]), fmt(s[f"F{f}/{c}-own/any"])]
                 for c in result["candidates"]]
        lines += ["Differences (candidate minus the other path, paired by seed):", "",
                  markdown_table(["candidate", "l2r - source", "l2r - source trained on", "l2r - scratch",
                                  "random - scratch", "random - source's random", "random - own l2r"], diffs), ""]
        targets = [[c, _met(s[f"F{f}/{c}-source/l2r"], KEEP_L2R), _met(s[f"F{f}/{c}-scratch/any"], 0.0),
                    _met(s[f"F{f}/{c}-start/any"], -LEARN_ANY), _met(s[f"F{f}/{c}-own/any"], ORDER_GAP)]
                   for c in result["candidates"]]
        lines += ["Targets (met with the whole 95% interval: yes; by the mean only: mean only):", "",
                  markdown_table(["candidate", f"l2r within +{KEEP_L2R} of source", "random below scratch",
                                  f"random {LEARN_ANY} below source's", f"random within {ORDER_GAP} of own l2r"],
                                 targets)]
    return "\n".join(lines) + "\n"


COLOURS = ("tab:blue", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")


def plot(result: dict[str, Any], out_png: Path) -> Path | None:
    """Both orders' held-out curves against training steps (source + fine-tuning), the longest F."""
    from aogpt.plots import save_png

    f, S = max(result["finetune"]), result["steps"]
    paths = [("source", "tab:gray", 0), (f"l2r/F{f}", "black", S), (f"scratch/F{f}", "tab:orange", 0)]
    paths += [(f"{c}/F{f}", COLOURS[i % len(COLOURS)], S) for i, c in enumerate(result["candidates"])]

    def draw(axes: Any) -> None:
        for ax, key, title in ((axes[0, 0], "l2r", "left to right"), (axes[0, 1], "any", "random order")):
            for path, colour, offset in paths:
                for i, r in enumerate(result["rows"]):
                    pts = [p for p in r.get(path, {}).get("curve", []) if key in p]
                    if pts:
                        label = path.split("/")[0].replace("l2r", "source, more l2r") if i == 0 else None
                        ax.plot([offset + p["step"] for p in pts], [p[key] for p in pts], color=colour, alpha=0.8,
                                label=label, marker="." if len(pts) < 3 else None)
            ax.axvline(S, color="tab:gray", lw=0.5, ls=":")
            ax.set_xlabel("training steps (the source's, then fine-tuning)")
            ax.set_ylabel("bits per byte (held-out)")
            ax.set_title(f"{title} (F = {f})")
            ax.legend(fontsize=7)

    return save_png(draw, out_png, figsize=(11, 4.4), grid=(1, 2))


__all__ = ["summary", "to_markdown", "plot", "KEEP_L2R", "LEARN_ANY", "ORDER_GAP"]
