"""`aogpt bench attention`: every exact attention kernel (`aogpt.attention`) timed side by side at a
model's shapes, in each precision, with the rule's choice marked: the table `choose_kernel` is backed by.

Cases: training (forward + backward, a causal mask and an any-order mask: the layout by target
position), evaluation (forward only) and a decode step (a few queries against the cache's columns,
forward only). Every kernel's output is checked against float64 attention on the same inputs before
it is timed, so a fast wrong kernel cannot win.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aogpt.attention import AttentionMask, attend, choose_kernel
from aogpt.bench.common import fmt_seconds, markdown_table, sync, timed_cpu, write_outputs
from aogpt.bench.environment import describe_environment, environment, finish_environment
from aogpt.device import resolve_device
from aogpt.precision import to_dtype

KERNELS = ("sdpa", "explicit", "sdpa-fp32")
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2}


def _cases(batch: int, heads: int, block: int, head_dim: int, decode_queries: int) -> list[dict[str, Any]]:
    return [
        {"case": "training, causal", "q": block, "k": block, "mask": "causal", "backward": True},
        {"case": "training, any order", "q": block, "k": block, "mask": "order", "backward": True},
        {"case": "evaluation, any order", "q": block, "k": block, "mask": "order", "backward": False},
        {"case": f"decode step, {decode_queries} queries", "q": decode_queries, "k": block, "mask": "step",
         "backward": False},
    ]


def _mask(kind: str, batch: int, S: int, L: int, generator: torch.Generator, device: torch.device) -> Any:
    if kind == "causal":
        return None
    if kind == "order":  # row p may see the rows read no later than itself in a random order
        rank = torch.stack([torch.randperm(S, generator=generator) for _ in range(batch)]).to(device)
        return AttentionMask((rank[:, None, :] <= rank[:, :, None]).unsqueeze(1))
    allowed = torch.zeros(batch, 1, S, L, dtype=torch.bool, device=device)  # the cache, then each query itself
    allowed[..., : L - S] = True
    allowed[..., L - S:] = torch.eye(S, dtype=torch.bool, device=device)
    return allowed


def bench_attention(*, batch: int = 16, heads: int = 3, block: int = 128, head_dim: int = 64,
                    decode_queries: int = 8, dtypes: tuple[str, ...] = ("fp32", "bf16"), repeats: int = 15,
                    device: str = "cpu", seed: int = 0, out: Path | None = None,
                    progress: Callable[[int, str], None] | None = None) -> dict[str, Any]:
    """Median seconds of each kernel per case and precision (interleaved), and `choose_kernel`'s pick."""
    dev = resolve_device(device)
    env = environment(dev, list(dtypes))
    gen = torch.Generator().manual_seed(seed)
    rows: list[dict[str, Any]] = []
    cases = _cases(batch, heads, block, head_dim, decode_queries)
    done = 0
    for name in dtypes:
        dtype = to_dtype(name)
        for case in cases:
            S, L = case["q"], case["k"]
            q64 = torch.randn(batch, heads, S, head_dim, generator=gen, dtype=torch.float64).to(dev)
            k64 = torch.randn(batch, heads, L, head_dim, generator=gen, dtype=torch.float64).to(dev)
            v64 = torch.randn(batch, heads, L, head_dim, generator=gen, dtype=torch.float64).to(dev)
            mask = _mask(case["mask"], batch, S, L, gen, dev)
            causal = case["mask"] == "causal"
            expected = attend(q64, k64, v64, mask, causal=causal, kind="explicit")
            times: dict[str, list[float]] = {k: [] for k in KERNELS}
            errors: dict[str, float] = {}

            def run(kind: str, dtype: torch.dtype = dtype, case: dict = case, mask: Any = mask,
                    causal: bool = causal, q64: torch.Tensor = q64, k64: torch.Tensor = k64,
                    v64: torch.Tensor = v64) -> torch.Tensor:
                q, k, v = (t.to(dtype).requires_grad_(case["backward"]) for t in (q64, k64, v64))
                y = attend(q, k, v, mask, causal=causal, kind=kind)
                if case["backward"]:
                    y.backward(torch.ones_like(y))
                return y

            for kind in KERNELS:
                errors[kind] = float((run(kind).double() - expected).abs().max())
            for _ in range(repeats):
                for kind in KERNELS:
                    times[kind].append(timed_cpu(lambda kind=kind: run(kind), dev)[1])
            sync(dev)
            medians = {k: statistics.median(t) for k, t in times.items()}
            ok = {k: errors[k] <= TOLERANCE.get(dtype, 5e-2) for k in KERNELS}
            fastest = min((k for k in KERNELS if ok[k]), key=medians.__getitem__)
            rows.append({"dtype": name, **{k: case[k] for k in ("case", "q", "k", "backward")}, "seconds": medians,
                         "max_error": errors, "exact": ok, "fastest": fastest,
                         "rule": choose_kernel(dev, dtype)})
            done += 1
            if progress is not None:
                progress(done, case["case"])
    result = {"benchmark": "attention", "batch": batch, "heads": heads, "block": block, "head_dim": head_dim,
              "repeats": repeats, "rows": rows, "environment": finish_environment(env),
              "rule_agrees": sum(r["rule"] == r["fastest"] for r in rows), "cases": len(rows)}
    if out is not None:
        result["files"] = write_outputs(out, "attention", to_markdown(result), result)
    return result


def to_markdown(result: dict[str, Any]) -> str:
    env = result["environment"]
    table = []
    for r in result["rows"]:
        cells = []
        for k in KERNELS:
            cell = fmt_seconds(r["seconds"][k])
            if k == r["fastest"]:
                cell = f"**{cell}**"
            if not r["exact"][k]:
                cell += " (inexact)"
            cells.append(cell)
        table.append([r["case"], r["dtype"], *cells, r["rule"]])
    return "\n".join([
        "# Attention kernels",
        "",
        f"Queries (batch {result['batch']}, {result['heads']} heads, head size {result['head_dim']}) against "
        f"{result['block']} keys; CPU time per call, median of {result['repeats']} interleaved calls; training "
        "cases include the backward. " + describe_environment(env) + " Fastest exact kernel in bold; every output was "
        "checked against float64 attention first.",
        "",
        markdown_table(["case", "precision", *KERNELS, "auto picks"], table),
        "",
        f"The rule (`aogpt.attention.choose_kernel`) picks the fastest kernel in {result['rule_agrees']} of "
        f"{result['cases']} cases here.",
    ])
