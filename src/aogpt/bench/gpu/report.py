"""The report of `aogpt bench gpu`: DIR/gpu.md, DIR/gpu.json and DIR/gpu-figure5.png, and the plan
`--dry-run` prints. Written as the run goes (`aogpt.bench.gpu.run.Run.save`), so each file always holds
every part finished so far."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from aogpt.bench.common import markdown_table
from aogpt.bench.gpu.plan import LIMIT_S, PARTS, TITLES, Plan

STATUS = {"passed": "passed", "failed": "**FAILED**", "error": "**ERROR**", "skipped": "skipped",
          "running": "running (stopped here if the run was cut short)", "pending": "not run"}


def write_report(out: Path, summary: dict[str, Any]) -> dict[str, str]:
    """Write the markdown and JSON (atomically), and the PNG once Figure 5 has a result; the paths written."""
    from aogpt.bench.common import write_outputs

    files = write_outputs(out, "gpu", to_markdown(summary), summary)
    generate = summary["parts"].get("figure5", {}).get("metrics", {}).get("generate")
    if generate:
        png = plot_figure5(generate, Path(out) / "gpu-figure5.png")
        if png is not None:
            files["png"] = str(png)
    return files


def _verdict(summary: dict[str, Any]) -> str:
    if not summary["finished"]:
        running = [n for n, p in summary["parts"].items() if p["status"] == "running"]
        return f"running ({', '.join(running) or 'starting'}): the report so far"
    return "**passed**" if summary["passed"] else "**FAILED**"


def to_markdown(summary: dict[str, Any]) -> str:
    env, checks, est = summary["environment"], summary["checks"], summary["estimate"]
    where = env.get("gpu") or f"{env['device']} ({env.get('cpu') or 'CPU'})"
    so_far = "in all" if summary["finished"] else "so far"
    lines = [
        "# GPU check (`aogpt bench gpu" + (" --quick" if summary["quick"] else "") + "`)", "",
        f"Result: {_verdict(summary)}. {checks['passed']} checks passed, {checks['failed']} failed, "
        f"{checks['skipped']} skipped. On {where}, started {summary['started']}, {summary['seconds']:.0f} s {so_far}"
        f" (the plan's estimate at H100 rates: {est['total_seconds']:.0f} s; limit {LIMIT_S:.0f} s).", "",
        "## Device and versions", "",
        markdown_table(["what", "value"], [[k, str(v)] for k, v in env.items()]), "",
        "## Parts", "",
        markdown_table(["part", "status", "time", "share", "estimate"],
                       [[TITLES.get(n, n), STATUS.get(p["status"], p["status"]),
                         "-" if p["seconds"] is None else f"{p['seconds']:.0f} s", f"{p['share_s']:.0f} s",
                         f"{est['parts'][n]['seconds']:.0f} s" if n in est["parts"] else "-"]
                        for n, p in summary["parts"].items()]), ""]
    for i, (name, part) in enumerate(summary["parts"].items(), 1):
        lines += [f"## {i}. {TITLES.get(name, name)}: {STATUS.get(part['status'], part['status'])}", ""]
        if part["error"]:
            lines += [f"{'Skipped' if part['status'] == 'skipped' else 'Error'}: {part['error']}", ""]
        if part["checks"]:
            lines += [markdown_table(["check", "value", "bound", "result", "note"],
                                     [[c["name"], _value(c["value"]), c["bound"],
                                       {True: "pass", False: "**FAIL**", None: "skipped"}[c["passed"]], c["note"]]
                                      for c in part["checks"]]), ""]
        lines += [*part["lines"], ""] if part["lines"] else []
    return "\n".join(lines).rstrip()


def _value(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def plot_figure5(result: dict[str, Any], out_png: Path) -> Path | None:
    """Two panels: seconds per batch against T (the paper's Figure 5) and milliseconds per step against
    T; the one-token-per-step models (our GPT, transformers' GPT-2) as points at T = n."""
    from aogpt.bench.plot import AT_N, STYLE
    from aogpt.plots import pyplot, save_png

    pyplot()  # the headless backend, before matplotlib's ticker is imported
    from matplotlib.ticker import FuncFormatter

    steps, n = result["steps"], result["n"]

    def panel(ax: Any, key: str, ylabel: str, scale: float) -> None:
        for method, values in result.get(key, {}).items():
            if method in AT_N or not values:
                continue
            label, color, marker, ls = STYLE.get(method, (method, None, "o", "-"))
            pts = [(t, values[str(t)] * scale) for t in steps if values.get(str(t)) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), ls, marker=marker, color=color, label=label)
        for method, (label, color, marker) in AT_N.items():
            v = result.get(key, {}).get(method, {}).get(str(n))
            if v is not None:
                ax.axhline(v * scale, color=color, ls=":", lw=1)
                ax.plot([n], [v * scale], marker, color=color, ms=10, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(steps, [str(t) for t in steps])
        ax.set_xlabel("generation steps T")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(_two_and_five))

    def draw(axes: Any) -> None:
        panel(axes[0, 0], "seconds", f"seconds per batch of {result['batch']}", 1.0)
        panel(axes[0, 1], "ms_per_step", "milliseconds per step", 1.0)
        axes[0, 0].legend(fontsize=7)
        env = result.get("environment", {})
        axes[0, 0].set_title(f"n = {n}, batch {result['batch']}, {env.get('gpu', env.get('device', '?'))}",
                             fontsize=9)
        axes[0, 1].set_title(f"{result['size']['n_layer']} layers, width {result['size']['n_embd']}, "
                             f"{result.get('precision', '')}", fontsize=9)

    return save_png(draw, out_png, figsize=(11, 4.4), grid=(1, 2))


def _two_and_five(value: float, _pos: Any = None) -> str:
    """Minor log ticks labelled at 2 and 5 times a power of ten only (the rest stay unlabelled)."""
    if value <= 0:
        return ""
    lead = round(value / 10 ** math.floor(math.log10(value)))
    return f"{value:g}" if lead in (2, 5) else ""


def plan_markdown(plan: Plan, est: dict[str, Any]) -> str:
    """What `--dry-run` prints: every part's sizes and counts, its estimate and share, and the total."""
    f = plan.fig_size
    what = {
        "correctness": f"attention {plan.attention_shape} (batch, heads, length, head size) vs float64; KV cache "
                       f"{plan.cache_size.n_layer}x{plan.cache_size.n_embd}, n = {plan.cache_n}, {plan.cache_steps} "
                       f"Bernoulli steps; law test {plan.law_samples:,} samples; likelihood "
                       f"{plan.likelihood_size.n_layer}x{plan.likelihood_size.n_embd}, {plan.likelihood_batch} x "
                       f"{plan.likelihood_n}; 2 training steps, batch {plan.step_batch} x {plan.step_block}; a "
                       "checkpoint",
        "figure5": f"{f.n_layer} layers / {f.n_embd} / {f.n_head} heads / vocab {f.vocab_size:,}, n = {plan.fig_n}, "
                   f"batch {plan.fig_batch}, T = {', '.join(map(str, plan.fig_steps))}; "
                   f"{', '.join(plan.fig_methods)}; up to {plan.fig_repeats} repeats (runs over "
                   f"{plan.fig_long_run:g} s once)",
        "training": f"{plan.train_size.n_layer} layers / {plan.train_size.n_embd} / vocab "
                    f"{plan.train_size.vocab_size:,}, batch {plan.train_batch} x {plan.train_block}, bf16, "
                    f"{'compiled' if plan.train_compile else 'not compiled'}, {plan.train_warmup} + up to "
                    f"{plan.train_steps} steps each of gpt and aogpt",
        "distributed": f"torchrun, DDP and FSDP2, {plan.dist_steps} steps, {', '.join(plan.dist_dtypes)}, "
                       f"{plan.dist_size.n_layer} layers / {plan.dist_size.n_embd}, batch {plan.dist_batch} x "
                       f"{plan.dist_block}",
    }
    rows = [[TITLES[p], what[p], f"{est['parts'][p]['seconds']:.0f} s", f"{plan.shares[p]:.0f} s"] for p in PARTS]
    a = est["assumptions"]
    lines = [
        f"# Plan of `aogpt bench gpu`{' --quick' if plan.quick else ''}", "",
        f"Estimated at {est['rates']['name']}, derated to {a['matmul_share']:.0%} of the matmul peak and "
        f"{a['bytes_share']:.0%} of the bandwidth, plus {a['launch_s'] * 1e6:.0f} µs per kernel launched; compile "
        f"times and start-ups assumed (GPT {a['compile_gpt']:.0f} s, AO-GPT {a['compile_aogpt']:.0f} s, a torchrun "
        f"launch {a['torchrun']:.0f} s, start-up {a['startup']:.0f} s).", "",
        markdown_table(["part", "what", "estimate", "time share"], rows), "",
        f"Total: {est['total_seconds']:.0f} s estimated (shares {est['shares_total']:.0f} s, start-up included) "
        f"against the limit of {est['limit_seconds']:.0f} s: "
        + ("fits." if est["fits"] else "**does not fit**"
           + (f" ({', '.join(est['over_share'])} over its share)." if est["over_share"] else ".")), "",
        "Figure 5 runs (estimated seconds per run, repeats):", "",
        markdown_table(["contender", "T", "seconds", "repeats"],
                       [[r["method"], str(r["T"]), f"{r['seconds']:.2f}", str(r["repeats"])]
                        for r in est["parts"]["figure5"]["runs"]]),
    ]
    return "\n".join(lines)
