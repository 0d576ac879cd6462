"""The generation-speed figure in the style of the paper's Figure 5: time against steps, log scale."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aogpt.plots import save_png

STYLE = {  # method -> (label, colour, marker, line style)
    "aogpt": ("AO-GPT (KV cache + Lemma 4.1)", "tab:red", "o", "-"),
    "aogpt-count": ("AO-GPT (KV cache, count schedule)", "tab:orange", "v", "-"),
    "aogpt-nocache": ("AO-GPT without KV cache", "tab:pink", "s", "--"),
    "encoder": ("encoder-only MDM (no-op skipping)", "tab:blue", "D", "-"),
    "encoder-noskip": ("encoder-only MDM (no skipping)", "tab:cyan", "^", "--"),
    "encoder-est": ("encoder-only MDM (estimated: T x one pass)", "tab:blue", "D", ":"),
}
AT_N = {"gpt": ("our GPT (KV cache, n steps)", "0.2", "*"),
        "hf-gpt2": ("transformers GPT-2 (n steps)", "tab:green", "P")}


def plot_generation(result: dict[str, Any], out_png: Path) -> Path | None:
    """Seconds per batch against generation steps T (log-log); the one-token-per-step models at T = n
    as reference lines. Never raises (`aogpt.plots.save_png`)."""
    steps = result["steps"]

    def draw(ax: Any) -> None:
        for method, times in result["seconds"].items():
            if method in AT_N or not times:
                continue
            label, color, marker, ls = STYLE.get(method, (method, None, "o", "-"))
            pts = [(t, times[str(t)]) for t in steps if times.get(str(t)) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), ls, marker=marker, color=color, label=label)
        for method, (label, color, marker) in AT_N.items():
            t = result["seconds"].get(method, {}).get(str(result["n"]))
            if t is not None:
                ax.axhline(t, color=color, ls=":", lw=1)
                ax.plot([result["n"]], [t], marker, color=color, ms=10, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(steps, [str(t) for t in steps])
        ax.set_xlabel("generation steps T")
        ax.set_ylabel(f"seconds per batch of {result['batch']}")
        env = result.get("environment", {})
        ax.set_title(f"Generation time, n = {result['n']}, batch {result['batch']} ({env.get('device', '?')})",
                     fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)

    return save_png(draw, out_png)
