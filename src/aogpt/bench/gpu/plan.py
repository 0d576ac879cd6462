"""What `aogpt bench gpu` will run (sizes, steps, each part's time share) and how long it should take.

The estimate is a roofline from FLOPs and bytes at H100-class rates (`H100`: 790 TFLOP/s dense bf16,
3.3 TB/s of HBM), derated by the shares of those peaks a real step reaches (`MATMUL_SHARE`,
`BYTES_SHARE`), plus what no roofline sees: the host's work per step, compile times and process
start-ups (`ASSUMED_S`). A decode step's host work is modelled per path:

- eager (transformers' GPT-2, the encoder, and any step not captured): `LAUNCH_S` per kernel launched
  from Python, `LAUNCH_S` calibrated on the H200 run of docs/gpu.md (our GPT's eager step: 3.4 ms for
  about 420 kernels); a Lemma 4.1 step's attention adds `CALL_KERNELS` per attention call of its
  layout, which is what made AO-GPT's eager step 10.4 ms at T = n and 42 ms at T = 64 there
  (`EAGER_H200` holds those measurements; the estimate reproduces them within 2x, a test checks);
- captured as CUDA graphs (our GPT and AO-GPT, `aogpt.decode.graphs`): every step in static shapes
  over the whole cache, the device running a replay's kernels at `GRAPH_KERNEL_S` each plus the
  step's roofline, the host launching `GRAPH_HOST_KERNELS` per step (the inputs' copies, the draw),
  and each new shape captured once at the cost of two eager steps. The shapes and rows of every step
  come from the plan's own Bernoulli counts, drawn here as a run draws them. No GPU has run these
  graphs yet: their constants are assumptions until one does.

Every part also has a time share (`Plan.shares`) it cannot overrun: Figure 5 starts no run that its
estimate says would end past the share, and training runs in a child process ended at its share
(compiling takes what it takes). The shares and the start-up add up to less than `LIMIT_S`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from aogpt.bench.common import QUICK_SIZE, Size

LIMIT_S = 480.0  # the whole run, on one H100-class GPU (scripts/gpu-check.sh cuts at 570 s, a device call at 600)
PARTS = ("figure5", "training", "correctness", "distributed")  # in the order they run: the figures first
TITLES = {"environment": "Device and versions", "correctness": "Correctness on the device",
          "figure5": "Generation speed (the paper's Figure 5)", "distributed": "Distributed training (torchrun)",
          "training": "Training throughput"}


@dataclass(frozen=True)
class Rates:
    """A device class's peaks: dense bf16 matrix products (FLOP/s) and memory bandwidth (bytes/s)."""

    name: str
    matmul: float
    bandwidth: float


H100 = Rates("H100-class (790 TFLOP/s bf16 dense, 3.3 TB/s HBM)", 790e12, 3.3e12)
MATMUL_SHARE = 0.5  # of the peak, reached by a step's large matrix products (assumed)
BYTES_SHARE = 0.6  # of the bandwidth, reached by a decode step's weight and cache reads (assumed)
LAUNCH_S = 8e-6  # Python dispatch + kernel launch, per kernel of an eager forward (calibrated: `EAGER_H200`)
KERNELS_PER_LAYER = 25  # kernels of one block's forward: norms, projections, attention, adaLN, MLP
SAMPLER_KERNELS = 120  # a decode step's own work besides the blocks: plan, gather, head, draw, cache writes
CALL_KERNELS = 20  # kernels of each further attention call of an eager ragged step (views, gathers, SDPA)
GRAPH_KERNEL_S = 3e-6  # a kernel's time in a replayed CUDA graph, launch gap and tail included (assumed)
GRAPH_HOST_KERNELS = 40  # launched from Python per captured step: inputs copied, replay, draw, tokens (assumed)
EAGER_H200 = {  # ms per step measured eagerly on an H200 (docs/gpu.md): GPT-2 small's size, n = 1024, batch 32
    ("gpt", 1024): 3.4, ("aogpt", 1024): 10.4, ("aogpt", 64): 42.0}
HF_SLOWER = 1.5  # transformers' generate() loop over ours, per token (logits processors, cache objects)
ASSUMED_S = {  # what FLOPs and bytes do not tell (assumed until a GPU run measures them)
    "startup": 15.0,  # python, torch and CUDA initialisation, the report's first write
    "correctness": 20.0,  # tiny models: dozens of forwards, a 24,000-sample law test, two trainers, a checkpoint
    "model_build": 2.5,  # one GPT-2-small-sized model: random initialisation on the CPU, copy to the GPU
    "compile_gpt": 60.0,  # torch.compile of our GPT's training step, cold cache
    "compile_aogpt": 100.0,  # AO-GPT's (more operators: adaLN, the any-order layout)
    "torchrun": 15.0,  # one torchrun launch: processes, torch, CUDA and NCCL initialisation
    "child": 10.0,  # a part's own process (training, when it compiles): python, torch and CUDA initialisation
}


@dataclass(frozen=True)
class Plan:
    """Every size and count the run uses; `quick` is the tiny CPU plan of the test suite."""

    quick: bool
    # correctness
    cache_size: Size = Size(2, 128, 4, 1000)
    cache_n: int = 64
    cache_batch: int = 4
    cache_steps: int = 16
    law_samples: int = 24_000
    likelihood_size: Size = Size(4, 256, 4, 8192)
    likelihood_n: int = 256
    likelihood_batch: int = 4
    step_size: Size = Size(2, 128, 4, 1000)
    step_block: int = 64
    step_batch: int = 8
    attention_shape: tuple[int, int, int, int] = (4, 12, 1024, 64)  # batch, heads, length, head size
    # Figure 5
    fig_size: Size = Size(12, 768, 12, 50257)
    fig_n: int = 1024
    fig_batch: int = 32
    fig_steps: tuple[int, ...] = (64, 128, 256, 512, 1024)
    fig_methods: tuple[str, ...] = ("aogpt", "encoder", "gpt", "hf-gpt2")
    fig_repeats: int = 3
    fig_long_run: float = 5.0  # runs longer than this are not repeated
    fig_encoder_limit: float = 30.0  # the encoder is estimated (T x one timed pass) past this many seconds a run
    # training throughput
    train_size: Size = Size(12, 768, 12, 50257)
    train_block: int = 1024
    train_batch: int = 16
    train_warmup: int = 2
    train_steps: int = 12  # timed steps per contender at most (fewer when the share runs out)
    train_compile: bool = True
    # distributed
    dist_size: Size = Size(4, 256, 4, 8192)
    dist_block: int = 256
    dist_batch: int = 8
    dist_steps: int = 3
    dist_dtypes: tuple[str, ...] = ("fp32", "bf16")
    shares: dict[str, float] = field(default_factory=lambda: {"figure5": 120.0, "training": 190.0,
                                                              "correctness": 40.0, "distributed": 40.0})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FULL = Plan(quick=False)
QUICK = Plan(
    quick=True, cache_size=Size(1, 32, 2, 50), cache_n=16, cache_batch=2, cache_steps=4,
    likelihood_size=Size(2, 64, 2, 256), likelihood_n=32, likelihood_batch=2, step_size=Size(1, 32, 2, 64),
    step_block=16, step_batch=4, attention_shape=(2, 2, 32, 16),
    fig_size=QUICK_SIZE, fig_n=32, fig_batch=2, fig_steps=(8, 16, 32), fig_repeats=1, fig_long_run=1.0,
    fig_encoder_limit=30.0,
    train_size=QUICK_SIZE, train_block=32, train_batch=2, train_warmup=1, train_steps=2, train_compile=False,
    dist_size=Size(1, 32, 2, 64), dist_block=16, dist_batch=2, dist_steps=2,
    shares={"correctness": 30.0, "figure5": 30.0, "distributed": 60.0, "training": 30.0})


# ----------------------------------------------------------------------------- the roofline
def roofline(flops: float, nbytes: float, kernels: float, rates: Rates = H100) -> float:
    """Seconds of work that does `flops` of matrix products, moves `nbytes` and launches `kernels`:
    the slower of compute and memory at their derated peaks, plus the launches."""
    return max(flops / (rates.matmul * MATMUL_SHARE), nbytes / (rates.bandwidth * BYTES_SHARE)) + kernels * LAUNCH_S


def _block_params(size: Size) -> float:
    """Weights of the blocks' matrix products (attention 4 d^2, MLP 8 d^2 per layer)."""
    return 12.0 * size.n_layer * size.n_embd ** 2


def forward_kernels(size: Size, calls_per_layer: float = 1.0, padded: bool = False) -> float:
    """Kernels of one decode forward: the blocks' (with `calls_per_layer` attention calls each, and
    the padded layout's scatter, mask and gather), and the sampler's."""
    per_layer = KERNELS_PER_LAYER + CALL_KERNELS * (calls_per_layer - 1) + (5 if padded else 0)
    return size.n_layer * per_layer + SAMPLER_KERNELS


def plan_counts(n: int, batch: int, T: int, seed: int = 0) -> Any:
    """The Bernoulli counts (batch, T) a Figure 5 run of AO-GPT draws (`aogpt.generation.plan`)."""
    from aogpt.generation.plan import step_counts
    from aogpt.generation.streams import SequenceStreams

    return step_counts("bernoulli", "linear", T, n, batch, SequenceStreams(seed, 0, batch))


def _ragged_rows(counts: Any) -> tuple[Any, Any]:
    """Per step of a plan (batch, T): each sequence's rows (catch-ups and queries; 0 sitting out) and
    queries, for the steps that run a forward."""
    import numpy as np

    k = counts.T  # (T, B)
    L = np.zeros(k.shape[1], dtype=np.int64)
    g = np.zeros(k.shape[1], dtype=np.int64)
    sizes = []
    for row in k:
        if row.any():
            sizes.append(np.where(row > 0, g - L + row, 0))
            L[row > 0] = g[row > 0] + 1
        g += row
    return np.array(sizes), k[k.any(axis=1)]


def _bucket_calls(sizes: Any) -> float:
    """Attention calls per layer of an eager step in the ``buckets`` layout (a GPU's default when its
    steps are not captured): runs of consecutive sequences of one width, one call per width past
    `aogpt.decode.layouts.MAX_VIEW_RUNS` runs."""
    import numpy as np

    on = sizes > 0
    w = np.where(on, sizes, -1)
    runs = (on & np.r_[True, w[1:] != w[:-1]]).sum()
    widths = len(np.unique(sizes[on]))
    return float(widths if runs > max(8, 2 * widths) else runs)


def _step(size: Size, rows: float, queries: float, batch: float, columns: float, width: float) -> tuple[float, float]:
    """FLOPs and bytes of a decode step: `rows` through the blocks, `queries` through the head, each
    of `batch` sequences' `width` query slots attending over `columns` (bf16 weights and cache)."""
    d, L, V = size.n_embd, size.n_layer, size.vocab_size
    flops = 2 * _block_params(size) * rows + 2 * d * V * queries + 4 * L * d * batch * width * columns
    nbytes = 2.0 * (_block_params(size) + d * V) + 2.0 * L * batch * columns * d * 2 + queries * V * 8.0 * 3
    return flops, nbytes


def generation_seconds(method: str, size: Size, n: int, batch: int, T: int, graphs: bool = True,
                       captured: set | None = None) -> float:
    """One run of a Figure 5 contender (bf16 weights and cache, draws in float64): our GPT and AO-GPT
    captured as CUDA graphs (`graphs`; `captured`: the shapes an earlier run captured, updated),
    else eagerly; the encoder and transformers' GPT-2 eagerly."""
    from aogpt.decode.layouts import Static, bucket

    if method == "encoder":
        d, L, V = size.n_embd, size.n_layer, size.vocab_size
        per_pass = roofline(2 * _block_params(size) * batch * n + 4 * L * d * batch * n * n
                            + 2 * d * V * batch * math.ceil(n / T),
                            2.0 * (_block_params(size) + d * V) + 20.0 * L * batch * n * d * 2, forward_kernels(size))
        return T * per_pass + roofline(0, batch * n * V * 8.0 * 3, 0)
    if method in ("gpt", "hf-gpt2"):
        sizes = [[1] * batch] * n
        steps = [(row, row) for row in sizes]
    else:
        rows, ks = _ragged_rows(plan_counts(n, batch, T))
        steps = list(zip(rows, ks, strict=True))
    static, total = Static(batch, n + 1), 0.0
    for t, (rows_b, k_b) in enumerate(steps):
        R, Q, W = int(sum(rows_b)), int(sum(k_b)), int(max(rows_b))
        if graphs and method != "hf-gpt2":
            shape = (int(static.rows(R)), int(bucket(W)), int(static.rows(Q)))
            flops, nbytes = _step(size, shape[0], shape[2], batch + 1, n + 1, shape[1])
            kernels = forward_kernels(size, padded=True)
            total += max(roofline(flops, nbytes, 0) + kernels * GRAPH_KERNEL_S, GRAPH_HOST_KERNELS * LAUNCH_S)
            if captured is not None and shape not in captured:
                captured.add(shape)
                total += 2 * kernels * LAUNCH_S  # a warm-up step, then the capture
        else:
            import numpy as np

            calls = 1.0 if method != "aogpt" else _bucket_calls(np.asarray(rows_b))
            flops, nbytes = _step(size, R, Q, batch, t + 1, W)
            total += roofline(flops, nbytes, forward_kernels(size, calls)) * (HF_SLOWER if method == "hf-gpt2" else 1)
    return total


def training_step_seconds(size: Size, block: int, batch: int) -> float:
    """One optimizer step: forward and backward (6 x weights x tokens, attention 12 L d n per token),
    fused AdamW and the EMA over the fp32 state (about 36 bytes per parameter read or written)."""
    d, L, V = size.n_embd, size.n_layer, size.vocab_size
    tokens = batch * block
    flops = (6 * (_block_params(size) + d * V) + 12 * L * d * block) * tokens
    params = _block_params(size) + 2 * d * V
    return roofline(flops, 36.0 * params + 30.0 * L * tokens * d * 2, 3 * size.n_layer * KERNELS_PER_LAYER)


def estimate(plan: Plan, world: int = 1) -> dict[str, Any]:
    """Seconds per part at H100 rates (`H100`), with how each figure was reached; `world`: GPUs visible."""
    parts: dict[str, dict[str, Any]] = {}
    parts["correctness"] = {"seconds": ASSUMED_S["correctness"] * (0.25 if plan.quick else 1.0),
                            "how": "assumed (tiny models: overhead, not FLOPs)"}
    runs, fig, captured = [], 0.0, set()
    for m in plan.fig_methods:
        for T in (plan.fig_steps if m in ("aogpt", "encoder") else (plan.fig_n,)):
            first = generation_seconds(m, plan.fig_size, plan.fig_n, plan.fig_batch, T, captured=captured)
            s = generation_seconds(m, plan.fig_size, plan.fig_n, plan.fig_batch, T, captured=set(captured))
            if m == "encoder" and s > plan.fig_encoder_limit:  # estimated from two timed passes instead
                first = s = 2 * s / T
            repeats = plan.fig_repeats if s <= plan.fig_long_run else 1
            runs.append({"method": m, "T": T, "seconds": s, "first_seconds": first, "repeats": repeats})
            fig += first + s * (repeats - 1)
    builds = ASSUMED_S["model_build"] * len(plan.fig_methods) * (0.1 if plan.quick else 1.0)
    parts["figure5"] = {"seconds": fig + builds, "runs": runs, "shapes_captured": len(captured),
                        "how": "per step: roofline and the host's launches (captured steps: a replay's kernels, "
                               "each shape captured once), per run x repeats (runs over the long-run limit once), "
                               "plus model builds"}
    step = {v: training_step_seconds(plan.train_size, plan.train_block, plan.train_batch) * (1.25 if v == "aogpt"
                                                                                            else 1.0)
            for v in ("gpt", "aogpt")}
    compile_s = ASSUMED_S["compile_gpt"] + ASSUMED_S["compile_aogpt"] if plan.train_compile else 0.0
    steps = sum(step.values()) * (plan.train_warmup + plan.train_steps + 2)  # + the counted and compared steps
    child = ASSUMED_S["child"] if plan.train_compile else 0.0  # a compiling part runs in its own process
    parts["training"] = {"seconds": child + compile_s + steps + 5.0 + 2 * ASSUMED_S["model_build"] * (not plan.quick),
                         "step_seconds": step, "compile_seconds": compile_s,
                         "how": "roofline per step (AO-GPT 1.25x: adaLN and the any-order mask), assumed compile "
                                "times, 5 s of matmul-rate measurement"}
    launches = 1 + (world > 1)
    dist_step = training_step_seconds(plan.dist_size, plan.dist_block, plan.dist_batch)
    parts["distributed"] = {"seconds": launches * ASSUMED_S["torchrun"]
                            + launches * 3 * 2 * len(plan.dist_dtypes) * plan.dist_steps * dist_step * world,
                            "launches": launches, "how": "torchrun launches (assumed) + the steps' roofline"}
    total = ASSUMED_S["startup"] + sum(p["seconds"] for p in parts.values())
    over = [p for p in PARTS if parts[p]["seconds"] > plan.shares.get(p, math.inf)]
    return {"rates": asdict(H100), "assumptions": {"matmul_share": MATMUL_SHARE, "bytes_share": BYTES_SHARE,
                                                   "launch_s": LAUNCH_S, "graph_kernel_s": GRAPH_KERNEL_S,
                                                   "graph_host_kernels": GRAPH_HOST_KERNELS, **ASSUMED_S},
            "parts": parts, "total_seconds": total, "limit_seconds": LIMIT_S,
            "shares_total": ASSUMED_S["startup"] + sum(plan.shares.values()),
            "fits": total <= LIMIT_S and not over, "over_share": over}
