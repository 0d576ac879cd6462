"""`aogpt bench gpu`, first part: correctness on the device, each against an independent computation.

- the attention kernels (SDPA's flash and memory-efficient kernels, and the kernel aogpt picks) against
  float64 attention, outputs and gradients (CUDA only);
- the KV cache: the log-probability of every token the sampler produced (planned Bernoulli steps,
  Lemma 4.1) equals its recomputation by a plain forward over the tokens decided before its step,
  in fp32 and in bf16;
- the sampler's law: samples drawn with the device's generator against the law enumerated over every
  sequence and order (`aogpt.generation.laws`: chi-square, cells expected fewer than 5 times pooled),
  with a power check that a wrong law is rejected by the same samples (as tests/generation/test_generate.py);
- the likelihood left to right and in a random order, and one training step's losses (before and
  after an AdamW update), equal to the CPU's;
- a checkpoint written from the device loads on the CPU with identical weights and outputs.

fp32 comparisons run with TF32 off (it is on for training on CUDA); each check states its tolerance.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aogpt import capability
from aogpt.bench.common import Size
from aogpt.bench.gpu.parts import NO_CUDA, Context
from aogpt.generation.laws import LAW_N, LAW_P, LAW_V, POWER_P, chi2_pvalue, exact_joint
from aogpt.precision import to_dtype

# Tolerances (absolute unless said): fp32 is the same function up to summation order; bf16 rounds every
# activation to 8 bits of mantissa (a relative error near 0.4% per value).
TOL_FP32_LOGP = 1e-4  # nats, a produced token's log-probability
TOL_BF16_LOGP = 0.05
TOL_FP32_NLL = 1e-4  # nats per token, the mean NLL of a batch
TOL_BF16_NLL = 5e-3
TOL_FP32_LOSS = 1e-4  # relative, a training step's loss
TOL_BF16_LOSS = 2e-3
# attention: the largest error over the reference's largest value; fp32 at TF32's level (a fused kernel may use
# TF32 units for fp32 inputs whatever the flag says); a wrong mask or layout is off by tens of percent
TOL_ATTN = {torch.float32: 2e-3, torch.bfloat16: 5e-2}


def run(ctx: Context) -> None:
    """Every check, each isolated: one that raises is recorded as failed with its message."""
    with exact_fp32():
        for name, fn in (("attention kernels", attention_kernels), ("KV cache", cache_vs_recompute),
                         ("sampler law", sampler_law), ("likelihood", likelihood_vs_cpu),
                         ("training step and checkpoint", training_step_vs_cpu)):
            try:
                fn(ctx)
            except Exception as exc:  # noqa: BLE001 - reported, the other checks still run
                ctx.verdict(f"{name}: ran to the end", False, note=f"{type(exc).__name__}: {exc}")
            ctx.progress(f"{name} done")
            ctx.save()


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """TF32 off for fp32 matrix products (restored after): fp32 comparisons mean fp32."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    tf32_off()
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def tf32_off() -> None:
    """Again after building a `Trainer`: on CUDA it turns TF32 on for training."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False


def dtype_of(name: str, device: torch.device) -> torch.dtype:
    """fp32 or bf16 through the project's precision names (`aogpt.precision`). Not refused on a CPU
    without bf16 units: these checks are of numbers at tiny sizes, where emulated bf16 is fast enough."""
    return to_dtype(name)


def autocast_of(name: str) -> torch.dtype | None:
    """The autocast dtype of a precision name: None for fp32."""
    dtype = to_dtype(name)
    return None if dtype == torch.float32 else dtype


# ----------------------------------------------------------------------------- attention
def attention_kernels(ctx: Context) -> None:
    """SDPA's fused kernels, forced one at a time, and aogpt's `attend` (auto), against float64."""
    cases = [("flash", "bf16", "causal"), ("memory-efficient", "bf16", "any order"),
             ("memory-efficient", "fp32", "any order"), ("aogpt auto", "bf16", "any order"),
             ("aogpt auto", "bf16", "causal")]
    if not ctx.cuda:
        for kernel, precision, mask in cases:
            ctx.skip(f"attention {kernel}, {precision}, {mask}: forward + backward vs float64", NO_CUDA)
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from aogpt.attention import AttentionMask, attend

    B, H, S, D = ctx.plan.attention_shape
    gen = torch.Generator().manual_seed(ctx.seed)
    q64, k64, v64 = (torch.randn(B, H, S, D, generator=gen, dtype=torch.float64).to(ctx.device) for _ in range(3))
    rank = torch.stack([torch.randperm(S, generator=gen) for _ in range(B)]).to(ctx.device)
    order_mask = (rank[:, None, :] <= rank[:, :, None]).unsqueeze(1)  # row p sees the rows read before it
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "memory-efficient": SDPBackend.EFFICIENT_ATTENTION}
    for kernel, precision, mask_kind in cases:
        name = f"attention {kernel}, {precision}, {mask_kind}: forward + backward vs float64"
        mask = None if mask_kind == "causal" else order_mask
        dtype = dtype_of(precision, ctx.device)

        def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: str = kernel,
                    mask: Any = mask) -> torch.Tensor:
            if kernel == "aogpt auto":
                return attend(q, k, v, None if mask is None else AttentionMask(mask), causal=mask is None)
            with sdpa_kernel(backends[kernel]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                        is_causal=mask is None)

        want = _attention_grads(lambda q, k, v, m=mask: attend(q, k, v, m, causal=m is None, kind="explicit"),
                                q64, k64, v64)
        try:
            got = _attention_grads(forward, *(t.to(dtype) for t in (q64, k64, v64)))
        except RuntimeError as exc:
            ctx.verdict(name, False, note=f"the kernel refused the case: {str(exc).splitlines()[0]}")
            continue
        error = max(float((g.double() - w).abs().max() / w.abs().max()) for g, w in zip(got, want, strict=True))
        ctx.check(name, error, TOL_ATTN[dtype], note="largest error of the output and of the q, k, v gradients, "
                  "over the reference's largest value")


def _attention_grads(fn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    y = fn(q, k, v)
    weight = torch.linspace(-1, 1, y.shape[-1], device=y.device, dtype=y.dtype)  # a gradient that is not uniform
    (y * weight).sum().backward()
    return [y.detach(), q.grad, k.grad, v.grad]


# ----------------------------------------------------------------------------- KV cache
def random_model(variant: str, size: Size, block: int, seed: int, scale: float | None = None) -> Any:
    """A model whose every weight is drawn N(0, scale^2) (default 2/sqrt(width)): conditionals far from
    uniform and dependent on the target position (at GPT-2 initialisation adaLN starts at zero)."""
    from aogpt.model import Transformer

    torch.manual_seed(seed)
    model = Transformer(size.config(variant, block))
    scale = 2.0 / math.sqrt(size.n_embd) if scale is None else scale
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, scale)
    return model.eval()


def cache_vs_recompute(ctx: Context) -> None:
    """Generate with the KV cache in Bernoulli steps, record every query's logits, and recompute each
    produced token's log-probability by one plain forward over the tokens decided before its step."""
    from aogpt.generation.generate import generate

    p = ctx.plan
    base = random_model("aogpt", p.cache_size, p.cache_n, ctx.seed)
    for precision, tol in (("fp32", TOL_FP32_LOGP), ("bf16", TOL_BF16_LOGP)):
        model = _copy(base).to(ctx.device, dtype_of(precision, ctx.device))
        res = generate(model, num_samples=p.cache_batch, length=p.cache_n, steps=p.cache_steps, policy="bernoulli",
                       seed=ctx.seed, record_logits=True, batch_size=p.cache_batch)
        logp_err, logit_err, queries = 0.0, 0.0, 0
        for b in range(p.cache_batch):
            chain = res.orders[b].to(ctx.device)
            y = res.tokens[b].to(ctx.device)[chain]
            bounds = np.concatenate([[0], np.cumsum(res.step_counts[b].numpy())])
            for g, end in zip(bounds[:-1], bounds[1:], strict=True):
                if end == g:
                    continue
                targets = torch.arange(int(g), int(end), device=ctx.device)
                rows = torch.stack([torch.cat([chain[:g], chain[i:i + 1]]) for i in targets])
                tokens = torch.cat([torch.tensor([-1], device=ctx.device), y[:g]]).expand(len(targets), -1)
                pos = torch.cat([torch.tensor([0], device=ctx.device), chain[:g] + 1]).expand(len(targets), -1)
                with torch.no_grad():
                    ref = model.forward_slots(tokens, pos, rows)[:, -1].double()
                got = res.logits[b, targets.cpu()].to(ctx.device).double()
                want_lp = torch.log_softmax(ref, -1).gather(1, y[targets][:, None])
                got_lp = torch.log_softmax(got, -1).gather(1, y[targets][:, None])
                logp_err = max(logp_err, float((got_lp - want_lp).abs().max()))
                logit_err = max(logit_err, float((got - ref).abs().max()))
                queries += len(targets)
        ctx.check(f"KV cache = recomputation, {precision}: produced tokens' log-probabilities", logp_err, tol,
                  note=f"{queries} tokens, {p.cache_steps} Bernoulli steps, n = {p.cache_n}; largest logit "
                       f"difference {logit_err:.2g}")
        complete = bool((res.orders.sort(1).values == torch.arange(p.cache_n)).all()) and \
            bool((res.step_counts.sum(1) == p.cache_n).all())
        ctx.verdict(f"KV cache, {precision}: every position decided once, in {p.cache_steps} steps", complete)


def _copy(model: torch.nn.Module) -> Any:
    import copy

    return copy.deepcopy(model)


# ----------------------------------------------------------------------------- the sampler's law
def sampler_law(ctx: Context) -> None:
    """One token per step and two Bernoulli steps, drawn on the device, against their exact laws."""
    from aogpt.generation.generate import generate

    N = ctx.plan.law_samples
    model64 = random_model("aogpt", Size(2, 16, 2, LAW_V), LAW_N, seed=5, scale=0.8).double()
    model = _copy(model64).float().to(ctx.device)
    one_per_step = exact_joint(model64, [(1.0, [1] * LAW_N)])
    bernoulli = exact_joint(model64, [(math.comb(LAW_N, k) / 2 ** LAW_N, [k, LAW_N - k]) for k in range(LAW_N + 1)])
    l2r = np.zeros(LAW_V ** LAW_N)  # the left-to-right joint: a law the any-order sampler must not follow
    for i, x in enumerate(itertools.product(range(LAW_V), repeat=LAW_N)):
        with torch.no_grad():
            l2r[i] = math.exp(-float(model64(torch.tensor([x]))[1].sum()))
    where = f"{N:,} samples of {LAW_N} tokens over {LAW_V} symbols, drawn on {ctx.device}"
    for label, kw, law, wrong, wrong_label in (
            ("one token per step", dict(steps=LAW_N, policy="count"), one_per_step, l2r, "the left-to-right law"),
            ("two Bernoulli steps (Lemma 4.1)", dict(steps=2, policy="bernoulli"), bernoulli, one_per_step,
             "the one-token-per-step law")):
        res = generate(model, num_samples=N, length=LAW_N, seed=ctx.seed, batch_size=N, **kw)
        tokens = res.tokens.cpu()
        ctx.check(f"sampler law, {label}: chi-square p against the enumerated law", chi2_pvalue(tokens, law), LAW_P,
                  at_most=False, note=where)
        ctx.check(f"sampler law, {label}: power, {wrong_label} rejected", chi2_pvalue(tokens, wrong), POWER_P,
                  note="the same samples against a wrong law")


# ----------------------------------------------------------------------------- likelihood
def likelihood_vs_cpu(ctx: Context) -> None:
    """The exact NLL of a batch left to right and in a random order: on the device in fp32 and under bf16
    autocast, against the same weights in float64 on the CPU."""
    from aogpt.train.step import autocast

    p = ctx.plan
    model = random_model("aogpt", p.likelihood_size, p.likelihood_n, ctx.seed)
    gen = torch.Generator().manual_seed(ctx.seed)
    idx = torch.randint(p.likelihood_size.vocab_size, (p.likelihood_batch, p.likelihood_n), generator=gen)
    orders = {"left to right": None,
              "a random order": torch.stack([torch.randperm(p.likelihood_n, generator=gen)
                                             for _ in range(p.likelihood_batch)])}
    reference = _copy(model).double()
    on_device = model.to(ctx.device)
    for label, order in orders.items():
        with torch.no_grad():
            want = float(reference(idx, order)[1].mean())
            for precision, tol in (("fp32", TOL_FP32_NLL), ("bf16", TOL_BF16_NLL)):
                with autocast(ctx.device, autocast_of(precision)):
                    got = float(on_device(idx.to(ctx.device), None if order is None else order.to(ctx.device))[1]
                                .float().mean())
                ctx.check(f"likelihood {label}, {precision}{' autocast' if precision != 'fp32' else ''} on "
                          f"{ctx.device} vs float64 on the CPU: mean NLL difference", abs(got - want), tol,
                          note=f"{want:.4f} nats per token, batch {p.likelihood_batch} x {p.likelihood_n}")


# ----------------------------------------------------------------------------- training step, checkpoint
def training_step_vs_cpu(ctx: Context) -> None:
    """Two optimizer steps (AdamW, clipping, EMA) on the same batches and orders on the device and on the
    CPU: the losses before and after the first update agree; then a checkpoint written from the device
    loads on the CPU with identical weights and the same likelihood."""
    from aogpt.config import train_config
    from aogpt.train import RandomTokens, Trainer

    p = ctx.plan
    size, B, n = p.step_size, p.step_batch, p.step_block
    gen = torch.Generator().manual_seed(ctx.seed)
    data = RandomTokens(size.vocab_size)
    batches = [data.get_batch("train", B, n, gen) for _ in range(2)]
    saved = None
    with tempfile.TemporaryDirectory(prefix="aogpt-gpu-ckpt-") as tmp:
        for variant in ("aogpt", "gpt"):
            orders = [torch.stack([torch.randperm(n, generator=gen) for _ in range(B)]) if variant == "aogpt"
                      else torch.arange(n).expand(B, n) for _ in batches]

            def losses(device: str, precision: str, out: Path | None = None, variant: str = variant,
                       orders: list[torch.Tensor] = orders) -> tuple[list[float], Any]:
                tcfg = train_config(None, variant, batch_size=B, max_steps=10, warmup_steps=0, device=device,
                                    dtype=precision, compile="off", seed=ctx.seed, eval_interval=10 ** 6,
                                    ckpt_interval=10 ** 6)
                trainer = Trainer(size.config(variant, n), tcfg, data, out, show_progress=False)
                tf32_off()
                got = []
                for step, (idx, order) in enumerate(zip(batches, orders, strict=True)):
                    got.append(trainer.optimizer_step(step, idx, order.to(trainer.device), trainer.order_gen).loss)
                    trainer.ema.update(trainer.raw)
                    trainer.step += 1
                return got, trainer

            cpu, _ = losses("cpu", "fp32")
            where = f"batch {B} x {n}, {variant}"
            for precision, tol in (("fp32", TOL_FP32_LOSS), ("bf16", TOL_BF16_LOSS)):
                if precision == "fp32" and not ctx.cuda:
                    ctx.skip(f"training step, {variant}, fp32 on the device vs the CPU", f"{NO_CUDA} (the device "
                             "is the CPU)")
                    continue
                if not ctx.cuda and not capability.usable_precision(to_dtype(precision)):
                    ctx.skip(f"training step, {variant}, {precision} autocast on the CPU vs fp32",
                             f"this CPU ({capability.cpu_class()}) has no {precision} units")
                    continue
                got, trainer = losses(str(ctx.device), precision, Path(tmp) / variant)
                error = max(abs(a - b) / abs(b) for a, b in zip(got, cpu, strict=True))
                ctx.check(f"training step, {variant}, {precision}{' autocast' if precision != 'fp32' else ''} on "
                          f"{ctx.device} vs fp32 on the CPU: relative loss difference, before and after an update",
                          error, tol, note=f"{where}; losses {', '.join(f'{x:.5f}' for x in got)} vs "
                          f"{', '.join(f'{x:.5f}' for x in cpu)}")
                if variant == "aogpt" and (saved is None or precision == "fp32"):
                    saved = trainer  # the checkpoint's source: the fp32 trainer on CUDA
            if variant == "aogpt" and saved is None:  # a CPU that skipped bf16: its fp32 trainer writes it
                saved = losses(str(ctx.device), "fp32", Path(tmp) / variant)[1]
        checkpoint_to_cpu(ctx, saved)


def checkpoint_to_cpu(ctx: Context, trainer: Any) -> None:
    """Save the trainer's checkpoint (from the device) and load it on the CPU: every raw and EMA tensor
    identical, and the loaded model's likelihood equal to the device model's."""
    from aogpt.checkpoint import load, unique_state

    path = trainer.save()
    where = f"written on {ctx.device}"
    loaded = {w: load(path, weights=w, device="cpu") for w in ("raw", "ema")}
    mismatched = []
    for weights, module in (("raw", trainer.raw), ("ema", trainer.ema.model)):
        theirs = unique_state(loaded[weights].model)
        for name, tensor in unique_state(module).items():
            if not torch.equal(theirs[name], tensor.detach().float().cpu()):
                mismatched.append(f"{weights}.{name}")
    ctx.verdict(f"checkpoint {where}, loaded on the CPU: raw and EMA weights identical", not mismatched,
                value=len(mismatched), bound="0 tensors differ", note=", ".join(mismatched[:5]))
    cfg = trainer.raw.config
    idx = torch.randint(cfg.vocab_size, (2, cfg.block_size), generator=torch.Generator().manual_seed(ctx.seed))
    with torch.no_grad():
        cpu = float(loaded["raw"].model(idx)[1].mean())
        dev = float(trainer.raw.eval()(idx.to(trainer.device))[1].mean())
    ctx.check(f"checkpoint {where}: its NLL on the CPU vs the device model's", abs(cpu - dev), TOL_FP32_NLL,
              note=f"{cpu:.5f} nats per token")
