"""What `aogpt bench gpu` will run (sizes, steps, each part's time share) and how long it should take.

The estimate is a roofline from FLOPs and bytes at H100-class rates (`H100`: 790 TFLOP/s dense bf16,
3.3 TB/s of HBM), derated by the shares of those peaks a real step reaches (`MATMUL_SHARE`,
`BYTES_SHARE`), plus what no roofline sees: the launch and Python overhead of every forward pass
(`LAUNCH_S` per kernel), compile times and process start-ups (`ASSUMED_S`). Those last figures are
assumptions until a GPU run measures them; the report prints the measured times beside the plan's.
Every part also has a time share (`Plan.shares`): its loops stop adding repeats or steps when the
share is spent, and the shares add up to less than `LIMIT_S` (8 minutes).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from aogpt.bench.common import QUICK_SIZE, Size

LIMIT_S = 480.0  # the whole run, on one H100-class GPU
PARTS = ("correctness", "figure5", "distributed", "training")  # in the order they run
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
LAUNCH_S = 8e-6  # Python dispatch + kernel launch, per kernel of an eager forward (assumed)
KERNELS_PER_LAYER = 25  # kernels of one block's forward: norms, projections, attention, adaLN, MLP
SAMPLER_KERNELS = 120  # a decode step's own work besides the blocks: plan, gather, head, draw, cache writes
HF_SLOWER = 1.5  # transformers' generate() loop over ours, per token (logits processors, cache objects)
ASSUMED_S = {  # what FLOPs and bytes do not tell (assumed until a GPU run measures them)
    "startup": 15.0,  # python, torch and CUDA initialisation, the report's first write
    "correctness": 20.0,  # tiny models: dozens of forwards, a 24,000-sample law test, two trainers, a checkpoint
    "model_build": 2.5,  # one GPT-2-small-sized model: random initialisation on the CPU, copy to the GPU
    "compile_gpt": 60.0,  # torch.compile of our GPT's training step, cold cache
    "compile_aogpt": 100.0,  # AO-GPT's (more operators: adaLN, the any-order layout)
    "torchrun": 15.0,  # one torchrun launch: processes, torch, CUDA and NCCL initialisation
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
    train_steps: int = 20  # timed steps per contender at most (fewer when the share runs out)
    train_compile: bool = True
    # distributed
    dist_size: Size = Size(4, 256, 4, 8192)
    dist_block: int = 256
    dist_batch: int = 8
    dist_steps: int = 3
    dist_dtypes: tuple[str, ...] = ("fp32", "bf16")
    shares: dict[str, float] = field(default_factory=lambda: {"correctness": 40.0, "figure5": 150.0,
                                                              "distributed": 50.0, "training": 200.0})

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


def forward_kernels(size: Size) -> float:
    return size.n_layer * KERNELS_PER_LAYER + SAMPLER_KERNELS


def generation_seconds(method: str, size: Size, n: int, batch: int, T: int) -> float:
    """One run of a Figure 5 contender (bf16 weights, fp32 KV cache, draws in float64)."""
    d, L, V = size.n_embd, size.n_layer, size.vocab_size
    weights = 2.0 * (_block_params(size) + d * V)
    draws = batch * n * V * 8.0 * 3  # logits to float64, softmax, the draw: each written and read
    if method == "encoder":
        per_pass = roofline(2 * _block_params(size) * batch * n + 4 * L * d * batch * n * n
                            + 2 * d * V * batch * math.ceil(n / T),
                            weights + 20.0 * L * batch * n * d * 2, forward_kernels(size))
        return T * per_pass + roofline(0, draws, 0)
    if method == "aogpt":  # Lemma 4.1: every position written once and queried once over the T steps
        rows = 2 * batch * n
        flops = 2 * _block_params(size) * rows + 2 * d * V * batch * n + 4 * L * d * rows * n / 2
        cache = 2.0 * L * batch * (n / 2) * d * 4  # the average cache read per step
        return roofline(flops, T * (weights + cache) + draws, T * forward_kernels(size))
    # one token per step: gpt (ours) and transformers' GPT-2 (its cache in bf16)
    cache = 2.0 * L * batch * (n / 2) * d * (4 if method == "gpt" else 2)
    per_step = roofline(2 * (_block_params(size) + d * V) * batch + 4 * L * d * batch * n / 2,
                        weights + cache + batch * V * 8.0 * 3, forward_kernels(size))
    return n * per_step * (HF_SLOWER if method == "hf-gpt2" else 1.0)


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
    runs, fig = [], 0.0
    for m in plan.fig_methods:
        for T in (plan.fig_steps if m in ("aogpt", "encoder") else (plan.fig_n,)):
            s = generation_seconds(m, plan.fig_size, plan.fig_n, plan.fig_batch, T)
            if m == "encoder" and s > plan.fig_encoder_limit:  # estimated from two timed passes instead
                s = 2 * s / T
            repeats = plan.fig_repeats if s <= plan.fig_long_run else 1
            runs.append({"method": m, "T": T, "seconds": s, "repeats": repeats})
            fig += s * repeats
    builds = ASSUMED_S["model_build"] * len(plan.fig_methods) * (0.1 if plan.quick else 1.0)
    parts["figure5"] = {"seconds": fig + builds, "runs": runs,
                        "how": "roofline per run x repeats (runs over the long-run limit once), plus model builds"}
    step = {v: training_step_seconds(plan.train_size, plan.train_block, plan.train_batch) * (1.25 if v == "aogpt"
                                                                                            else 1.0)
            for v in ("gpt", "aogpt")}
    compile_s = ASSUMED_S["compile_gpt"] + ASSUMED_S["compile_aogpt"] if plan.train_compile else 0.0
    steps = sum(step.values()) * (plan.train_warmup + plan.train_steps + 2)  # + the counted and compared steps
    parts["training"] = {"seconds": compile_s + steps + 5.0 + 2 * ASSUMED_S["model_build"] * (not plan.quick),
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
                                                   "launch_s": LAUNCH_S, **ASSUMED_S},
            "parts": parts, "total_seconds": total, "limit_seconds": LIMIT_S,
            "shares_total": ASSUMED_S["startup"] + sum(plan.shares.values()),
            "fits": total <= LIMIT_S and not over, "over_share": over}
