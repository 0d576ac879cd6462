"""Ratios and the markdown report of `aogpt bench generate`, in users' words.

Every ratio divides two medians measured side by side in the same run; nothing is compared with
figures measured elsewhere. The paper's own result is quoted for orientation, with its setting.
"""

from __future__ import annotations

from typing import Any

from aogpt.bench.common import fmt_ratio, fmt_seconds, markdown_table
from aogpt.bench.environment import describe_environment

PAPER = ("the paper reports about 25x for AO-GPT against SEDD, an encoder-only MDM, at n = 1024 and batch 32 "
         "on a GPU (its Figure 5 and Finding 8.1)")
PER_T = (("encoder/aogpt", "encoder ÷ AO-GPT"), ("encoder-est/aogpt", "encoder (est.) ÷ AO-GPT"),
         ("aogpt-nocache/aogpt", "no cache ÷ cache"), ("encoder-noskip/encoder", "no skip ÷ skip"))
AT_N = ("aogpt/gpt", "aogpt-count/gpt", "aogpt/hf-gpt2", "aogpt-count/hf-gpt2", "gpt/hf-gpt2",
        "aogpt-reference/aogpt", "gpt-reference/gpt")


def _get(result: dict[str, Any], key: str, method: str, T: int) -> float | None:
    return result[key].get(method, {}).get(str(T))


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def ratios(result: dict[str, Any], key: str = "seconds") -> dict[str, dict[str, float | None]]:
    """Per T the per-step ratios (PER_T); under "n" the ratios of contenders at T = n (AT_N)."""
    n = result["n"]
    out: dict[str, dict[str, float | None]] = {}
    for T in result["steps"]:
        out[str(T)] = {name: _ratio(_get(result, key, name.split("/")[0], T), _get(result, key, name.split("/")[1], T))
                       for name, _ in PER_T}
    out["n"] = {}
    for name in AT_N:
        a, b = name.split("/")
        out["n"][name] = _ratio(_get(result, key, a, n), _get(result, key, b, n))
    return out


def findings(result: dict[str, Any]) -> list[str]:
    """One sentence per ratio that was measured, by wall time (CPU time in brackets)."""
    n, r, c, lines = result["n"], result["ratios"], result["cpu_ratios"], []
    T = max(result["steps"])

    def both(part: str, name: str) -> str | None:
        wall, cpu = r[part].get(name), c[part].get(name)
        return None if wall is None else f"{fmt_ratio(wall)} (CPU time {fmt_ratio(cpu)})"

    for name, what in (("encoder/aogpt", "measured"), ("encoder-est/aogpt", "estimated as T x one timed pass")):
        got = both(str(T), name)
        if got:
            lines.append(f"- The encoder-only MDM ({what}) took {got} as long as AO-GPT with its KV cache and "
                         f"Lemma 4.1 at T = {T}, n = {n}, batch {result['batch']}; {PAPER}.")
    said = {"aogpt/gpt": "AO-GPT (Bernoulli, T = n) ÷ our left-to-right GPT with its KV cache",
            "aogpt-count/gpt": "AO-GPT (one token per step) ÷ our GPT",
            "aogpt/hf-gpt2": "AO-GPT (Bernoulli, T = n) ÷ transformers GPT-2 generate()",
            "aogpt-count/hf-gpt2": "AO-GPT (one token per step) ÷ transformers GPT-2 generate()",
            "gpt/hf-gpt2": "our GPT ÷ transformers GPT-2 generate()",
            "aogpt-reference/aogpt": "AO-GPT (Bernoulli, T = n) on the reference decode path ÷ on the fast one "
                                     "(the speed-up of the decode path)",
            "gpt-reference/gpt": "our GPT on the reference decode path ÷ on the fast one (the speed-up)"}
    for name in AT_N:
        got = both("n", name)
        if got:
            lines.append(f"- {said[name]}: {got}.")
    got = both(str(T), "aogpt-nocache/aogpt")
    if got:
        lines.append(f"- The KV cache makes AO-GPT {got} faster than recomputing every step at T = {T}.")
    roof = result.get("roofline", {})
    for m, name in (("gpt", "Our GPT's step"), ("aogpt", "AO-GPT's Bernoulli step")):
        x = roof.get(m, {}).get(str(n))
        if x:
            wall, cpu = result["ms_per_step"][m][str(n)], result["cpu_ms_per_step"][m][str(n)]
            limit, tight = x["limit_s"] * 1e3, x["limit_working_set_s"] * 1e3
            lines.append(f"- {name} at T = n takes {wall / limit:.1f}x (CPU time {cpu / limit:.1f}x) its roofline "
                         f"({limit:.2f} ms: {x['bytes']['total'] / 1e6:.1f} MB at the memory's read rate), and "
                         f"{wall / tight:.1f}x ({cpu / tight:.1f}x) the tighter one at the rate measured for a "
                         f"buffer of that size ({tight:.2f} ms).")
    return lines


def _precisions(result: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(precision, report) pairs of one length's result."""
    if "by_dtype" in result:
        return [(d, result["by_dtype"][d]) for d in result["dtypes"]]
    return [(result.get("dtype", "auto"), result)]


def across_lengths(result: dict[str, Any]) -> list[str]:
    """The summary of a run at several lengths: per n, T and precision the milliseconds per step,
    and the ratios at T = n; then a sentence on how the encoder's cost over AO-GPT's grows with n."""
    rows, growth = [], {}
    for n in result["lengths"]:
        for d, r in _precisions(result["by_n"][str(n)]):
            for T in sorted(r["steps"], reverse=True):
                ms = r.get("ms_per_step", {})
                enc = r["ratios"][str(T)].get("encoder/aogpt") or r["ratios"][str(T)].get("encoder-est/aogpt")
                est = T in r.get("encoder_estimated", {}).get("encoder", []) or (
                    r["ratios"][str(T)].get("encoder/aogpt") is None and enc is not None)
                rows.append([str(n), str(T), d, *[_ms(ms.get(m, {}).get(str(T))) for m in ("aogpt", "gpt")],
                             fmt_ratio(enc) + (" (est.)" if est and enc is not None else ""),
                             fmt_ratio(r["ratios"]["n"].get("aogpt/gpt")) if T == n else ""])
                if T == n and enc is not None:
                    growth.setdefault(d, []).append((n, enc))
    lines = ["# Generation speed at several lengths", "",
             "Milliseconds per decode step (AO-GPT: Lemma 4.1 Bernoulli steps; GPT: one token per step) and the "
             "encoder-only MDM's time over AO-GPT's, per length n, steps T and precision; each length timed in its "
             "own interleaved rounds (details below).", "",
             markdown_table(["n", "T", "precision", "AO-GPT ms/step", "GPT ms/step", "encoder ÷ AO-GPT",
                             "AO-GPT ÷ GPT (T = n)"], rows), ""]
    for d, pts in growth.items():
        if len(pts) > 1:
            (n0, r0), (n1, r1) = pts[0], pts[-1]
            lines.append(f"- In {d}, at T = n the encoder takes {fmt_ratio(r0)} AO-GPT's time at n = {n0} and "
                         f"{fmt_ratio(r1)} at n = {n1}: the encoder evaluates T x n slots (every position at every "
                         "step), AO-GPT with its KV cache about 2n in all, so the gap widens with n (the paper's "
                         "Finding 7).")
    for n in result["lengths"]:
        lines += ["", f"## n = {n}", "", to_markdown(result["by_n"][str(n)]).split("\n", 1)[1].lstrip()]
    return lines


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def to_markdown(result: dict[str, Any]) -> str:
    """The report of one precision, or with several (``by_dtype``) their times side by side, then
    each precision's report; with several lengths (``by_n``) a summary across them first."""
    if "by_n" in result:
        return "\n".join(across_lengths(result)).rstrip()
    if "by_dtype" not in result:
        return _one_precision(result)
    dtypes, by = result["dtypes"], result["by_dtype"]
    first = dtypes[0]
    keys = [(m, T) for m in result["methods"] for T in by[first]["seconds"][m]
            if all(T in by[d]["seconds"][m] for d in dtypes)]  # the encoder may run in one, be estimated in another
    rows = [[m, T, *[f"{fmt_seconds(by[d]['seconds'][m][T])} / {fmt_seconds(by[d]['cpu_seconds'][m][T])}"
                     for d in dtypes],
             *[f"{fmt_ratio(result['dtype_ratios'][d][m][T])} / "
               f"{fmt_ratio(by[d]['cpu_seconds'][m][T] / by[first]['cpu_seconds'][m][T])}" for d in dtypes[1:]]]
            for m, T in keys]
    lines = ["# Generation speed by precision", "",
             "Every contender in every precision timed in the same interleaved rounds (wall / CPU time, medians). "
             + "; ".join(f"{d}: {by[d]['precision_why']}" for d in dtypes) + ".", "",
             markdown_table(["contender", "T", *[f"{d} (wall / CPU)" for d in dtypes],
                             *[f"{d} ÷ {first} (wall / CPU)" for d in dtypes[1:]]], rows), ""]
    for d in dtypes:
        lines += [f"## In {by[d]['precision']} ({d})", "", _one_precision(by[d]).split("\n", 1)[1].lstrip(), ""]
    return "\n".join(lines).rstrip()


def _one_precision(result: dict[str, Any]) -> str:
    methods = [m for m in result["methods"] if m not in ("gpt", "hf-gpt2")]
    size, env = result["size"], result["environment"]
    columns = [(key, label) for key, label in PER_T if all(m in result["methods"] for m in key.split("/"))]
    headers = ["T"] + [f"{m} (wall / CPU)" for m in methods] + [label for _, label in columns]
    rows = [[str(T)] + [f"{fmt_seconds(_get(result, 'seconds', m, T))} / "
                        f"{fmt_seconds(_get(result, 'cpu_seconds', m, T))}" for m in methods]
            + [fmt_ratio(result["ratios"][str(T)][key]) for key, _ in columns] for T in result["steps"]]
    lines = [
        "# Generation speed (the paper's Figure 5)",
        "",
        f"Seconds to generate a batch of {result['batch']} sequences of n = {result['n']} tokens (wall / CPU time), "
        f"median of {result['repeats']} interleaved runs (runs over {result['long_run_s']:g} s are not repeated), "
        f"sampling with top-p {result['top_p']:g}, temperature {result['temperature']:g}. Models of equal size: "
        f"{size['n_layer']} layers, width {size['n_embd']}, {size['n_head']} heads, vocabulary {size['vocab_size']}"
        f" ({'checkpoints: ' + ', '.join(result['checkpoints']) if result['checkpoints'] else 'random weights'})"
        + (f", weights in {result['precision']} ({result['precision_why']})." if "precision" in result else "."),
        describe_environment(env),
        "",
        markdown_table(headers, rows),
        "",
        "One token per step (T = n):",
        "",
        markdown_table(["contender", "wall", "CPU"],
                       [[result["labels"][m], fmt_seconds(_get(result, "seconds", m, result["n"])),
                         fmt_seconds(_get(result, "cpu_seconds", m, result["n"]))]
                        for m in result["methods"] if _get(result, "seconds", m, result["n"]) is not None]),
        "",
        *_per_step(result),
        "Work done (forward passes; slot evaluations: real + padding):",
        "",
        markdown_table(["contender", *[f"T = {T}" for T in result["steps"]]],
                       [[m, *[_work(result, m, T) for T in result["steps"]]] for m in result["methods"]
                        if result["forwards"].get(m)]),
        "",
        "What this run shows:",
        *findings(result),
    ]
    for T in result.get("encoder_estimated", {}).get("encoder", []):
        lines.append(f"- The encoder at T = {T} was estimated as T x one timed pass (a run would take over "
                     f"{result['encoder_limit_s']:g} s).")
    for m, why in result.get("skipped", {}).items():
        lines.append(f"- {m} was not run: {why}.")
    return "\n".join(lines)


def _per_step(result: dict[str, Any]) -> list[str]:
    """Milliseconds per step, the model FLOPs utilisation and the roofline of every contender at every T."""
    ms, cpu, mfu = result.get("ms_per_step", {}), result.get("cpu_ms_per_step", {}), result.get("mfu", {})
    keys = [(m, T) for m in result["methods"] for T in result["steps"] + [result["n"]]
            if ms.get(m, {}).get(str(T)) is not None]
    keys = list(dict.fromkeys(keys))
    if not keys:
        return []
    rate = result.get("matmul_rate")
    where = (f" Utilisation: the counted matrix-product FLOPs over the time, against {rate['best'] / 1e9:.0f} "
             f"GFLOP/s, the best rate this machine measured for the model's matrix shapes in {rate['dtype']}."
             if rate else "")
    rows = [[m, str(T), f"{_ms(ms[m][str(T)])} / {_ms(cpu.get(m, {}).get(str(T)))}",
             "-" if mfu.get(m, {}).get(str(T)) is None else f"{100 * mfu[m][str(T)]:.1f}%"] for m, T in keys]
    return ["Per decode step (a forward pass; the estimated encoder: one timed pass)." + where, "",
            markdown_table(["contender", "T", "ms per step (wall / CPU)", "FLOPs utilisation"], rows), "",
            *_roofline(result, keys)]


def _roofline(result: dict[str, Any], keys: list[tuple[str, int]]) -> list[str]:
    """Each step against max(FLOPs / peak, bytes / bandwidth) (`aogpt.bench.roofline`)."""
    roof, bw = result.get("roofline", {}), result.get("memory_bandwidth")
    keys = [(m, T) for m, T in keys if roof.get(m, {}).get(str(T))]
    if not keys or not bw:
        return []
    plateau = ", ".join(f"{int(k) / 2 ** 20:g} MiB {v / 1e9:.1f}" for k, v in sorted(bw["by_bytes"].items(),
                                                                                   key=lambda kv: int(kv[0])))
    rows = []
    for m, T in keys:
        x = roof[m][str(T)]
        b = x["bytes"]
        wall, cpu = result["ms_per_step"][m][str(T)], result["cpu_ms_per_step"][m][str(T)]
        rows.append([m, str(T), f"{b['weights'] / 1e6:.1f} + {(b['cache_read'] + b['cache_written']) / 1e6:.1f} + "
                     f"{b['logits'] / 1e6:.2f}", f"{x['flops'] / 1e9:.2f}", x["bound"],
                     f"{x['limit_s'] * 1e3:.2f} / {x['limit_working_set_s'] * 1e3:.2f}",
                     f"{wall / (x['limit_s'] * 1e3):.1f}x / {cpu / (x['limit_s'] * 1e3):.1f}x",
                     f"{wall / (x['limit_working_set_s'] * 1e3):.1f}x / {cpu / (x['limit_working_set_s'] * 1e3):.1f}x"])
    llc = (bw["last_level_cache_bytes"] or 0) / 2 ** 20
    return [f"Roofline: the limit of a step is max(FLOPs ÷ {result['matmul_rate']['best'] / 1e9:.0f} GFLOP/s, bytes ÷ "
            f"bandwidth), from one thread's read rate measured in this run: {bw['memory'] / 1e9:.1f} GB/s from memory "
            f"(a {bw['buffer_bytes'] / 2 ** 30:g} GiB buffer, beyond the {llc:g} MiB last-level cache), and, tighter, "
            f"the rate measured for a buffer of the step's own size (caches included; the plateau in GB/s: "
            f"{plateau}). Bytes per step: weights + KV cache (read and written) + logits, in MB; each step's time "
            "(wall / CPU) over its limit.", "",
            markdown_table(["contender", "T", "MB per step", "GFLOP per step", "bound",
                            "limit ms (memory / working set)", "÷ memory limit (wall / CPU)",
                            "÷ working-set limit (wall / CPU)"], rows), ""]


def _work(result: dict[str, Any], m: str, T: int) -> str:
    forwards = result["forwards"][m].get(str(T))
    if forwards is None:
        return "-"
    return f"{forwards} fwd; {result['slots'][m][str(T)]:,} + {result['padded_slots'][m][str(T)]:,}"
