"""Exact attention, softmax(q k^T / sqrt(d) + mask) v, and the rule that picks its kernel.

Every attention in aogpt goes through `attend` (training, evaluation: queries and keys the same
slots) or `attend_few` (a KV-cache step: a few queries per sequence over its cache).
The kernels compute the same function; they differ in speed, which depends on the device, the dtype
and the shape (measured by `aogpt bench attention`, docs/benchmarks.md):

- ``sdpa``: torch's `scaled_dot_product_attention`. The fast path on CUDA (flash / memory-efficient
  kernels) and, in float32, on the CPU.
- ``explicit``: matmul -> softmax (float32) -> matmul. On the CPU in bf16, torch's fused attention
  kernel is 2-3x slower than these three steps (forward + backward of the quickstart's shape: 22 ms
  against 7 ms on a 2-core AMD EPYC with avx512_bf16), because its inner blocks are small; the
  explicit path hands the work to oneDNN's bf16 matrix products, which run at the CPU's peak.
- ``sdpa-fp32``: SDPA on float32 copies of bf16 inputs (a middle ground kept for measurement).
- ``flex``: FlexAttention with the mask as a score modification (fast only under torch.compile).

``auto`` (the default) is `choose_kernel`'s rule. A mask is boolean, True = may attend, of shape
(B or 1, 1, S, L) for queries (B, H, S, D) and keys (B, H, L, D); ``causal`` means the lower
triangle with S == L. The explicit kernel turns a boolean mask into an additive one once per
forward (`AttentionMask`), not once per layer.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

KERNELS = ("auto", "sdpa", "explicit", "sdpa-fp32", "flex")


def choose_kernel(device: torch.device, dtype: torch.dtype) -> str:
    """The kernel `auto` stands for: ``explicit`` for bf16/fp16 on the CPU, else ``sdpa`` (CUDA's fused
    kernels; on the CPU in float32 SDPA and the explicit path take the same time, and SDPA keeps less
    in memory for the backward)."""
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        return "explicit"
    return "sdpa"


def check_kernel(kind: str) -> str:
    if kind not in KERNELS:
        from aogpt.errors import AOGPTError

        raise AOGPTError(f"unknown attention kernel {kind!r}", f"choose from: {', '.join(KERNELS)}")
    return kind


@dataclass
class AttentionMask:
    """A boolean mask (True = may attend) with its additive form made once, lazily, per dtype: every
    layer of one forward shares it."""

    allowed: torch.Tensor
    _additive: dict[torch.dtype, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def shape(self) -> torch.Size:
        return self.allowed.shape

    def additive(self, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in self._additive:
            bias = torch.zeros(self.allowed.shape, dtype=dtype, device=self.allowed.device)
            self._additive[dtype] = bias.masked_fill_(~self.allowed, float("-inf"))
        return self._additive[dtype]


_CAUSAL: dict[tuple[int, int, torch.device, torch.dtype], torch.Tensor] = {}


def causal_bias(S: int, L: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The additive causal mask (S, L) for queries at the last S of L key columns (cached: it is a
    constant of its shape)."""
    key = (S, L, device, dtype)
    if key not in _CAUSAL:
        allowed = torch.ones(S, L, dtype=torch.bool, device=device).tril(L - S)
        _CAUSAL[key] = torch.zeros(S, L, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
    return _CAUSAL[key]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | AttentionMask | None = None, *,
           causal: bool = False, dropout: float = 0.0, kind: str = "auto") -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v for q (B, H, S, D), k and v (B, H, L, D): (B, H, S, D).

    `mask`: boolean (True = may attend) or additive (0 / -inf), broadcastable to (B, H, S, L), or an
    `AttentionMask`; None
    with `causal` means the causal mask, else full attention. `dropout` applies to the attention
    weights (training only). `kind`: a kernel of `KERNELS` (``auto``: `choose_kernel`)."""
    if kind == "auto":
        kind = choose_kernel(q.device, q.dtype)
    if kind == "explicit":
        return _explicit(q, k, v, mask, causal, dropout)
    allowed = mask.allowed if isinstance(mask, AttentionMask) else mask
    if kind == "flex" and allowed is not None and dropout == 0.0:
        return _flex(q, k, v, allowed)
    if kind == "sdpa-fp32" and q.dtype != torch.float32:
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=allowed, dropout_p=dropout,
                                             is_causal=causal and allowed is None)
        return out.to(v.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout,
                                          is_causal=causal and allowed is None)


def _without_cudnn():
    """SDPA restricted to its flash, memory-efficient and math kernels. cuDNN's attention builds an
    execution plan for every new shape, and a KV-cache step has a new key length every step: measured
    on an H200 (docs/gpu.md), 2.9 ms of CPU per call, which made our GPT's decode step at GPT-2 small's
    size 44 ms instead of 3.4 ms."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _explicit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | AttentionMask | None,
              causal: bool, dropout: float) -> torch.Tensor:
    """matmul -> softmax (in float32 at least) -> matmul, with the mask added to the scores."""
    scores = torch.matmul(q, k.transpose(-1, -2))
    scores = scores * (q.shape[-1] ** -0.5)
    if mask is not None:
        if isinstance(mask, AttentionMask):
            scores = scores + mask.additive(scores.dtype)
        elif mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:  # already additive (0 / -inf)
            scores = scores + mask.to(scores.dtype)
    elif causal:
        scores = scores + causal_bias(q.shape[-2], k.shape[-2], q.device, scores.dtype)
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(v.dtype)
    if dropout > 0.0:
        weights = F.dropout(weights, dropout)
    return torch.matmul(weights, v)


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
          scale: float | None = None) -> torch.Tensor:
    """FlexAttention with the (boolean or additive) mask added to each score (`scale`: default 1/sqrt(D))."""
    from torch.nn.attention.flex_attention import flex_attention

    allowed = allowed.reshape((1,) * (4 - allowed.dim()) + tuple(allowed.shape))  # (B or 1, 1, S, L)
    if allowed.dtype == torch.bool:
        bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, float("-inf"))
    else:  # already additive
        bias = allowed.to(q.dtype)
    bias = bias.expand(q.shape[0], -1, -1, -1)  # one row per sequence, as score_mod indexes it

    def add_mask(score, b, h, q_idx, kv_idx):
        return score + bias[b, 0, q_idx, kv_idx]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention warns that it is unfused
        return flex_attention(q, k, v, score_mod=add_mask, scale=scale)


FEW_QUERY_KERNELS = ("sdpa", "matmul")  # what `aogpt.decode.choice` measures for a KV-cache step
CACHE_KERNELS = (*FEW_QUERY_KERNELS, "flex")  # what a KV cache may run (flex: for a compiled step)


def attend_few(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               kind: str = "sdpa", scale: float = 1.0) -> torch.Tensor:
    """softmax(scale q k^T + mask) v for a decode step's few queries per sequence, q (B, H, S, D),
    k and v (B, H, L, D) views of a KV cache, `mask` additive (B or 1, 1, S, L) or None (every column).

    ``sdpa``: torch's fused kernel; ``matmul``: two batched products around a softmax, without the
    fused kernel's per-call set-up (which one is faster depends on the CPU class and the dtype:
    `aogpt.decode.choice` measures it); ``flex``: FlexAttention with the mask as a score
    modification (fast only compiled). The softmax runs in at least float32."""
    if kind == "sdpa":
        if q.is_cuda:  # keep cuDNN's kernel out (`_without_cudnn`): a new key length every step
            with _without_cudnn():
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if kind == "flex":
        allowed = mask if mask is not None else torch.zeros(q.shape[-2], k.shape[-2], dtype=q.dtype, device=q.device)
        return _flex(q, k, v, allowed, scale)
    scores = torch.matmul(q, k.transpose(-1, -2))
    if scale != 1.0:
        scores = scores.mul_(scale)
    if mask is not None:
        scores = scores.add_(mask) if mask.dtype == scores.dtype else scores + mask.to(scores.dtype)
    if scores.dtype in (torch.float32, torch.float64):
        return torch.matmul(scores.softmax(-1), v)
    return torch.matmul(scores.softmax(-1, dtype=torch.float32).to(v.dtype), v)
