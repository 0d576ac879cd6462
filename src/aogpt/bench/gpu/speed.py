"""`aogpt bench gpu`: the paper's Figure 5 on the device, and the training throughput of GPT-2 small.

Figure 5 (`figure5`): `aogpt.bench.generation.generate.bench_generate` at GPT-2 small's size (12 layers, width
768, 12 heads, vocabulary 50,257), n = 1024, batch 32, random weights in bf16: AO-GPT with its KV cache
and Lemma 4.1, the encoder-only MDM and our GPT side by side, interleaved, with transformers' GPT-2
`generate()` beside them; repeats stop when the part's time share is spent.

Training (`training`): our GPT and AO-GPT at GPT-2 small's size, context 1024, bf16 autocast, the
training step compiled (torch.compile), fused AdamW; steps interleaved. Tokens per second, the
model FLOPs utilisation (a step's matrix-product FLOPs, counted by torch's FlopCounterMode, over the
matmul rate measured in the same run at the model's shapes), AO-GPT ÷ GPT, the compiled step's loss
against the eager one's, and each contender's peak memory against the estimate `aogpt train --dry-run`
prints (`aogpt.memory.training_bytes`).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch

from aogpt.bench.common import check_memory, fmt_ratio, markdown_table, sync
from aogpt.bench.gpu.parts import NO_CUDA, Context
from aogpt.bench.gpu.plan import estimate
from aogpt.precision import to_dtype

TOL_COMPILED_LOSS = 1e-2  # relative: the compiled and eager bf16 forward round differently
SAFETY = 2.0  # a Figure 5 run not yet timed is expected to take up to this many times the plan's estimate
VARIANTS = ("gpt", "aogpt")


# ----------------------------------------------------------------------------- Figure 5

def train_precision(device: torch.device) -> str:
    """bf16 autocast on a GPU; on a CPU (``--quick``) bf16 where it computes in it, else fp32, which an
    AVX2-only CPU is refused bf16 for (`aogpt.precision`)."""
    from aogpt import capability

    return "bf16" if device.type == "cuda" or capability.usable_precision(torch.bfloat16) else "fp32"

def figure5(ctx: Context) -> None:
    from aogpt.bench.generation import hf_gpt2
    from aogpt.bench.generation.generate import bench_generate

    p = ctx.plan
    methods = [m for m in p.fig_methods if m != "hf-gpt2" or hf_gpt2.available()]
    if len(methods) < len(p.fig_methods):
        ctx.skip("transformers GPT-2 generate() timed", "transformers is not installed")
    runs = sum(len(p.fig_steps) if m in ("aogpt", "encoder") else 1 for m in methods)
    done = [0]

    def tick(k: int, label: str) -> None:
        done[0] = k
        ctx.progress(f"{label} ({k} runs; {runs} in the first round)")

    precision = "bf16" if ctx.cuda else "fp32"
    runs_planned = estimate(p)["parts"]["figure5"]["runs"]
    planned = {(r["method"], r["T"]): r["first_seconds"] for r in runs_planned}
    steady = {(r["method"], r["T"]): r["seconds"] for r in runs_planned}  # a repeat: its shapes captured before
    result = bench_generate(n=p.fig_n, batch=p.fig_batch, steps=p.fig_steps, size=p.fig_size, methods=methods,
                            repeats=p.fig_repeats, long_run=p.fig_long_run, device=str(ctx.device), seed=ctx.seed,
                            dtypes=[precision], progress=tick, encoder_limit=p.fig_encoder_limit, count_flops=False,
                            deadline=ctx.deadline - 10.0, cutoff=ctx.deadline - 5.0,
                            expected={k: SAFETY * s for k, s in planned.items()} if ctx.cuda else None)
    ctx.metric("generate", {k: v for k, v in result.items() if k != "files"})
    n, B = p.fig_n, p.fig_batch
    missing = [f"{m} T={T}" for m in methods for T in (p.fig_steps if m in ("aogpt", "encoder") else (n,))
               if result["seconds"].get(m if m != "encoder" or str(T) in result["seconds"].get("encoder", {})
                                         else "encoder-est", {}).get(str(T)) is None]
    ctx.verdict("Figure 5: every contender timed at every planned T (the encoder estimated where marked)",
                not missing, note=", ".join(missing))
    for T in p.fig_steps:
        forwards = result["forwards"].get("aogpt", {}).get(str(T))
        slots = result["slots"].get("aogpt", {}).get(str(T))
        if forwards is None or slots is None:
            continue
        work = slots + result["padded_slots"]["aogpt"][str(T)]
        ctx.verdict(f"AO-GPT's planned steps at T = {T}: at most T forward passes and 2n + 1 slot evaluations "
                    "per sequence", forwards <= T and work <= B * (2 * n + 1), value=f"{forwards} / {work:,}",
                    bound=f"≤ {T} / {B * (2 * n + 1):,}")
    ctx.lines(*figure5_lines(result))
    _against_estimate(ctx, result, steady)


def _against_estimate(ctx: Context, result: dict[str, Any], steady: dict[tuple[str, int], float]) -> None:
    """Every timed run's median against the plan's estimate (`aogpt.bench.gpu.plan`): the dry run
    kept honest (within 2x); on a CPU the estimate, made at H100 rates, does not apply."""
    rows, ratios = [], {}
    for (m, T), planned in steady.items():
        key = m if str(T) in result["seconds"].get(m, {}) else "encoder-est" if m == "encoder" else m
        got = result["seconds"].get(key, {}).get(str(T))
        if got is not None and planned > 0:
            ratios[f"{m} T={T}"] = got / planned
            rows.append([f"{key} T={T}", f"{planned:.2f} s", f"{got:.2f} s", fmt_ratio(got / planned)])
    ctx.metric("measured_over_estimate", ratios)
    ctx.lines("The plan's estimate (`aogpt bench gpu --dry-run`) against each run's median:", "",
              markdown_table(["run", "estimate", "measured", "measured ÷ estimate"], rows), "")
    name = "Figure 5: the dry run's estimate within 2x of every measured run"
    if not ctx.cuda:
        ctx.skip(name, f"{NO_CUDA} (the estimate is made at H100 rates)")
        return
    worst = max(ratios.values(), key=lambda r: max(r, 1 / r), default=None)
    ctx.check(name, None if worst is None else max(worst, 1 / worst), 2.0, fmt="{:.1f}x",
              note=f"worst {fmt_ratio(worst)} measured ÷ estimated" if worst else "no run timed")


def figure5_lines(result: dict[str, Any]) -> list[str]:
    """The sweep in ms per step and seconds per batch, and the ratios, in a few lines."""
    ms, sec, ratios, n = result.get("ms_per_step", {}), result["seconds"], result["ratios"], result["n"]
    enc = "encoder" if "encoder" in result["methods"] else "encoder-est"
    rows = []
    for T in result["steps"]:
        e_key = enc if str(T) in sec.get(enc, {}) else "encoder-est"
        ratio = ratios[str(T)].get("encoder/aogpt") or ratios[str(T)].get("encoder-est/aogpt")
        rows.append([str(T), _ms(ms.get("aogpt", {}).get(str(T))), _s(sec.get("aogpt", {}).get(str(T))),
                     _ms(ms.get(e_key, {}).get(str(T))) + (" (est.)" if e_key == "encoder-est" else ""),
                     _s(sec.get(e_key, {}).get(str(T))), fmt_ratio(ratio)])
    size = result["size"]
    lines = [f"{size['n_layer']} layers, width {size['n_embd']}, {size['n_head']} heads, vocabulary "
             f"{size['vocab_size']:,}, random weights in {result.get('precision', '?')}; n = {n}, batch "
             f"{result['batch']}; median of up to {result['repeats']} interleaved runs (runs over "
             f"{result['long_run_s']:g} s once).", "",
             markdown_table(["T", "AO-GPT ms/step", "AO-GPT s/batch", "encoder ms/step", "encoder s/batch",
                             "encoder ÷ AO-GPT"], rows), ""]
    at_n = [[result["labels"][m], _ms(ms.get(m, {}).get(str(n))), _s(sec.get(m, {}).get(str(n)))]
            for m in ("aogpt", "gpt", "hf-gpt2") if sec.get(m, {}).get(str(n)) is not None]
    lines += [f"At T = n = {n} (one token per step for the left-to-right models):", "",
              markdown_table(["contender", "ms/step", "s/batch"], at_n), ""]
    for key, words in (("aogpt/gpt", "AO-GPT ÷ our GPT"), ("aogpt/hf-gpt2", "AO-GPT ÷ transformers GPT-2"),
                       ("gpt/hf-gpt2", "our GPT ÷ transformers GPT-2")):
        if ratios["n"].get(key) is not None:
            lines.append(f"- {words} at T = n: {fmt_ratio(ratios['n'][key])} (time).")
    lines.append("- The paper reports about 25x for AO-GPT against SEDD (an encoder-only MDM) at n = 1024, batch 32 "
                 "(its Figure 5, Finding 8.1).")
    return lines


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


# ----------------------------------------------------------------------------- training throughput
def training(ctx: Context) -> None:
    from aogpt.bench.limits import counted_matmul_flops, faster_of, matmul_rate, model_shapes
    from aogpt.memory import training_bytes
    from aogpt.train.throughput import flops_per_token, peak_flops

    p, dev = ctx.plan, ctx.device
    size, block, batch = p.train_size, p.train_block, p.train_batch
    check_memory(size, block, batch, dev, list(VARIANTS), "train")
    trainers, setup = {}, {}
    for v in VARIANTS:
        trainers[v], setup[v] = _trainer(ctx, v)
        ctx.metric("setup", setup)
        ctx.progress(f"{v}: ready ({setup[v]['compile_s']:.0f} s compiling, {setup[v]['first_steps_s']:.1f} s "
                     f"first steps)")
        ctx.save()
    shapes = model_shapes(batch * block, size.n_embd)
    bf16 = to_dtype(train_precision(dev))
    rate = matmul_rate(shapes, bf16, dev)
    flops = {v: counted_matmul_flops(lambda v=v: _eager_forward_backward(trainers[v])) for v in VARIANTS}
    runs: dict[str, list[float]] = {v: [] for v in VARIANTS}
    peaks: dict[str, int] = dict.fromkeys(VARIANTS, 0)
    losses: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for s in range(p.train_steps):
        if s >= 3 and ctx.left() < 10:
            break
        for v in VARIANTS:
            start_mem = _reset_peak(dev)
            sync(dev)
            t0 = time.perf_counter()
            losses[v].append(trainers[v].train_step().loss)
            sync(dev)
            runs[v].append(time.perf_counter() - t0)
            if dev.type == "cuda":
                peaks[v] = max(peaks[v], setup[v]["state_bytes"] + torch.cuda.max_memory_allocated(dev) - start_mem)
    rate = faster_of(rate, matmul_rate(shapes, bf16, dev))
    tokens = batch * block
    seconds = {v: statistics.median(r) for v, r in runs.items()}
    datasheet = peak_flops(dev)
    rows, out = [], {}
    for v in VARIANTS:
        cfg = trainers[v].model_cfg
        estimate = training_bytes(cfg, batch)
        out[v] = {"seconds_per_step": seconds[v], "steps_timed": len(runs[v]), "runs": runs[v],
                  "tokens_per_second": tokens / seconds[v], "counted_flops_per_step": flops[v],
                  "formula_flops_per_step": flops_per_token(cfg, block) * tokens,
                  "mfu_measured_peak": flops[v] / seconds[v] / rate["best"],
                  "mfu_datasheet": flops[v] / seconds[v] / datasheet if datasheet else None,
                  "peak_bytes": peaks[v] or None, "dry_run_estimate_bytes": estimate, "losses": losses[v],
                  **setup[v]}
        rows.append([v, f"{setup[v]['compile_s']:.0f} s" if setup[v]["compiled"] else "not compiled",
                     f"{seconds[v] * 1e3:.1f} ms ({len(runs[v])} steps)", f"{tokens / seconds[v]:,.0f}",
                     f"{100 * out[v]['mfu_measured_peak']:.1f}%",
                     "-" if datasheet is None else f"{100 * out[v]['mfu_datasheet']:.1f}%",
                     "-" if not peaks[v] else f"{peaks[v] / 2**30:.2f} GiB", f"{estimate / 2**30:.2f} GiB"])
        finite = all(math.isfinite(x) for x in losses[v])
        ctx.verdict(f"training {v}: every timed step's loss finite", finite, note=f"last {losses[v][-1]:.4f}")
        if dev.type == "cuda":
            ctx.check(f"training {v}: peak memory within the dry-run estimate", peaks[v] / estimate, 1.0,
                      fmt="{:.0%}", note=f"{peaks[v] / 2**30:.2f} of {estimate / 2**30:.2f} GiB (aogpt train "
                      "--dry-run's figure)")
        else:
            ctx.skip(f"training {v}: peak memory within the dry-run estimate", NO_CUDA)
    ratio = seconds["aogpt"] / seconds["gpt"]
    ctx.metric("contenders", out)
    ctx.metric("matmul_rate", rate)
    ctx.metric("aogpt_over_gpt", ratio)
    ctx.metric("datasheet_flops", datasheet)
    ctx.lines(
        f"{size.n_layer} layers, width {size.n_embd}, {size.n_head} heads, vocabulary {size.vocab_size:,}; batch "
        f"{batch} x context {block} ({tokens:,} tokens per step), bf16 autocast, fused AdamW, EMA; steps of the two "
        "contenders interleaved, median reported.", "",
        markdown_table(["contender", "compile", "step (median)", "tokens/s", "MFU (measured peak)",
                        "MFU (datasheet)", "peak memory", "dry-run estimate"], rows), "",
        f"- AO-GPT ÷ GPT, step time: {fmt_ratio(ratio)}.",
        f"- Matmul peak measured in this run at the model's shapes, bf16: {flops_text(rate['best'])}/s ("
        + ", ".join(f"{k} {flops_text(r)}/s" for k, r in rate["rates"].items()) + ")"
        + (f"; datasheet {flops_text(datasheet)}/s." if datasheet else "."),
        "- A step's matrix-product FLOPs counted by torch's FlopCounterMode: "
        + ", ".join(f"{v} {flops_text(flops[v])}" for v in VARIANTS)
        + "; by the formula of `aogpt.train.throughput.flops_per_token`: "
        + ", ".join(f"{v} {flops_text(out[v]['formula_flops_per_step'])}" for v in VARIANTS) + ".")


def flops_text(value: float) -> str:
    """12.3 TFLOP, 45.6 GFLOP, 7.8 MFLOP."""
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if value >= scale:
            return f"{value / scale:,.1f} {unit}"
    return f"{value:,.0f} FLOP"


def _trainer(ctx: Context, variant: str) -> tuple[Any, dict[str, Any]]:
    """A trainer at the plan's size, compiled when the plan says so (eager, with a failed check, when
    compiling fails), warmed up; and what it cost: compile and first-step seconds, its resident bytes."""
    from aogpt.config import train_config
    from aogpt.train import RandomTokens, Trainer

    p, dev = ctx.plan, ctx.device
    before = _allocated(dev)
    compiled = p.train_compile
    while True:
        tcfg = train_config(None, variant, batch_size=p.train_batch, max_steps=10 ** 9, warmup_steps=10,
                            eval_interval=10 ** 9, ckpt_interval=10 ** 9, device=str(dev), seed=ctx.seed,
                            dtype=train_precision(dev), compile="on" if compiled else "off")
        trainer = Trainer(p.train_size.config(variant, p.train_block), tcfg, RandomTokens(p.train_size.vocab_size),
                          None, show_progress=False)
        try:
            compile_s = trainer.warm_up()
            if compiled:
                compiled_loss(ctx, trainer)
            t0 = time.perf_counter()
            for _ in range(p.train_warmup):
                trainer.train_step()
            sync(dev)
            first = time.perf_counter() - t0
            break
        except Exception as exc:  # noqa: BLE001 - report it, and still measure the eager step
            if not compiled:
                raise
            ctx.verdict(f"training {variant}: the compiled step runs", False, note=f"{type(exc).__name__}: {exc}")
            del trainer
            _free(dev)
            compiled = False
    if not p.train_compile:
        ctx.skip(f"training {variant}: compiled step's loss = eager step's", "--quick does not compile (compiling "
                 "takes minutes)")
    return trainer, {"compiled": compiled, "compile_s": compile_s, "first_steps_s": first,
                     "state_bytes": _allocated(dev) - before}


def compiled_loss(ctx: Context, trainer: Any) -> None:
    """The compiled model's loss on one batch against the eager model's on the same batch and orders."""
    from aogpt.train.step import autocast, training_loss

    idx, order = trainer._global_batch()
    idx = idx.to(trainer.device)
    scratch = torch.Generator(trainer.device).manual_seed(0)
    with autocast(trainer.device, trainer.amp):
        compiled = float(training_loss(trainer.step_model, idx, order, scratch).detach())
        with torch.no_grad():
            eager = float(training_loss(trainer.raw, idx, order, scratch))
    trainer.optimizer.zero_grad(set_to_none=True)
    name = trainer.model_cfg.variant
    ctx.check(f"training {name}: compiled step's loss = eager step's (bf16)", abs(compiled - eager) / abs(eager),
              TOL_COMPILED_LOSS, note=f"{compiled:.5f} vs {eager:.5f}")


def _eager_forward_backward(trainer: Any) -> None:
    """One forward and backward of the uncompiled model on a batch (what the FLOPs are counted on)."""
    from aogpt.train.step import autocast, training_loss

    idx, order = trainer._global_batch()
    scratch = torch.Generator(trainer.device).manual_seed(0)
    with autocast(trainer.device, trainer.amp):
        loss = training_loss(trainer.raw, idx.to(trainer.device), order, scratch)
    loss.backward()
    trainer.optimizer.zero_grad(set_to_none=True)


def _free(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def _reset_peak(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)
