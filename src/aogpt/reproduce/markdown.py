"""The reproduction report as markdown: the same dictionary as DIR/report.json, rendered."""

from __future__ import annotations

from typing import Any

from aogpt.progress import duration
from aogpt.reproduce.findings import ANNEALING, ENSEMBLE_SIZES

MARK = {"reproduced": "reproduced", "not reproduced": "**not reproduced**",
        "inconclusive": "inconclusive at this scale"}


def _num(entry: dict[str, Any] | None, digits: int = 4) -> str:
    """``1.2345 [1.2000, 1.2690]`` from {"mean", "interval"}."""
    if not entry or entry.get("mean") is None:
        return "-"
    text = f"{entry['mean']:.{digits}f}"
    if entry.get("interval"):
        lo, hi = entry["interval"]
        text += " (exact)" if lo == hi else f" [{lo:.{digits}f}, {hi:.{digits}f}]"
    return text


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|",
            *("| " + " | ".join(r) + " |" for r in rows), ""]


def _check_row(c: dict[str, Any]) -> list[str]:
    est = c["estimate"]
    if c["rule"] == "within":
        rule = f"A - B < {c['margin']:g}"
    else:
        rule = "B - A > 0"
    if est.get("exact"):
        value, units = f"{est['value']:.4f} (exact)", "exact"
    else:
        value = f"{est['value']:.4f}" + (f" [{est['low']:.4f}, {est['high']:.4f}]" if est.get("low") is not None
                                          else " (no interval)")
        units = f"{est['n']} {est['units']}"
    return [c["claim"], c["a"]["label"], _num(c["a"]), c["b"]["label"], _num(c["b"]), f"{rule}: {value}", units,
            MARK.get(c["verdict"], c["verdict"])]


def _runs_table(runs: list[dict[str, Any]]) -> list[str]:
    cols = [k for k in ("l2r early", "l2r final", "any early", "any final", "own early", "own final")
            if any(k in r for r in runs)]
    names = {"l2r": "left-to-right", "any": "any-order", "own": "own order"}
    headers = ["run", "training order", *(f"{names[c.split()[0]]} ({c.split()[1]})" for c in cols)]
    return _table(headers, [[r["label"], f"`{r['order']}`", *(_num(r.get(c)) for c in cols)] for r in runs])


def _extra(f: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if f["key"] == "f6":
        t = f["table"]
        rows = [[f"decoder, M = {m}", _num(t[f"decoder M={m}"])] for m in ENSEMBLE_SIZES]
        rows.append(["encoder-only MDM", _num(t["encoder"])])
        lines += ["Any-order NLL per token (mean [95% interval]):", "", *_table(["model", "NLL"], rows)]
    if f["key"] == "genppl":
        t = f["table"]
        rows = []
        for setting, top_p, temp in ANNEALING:
            a, e = t[f"aogpt {setting}"], t[f"encoder {setting}"]
            rows.append([f"{setting} (top-p {top_p}, temp {temp})", f"{a['genppl']:.2f}", f"{e['genppl']:.2f}",
                         _num(a, 3), _num(e, 3), f"{a['entropy']:.2f} / {e['entropy']:.2f}"])
        lines += _table(["annealing", "AO-GPT gen. ppl", "encoder gen. ppl", "AO-GPT NLL/token",
                         "encoder NLL/token", "entropy AO-GPT / encoder"], rows)
    if f["key"] == "speed":
        sec, slots, pad = f["seconds"], f["slots"], f["padded_slots"]

        def cell(table: dict, m: str, t: int, fmt: str) -> str:
            return format(table[m][str(t)], fmt) if str(t) in table.get(m, {}) else "-"

        rows = [[str(t), *(cell(sec, m, t, ".4f") for m in ("aogpt", "encoder", "gpt")),
                 *(f"{cell(slots, m, t, 'd')} (+{cell(pad, m, t, 'd')} padded)" for m in ("aogpt", "encoder"))]
                for t in f["steps"]]
        lines += [f"Batch of {f['batch']}, n = {f['n']}: median seconds, and slot evaluations (positions run "
                  "through the model; padding computed beside them in parentheses). GPT runs n steps only.", "",
                  *_table(["steps T", "AO-GPT s", "encoder s", "GPT s", "AO-GPT slots", "encoder slots"], rows),
                  f"AO-GPT's speed-up over the encoder at T = n: {_num(f['speedup_at_n'], 2)}x "
                  f"({f['rounds']} interleaved timing rounds).", ""]
    if f["key"] == "infill":
        from aogpt.reproduce.infill import markdown

        lines += markdown(f)
    if f["key"] == "orders":
        rows = [[r["label"], f"`{r['order']}`", r["theta"], _num(r["l2r"]), _num(r["any"])] for r in f["sweep"]]
        lines += ["Final NLL per token of each trained model (mean [95% interval]):", "",
                  *_table(["run", "order", "theta", "left-to-right NLL", "any-order NLL"], rows)]
    return lines


def to_markdown(report: dict[str, Any]) -> str:
    s, m = report["scale"], report["machine"]
    budget = (report.get("request") or {}).get("budget_minutes")
    name = f"{s['name']}, steps fitted to a {budget:g}-minute budget on this machine" if budget else s["name"]
    load = m.get("load_average")
    threads = f"{m['threads']} thread" + ("s" if m["threads"] != 1 else "")
    load_text = f"; load average {' / '.join(f'{x:.2f}' for x in load)} (1 / 5 / 15 minutes) at the end" if load else ""
    lines = ["# The paper's findings, reproduced at small scale", "",
             f"**Scale** ({name}): {s['description']}. Every model of a comparison has this size, the same "
             "data (the bundled Shakespeare plays; the validation plays held out) and the same number of steps.", "",
             f"**Seeds**: {', '.join(map(str, report['seeds']))}. **Machine**: {m['device']}, {threads} "
             f"on {m['cpus']} CPUs, torch {m['torch']}; wall time {duration(report['wall_seconds'])} for this "
             f"invocation (reruns skip finished work){load_text}.", "",
             f"**How verdicts are decided.** {report['rule']}", "", "## Summary", ""]
    rows = []
    for f in report["findings"]:
        counts = {}
        for c in f["checks"]:
            counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
        tally = ", ".join(f"{v} {k}" for k, v in counts.items()) or "-"
        n = len(f.get("seeds") or report["seeds"])
        rows.append([f"[{f['title']}](#{f['key']})", MARK.get(f["verdict"], f["verdict"]), tally,
                     "one seed" if n == 1 else f"{n} seeds"])
    lines += _table(["finding", "verdict", "checks", "decided over"], rows)
    for note in report.get("notes", []):
        lines.append(f"- {note}")
    for f in report["findings"]:
        lines += [f'<a id="{f["key"]}"></a>', f"## {f['title']}", "", f"**Paper:** {f['claim']}", ""]
        if f.get("notes"):
            lines += [f"*Setup:* {f['notes']}", ""]
        lines += [f"**Verdict:** {MARK.get(f['verdict'], f['verdict'])}.", ""]
        seeds = f.get("seeds") or report["seeds"]
        if f["checks"] and len(seeds) == 1:
            lines += [f"*One seed ({seeds[0]}):* this verdict rests on one training run per model; its intervals "
                      "are over evaluation batches, sequences, samples or timing rounds, not over seeds, so another "
                      "seed could decide it otherwise.", ""]
        elif f["checks"]:
            lines += [f"*{len(seeds)} seeds ({', '.join(map(str, seeds))}):* intervals over seeds.", ""]
        if f["checks"]:
            lines += _table(["claim", "A", "A (mean [95%])", "B", "B (mean [95%])", "rule: estimate [95%]",
                             "units", "verdict"], [_check_row(c) for c in f["checks"]])
        for fig in f.get("figures", []):
            lines += [f"![{f['key']}]({fig})", ""]
        if f.get("runs") and f["key"] != "orders":
            lines += ["Validation losses (nats per token, EMA weights; early = mean of the validations in the "
                      "first half of training):", "", *_runs_table(f["runs"])]
        lines += _extra(f)
    return "\n".join(line for line in lines) + "\n"
