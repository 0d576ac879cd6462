"""The backbone's interchangeable parts: norms, rotary positions, MLPs, attention (`ModelConfig` switches).

AO-GPT's own blocks use RMSNorm, learned position tables and a GELU MLP of width 4d; these switches
also describe the blocks of pretrained left-to-right models, so one `aogpt.model.Transformer`
rebuilds them exactly (`aogpt.adaptation`): GPT-2 (LayerNorm with bias, GELU-tanh, learned
positions, tied head) and the Llama family (RMSNorm, SwiGLU, rotary positions, grouped-query
attention, no biases).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from aogpt.attention import AttentionMask, attend
from aogpt.config import ModelConfig
from aogpt.pathway import linear, side

if TYPE_CHECKING:
    from aogpt.kv_cache import KVCache, PackedSlots


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm with a hand-written backward: on CPU, 2-4x faster than autograd through
    `F.rms_norm`'s decomposition (AO-GPT has four RMSNorms per block). Each pass over the tensor
    counts: the mean square is one fused dot product per row, and the backward,
    grad_x = r * (gy - y * mean(gy * y)), reads and writes each tensor about three times."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        # float32 arithmetic whatever x's dtype; a bf16/fp16 x is read and written in its own dtype
        # (no float32 copy of it: the norms are accumulated in float32 from x itself)
        r = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.promote_types(x.dtype, torch.float32))
        r = r.square_().div_(x.shape[-1]).add_(eps).rsqrt_()
        y = x * r
        ctx.save_for_backward(y, r, weight)
        if weight is None:
            return y.to(x.dtype)
        return torch.mul(y, weight, out=torch.empty_like(x))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        y, r, weight = ctx.saved_tensors
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            gy = grad.to(y.dtype) if weight is None else grad * weight
            mean = torch.linalg.vecdot(gy, y).unsqueeze(-1).div_(y.shape[-1])
            grad_x = torch.addcmul(gy, y, mean, value=-1)
            grad_x = torch.mul(grad_x, r, out=torch.empty_like(grad))  # in the input's dtype
        if weight is not None and ctx.needs_input_grad[1]:
            # column sums as a matrix-vector product: much faster on CPU than sum(0) over many rows
            rows = (grad * y).flatten(0, -2)
            grad_w = rows.new_ones(rows.shape[0]) @ rows
            grad_w = grad_w.to(weight.dtype)
        return grad_x, grad_w, None


class _HeadRMSNormFunction(torch.autograd.Function):
    """QK-norm and the move of the heads to the front in one pass: x (B, S, H, D), a view into the
    fused q/k/v projection, becomes rms_norm(x) * weight laid out (B, H, S, D) contiguous, as the
    attention's matrix products read it. Autograd through the separate steps (norm on a strided
    view, transpose, contiguous copy, casts) makes the backward copy each tensor several times."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        B, S, H, D = x.shape
        # one conversion to float32 (contiguous): every later pass reads it without casting again
        y = x.to(torch.promote_types(x.dtype, torch.float32), memory_format=torch.contiguous_format, copy=True)
        r = torch.linalg.vector_norm(y, dim=-1, keepdim=True).square_().div_(D).add_(eps).rsqrt_()
        y.mul_(r)
        out = torch.empty((B, H, S, D), dtype=x.dtype, device=x.device)
        torch.mul(y, weight.to(y.dtype), out=out.transpose(1, 2))
        ctx.save_for_backward(y, r, weight)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        y, r, weight = ctx.saved_tensors
        g = grad.transpose(1, 2).to(y.dtype, memory_format=torch.contiguous_format, copy=True)  # (B, S, H, D), like y
        grad_x = grad_w = None
        if ctx.needs_input_grad[1]:
            rows = (g * y).view(-1, y.shape[-1])
            grad_w = (rows.new_ones(rows.shape[0]) @ rows).to(weight.dtype)
        if ctx.needs_input_grad[0]:
            g.mul_(weight.to(y.dtype))
            mean = torch.linalg.vecdot(g, y).unsqueeze_(-1).div_(y.shape[-1])
            g.addcmul_(y, mean, value=-1).mul_(r)
            grad_x = g.to(grad.dtype)
        return grad_x, grad_w, None


class _ModulatedRMSNormFunction(torch.autograd.Function):
    """adaLN's input: rms_norm(x) * scale + shift in one pass, written in the dtype the next matrix
    product reads (bf16 under autocast, so no separate cast), where scale and shift are one row per
    position broadcast over the batch ((1, S, d) or (B, S, d)). The backward computes the gradients of
    x, scale and shift from the saved normalised x without materialising the intermediate steps."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float,
                out_dtype: torch.dtype) -> torch.Tensor:
        r = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.promote_types(x.dtype, torch.float32))
        r = r.square_().div_(x.shape[-1]).add_(eps).rsqrt_()
        n = x * r
        out = torch.empty(n.shape, dtype=out_dtype, device=x.device)
        torch.addcmul(shift, n, scale, out=out)
        ctx.save_for_backward(n, r, scale)
        ctx.shapes = (shift.shape, scale.shape)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        n, r, scale = ctx.saved_tensors
        shift_shape, scale_shape = ctx.shapes
        g = grad.to(n.dtype)
        grad_x = grad_shift = grad_scale = None
        if ctx.needs_input_grad[1]:
            grad_shift = _sum_to(g, shift_shape)
        if ctx.needs_input_grad[2]:
            grad_scale = _sum_to(g * n, scale_shape)
        if ctx.needs_input_grad[0]:
            gn = g * scale
            mean = torch.linalg.vecdot(gn, n).unsqueeze_(-1).div_(n.shape[-1])
            grad_x = gn.addcmul_(n, mean, value=-1).mul_(r)
        return grad_x, grad_shift, grad_scale, None, None


def _sum_to(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum `t` over the leading axes a broadcast row (1, S, d) was expanded along."""
    return t.sum(0, keepdim=True) if shape[0] == 1 and t.shape[0] != 1 else t


def modulated_rms_norm(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm(x) * scale + shift (no norm weight: adaLN folds it into `scale`), in the autocast dtype
    when autocast is on (what the next linear layer reads)."""
    if (x.is_cuda or torch.compiler.is_compiling() or not torch.is_grad_enabled() or shift.dim() != 3
            or scale.dim() != 3):
        return torch.addcmul(shift, rms_norm(x, None, eps), scale)
    out_dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else \
        torch.promote_types(x.dtype, torch.promote_types(shift.dtype, scale.dtype))
    return _ModulatedRMSNormFunction.apply(x, shift, scale, eps, out_dtype)


def head_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm(x) * weight over the last axis of x (B, S, H, D), returned as (B, H, S, D) contiguous."""
    if x.is_cuda or torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return rms_norm(x, weight, eps).transpose(1, 2)
    return _HeadRMSNormFunction.apply(x, weight, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    if x.is_cuda or torch.compiler.is_compiling():  # compiled: inductor fuses the plain formula
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    if not torch.is_grad_enabled():
        d = x.shape[-1]
        w = None if weight is None else torch.cat([weight, weight])
        return F.layer_norm(torch.cat([x, -x], -1), (2 * d,), w, None, eps)[..., :d]
    return _RMSNormFunction.apply(x, weight, eps)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """Without the affine part (adaLN folds the weight into its per-position scale)."""
        return rms_norm(x, None, self.eps)

    def modulate(self, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """adaLN's ``normalize(x) * scale + shift`` (`fold_affine` made shift and scale), fused."""
        return modulated_rms_norm(x, shift, scale, self.eps)


class LayerNorm(nn.LayerNorm):
    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, None, None, self.eps)

    def modulate(self, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(shift, self.normalize(x), scale)


def make_norm(cfg: ModelConfig, dim: int) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return RMSNorm(dim, cfg.norm_eps)
    return LayerNorm(dim, eps=cfg.norm_eps, bias=cfg.bias)


def fold_affine(norm: nn.Module, shift: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(shift', scale') with norm(x) * (1 + scale) + shift == normalize(x) * scale' + shift'.

    adaLN modulates a norm's output; folding the norm's own weight and bias into the per-position
    modulation leaves one fused multiply-add per slot and channel instead of three.
    """
    factor = 1 + scale
    new_shift = shift if norm.bias is None else torch.addcmul(shift, norm.bias, factor)
    return new_shift, factor * norm.weight


def rotary_tables(pos: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (B, 1, S, head_dim) for slot positions `pos` (B, S): each slot is rotated by its
    token's own position, so a left-to-right read rotates every token as the source model did (the
    start slot is position 0, the beginning-of-text token's). Computed as Llama computes them, in
    float32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=pos.device).float() / head_dim))
    freqs = pos.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]
    return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotate (B, H, S, D) queries or keys by the slots' tables (the two-halves convention)."""
    cos, sin = rope
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)


class FusedLinear(nn.Module):
    """A linear layer prepared for inference that can fuse what follows its product: ``gelu(x,
    approximate)`` = GELU(self(x)) and ``add(x, residual)`` = residual + self(x)
    (`aogpt.decode.kernels.LinearKernel`). Any other linear layer (`nn.Linear`, or a wrapper around
    one) gets the plain formulas from `linear_gelu` and `project`."""

    def gelu(self, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        return F.gelu(self(x), approximate=approximate)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return residual + self(x)


def linear_gelu(layer: nn.Module, x: torch.Tensor, approximate: str) -> torch.Tensor:
    """GELU(layer(x)); a `FusedLinear` fuses the GELU into its product (the same function)."""
    if isinstance(layer, FusedLinear):
        return layer.gelu(x, approximate)
    return F.gelu(layer(x), approximate=approximate)


def dropping(dropout: nn.Module) -> bool:
    """Whether `dropout` drops anything (training with p > 0): else it is skipped, not called."""
    return dropout.training and dropout.p > 0


def project(layer: nn.Module, x: torch.Tensor, residual: torch.Tensor | None, dropout: nn.Module) -> torch.Tensor:
    """An output projection, dropout(layer(x)), added to the residual stream when one is given; a
    `FusedLinear` (inference, so no dropout) fuses the add into its product."""
    if dropping(dropout):
        out = dropout(layer(x))
        return out if residual is None else residual + out
    if residual is None:
        return layer(x)
    if isinstance(layer, FusedLinear):
        return layer.add(x, residual)
    return residual + layer(x)


class MLP(nn.Module):
    """GELU (exact, as the paper's reference code), GELU-tanh (GPT-2) or SwiGLU (Llama), of width
    `mlp_hidden` (default 4d). SwiGLU's gate and up projections are one matrix, [gate; up]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = cfg.mlp_hidden or 4 * cfg.n_embd
        bias = cfg.bias if cfg.mlp_bias is None else cfg.mlp_bias
        self.swiglu = cfg.mlp == "swiglu"
        self.c_fc = linear(cfg, cfg.n_embd, (2 if self.swiglu else 1) * hidden, bias)
        self.gelu = nn.GELU(approximate="tanh" if cfg.mlp == "gelu-tanh" else "none")
        self.c_proj = linear(cfg, hidden, cfg.n_embd, bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, pathway: bool = False) -> torch.Tensor:
        """The MLP's output, plus `residual` when given (the block's residual add, `project`); `pathway`:
        with the layers' W + dW (a gated model's pathway rows, `aogpt.pathway.side`)."""
        c_fc, c_proj = side(self.c_fc, pathway), side(self.c_proj, pathway)
        if self.swiglu:
            gate, up = c_fc(x).chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = linear_gelu(c_fc, x, self.gelu.approximate)
        return project(c_proj, h, residual, self.dropout)


class SelfAttention(nn.Module):
    """Causal (or full) self-attention with the fused projection ``c_attn`` = [q; k; v]. With
    grouped-query attention (``n_kv_head`` < ``n_head``) k and v have fewer heads, each shared by
    ``n_head / n_kv_head`` query heads (repeated before attention; the KV cache holds them repeated)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        d = cfg.n_embd
        self.n_head, self.n_kv_head = cfg.n_head, cfg.kv_heads
        self.head_dim = cfg.head_dim
        self.split = (d, self.n_kv_head * cfg.head_dim, self.n_kv_head * cfg.head_dim)
        self.c_attn = linear(cfg, d, sum(self.split), cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias)
        self.c_proj = linear(cfg, d, d, cfg.bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.qk_norm = cfg.qk_norm
        self.causal = cfg.causal
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.layer_idx = layer_idx

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | AttentionMask | None, cache: KVCache | None,
                cache_pos: int | torch.Tensor | PackedSlots | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None, kernel: str = "auto",
                residual: torch.Tensor | None = None) -> torch.Tensor:
        """Attention's output projection (plus `residual` when given: the block's residual add, fused
        into the product by a prepared inference kernel, `aogpt.backbone.project`)."""
        y = self.mix(self.c_attn(x), attn_mask, cache, cache_pos, rope, kernel)
        return project(self.c_proj, y, residual, self.resid_dropout)

    def mix(self, qkv: torch.Tensor, attn_mask: torch.Tensor | AttentionMask | None, cache: KVCache | None,
            cache_pos: int | torch.Tensor | PackedSlots | None = None,
            rope: tuple[torch.Tensor, torch.Tensor] | None = None, kernel: str = "auto") -> torch.Tensor:
        """Attention over the projected [q; k; v] (B, S, .): (B, S, d), before the output projection (the
        one part of a layer where slots read each other: a gated model projects its rows apart and
        joins them here). With a KV cache the slots are rows (B * S, 3, H, D) written to and attending
        over the cache (`KVCache.attend_rows`); without, (B, H, S, D) attending over themselves."""
        B, S, _ = qkv.shape
        d = self.n_head * self.head_dim
        if cache is not None:
            y = cache.attend_rows(self.layer_idx, self._rows(qkv, B * S, rope), cache_pos, attn_mask,
                                  self.head_dim ** -0.5)
            return y.view(B, S, d)
        q, k, v = (t.view(B, S, -1, self.head_dim) for t in qkv.split(self.split, dim=2))
        if self.qk_norm:  # over each head's vector, as the heads move to the front
            q = head_rms_norm(q, self.q_norm.weight, self.q_norm.eps)
            k = head_rms_norm(k, self.k_norm.weight, self.k_norm.eps)
        else:
            q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.transpose(1, 2)
        if rope is not None:
            q, k = apply_rotary(q, rope), apply_rotary(k, rope)
        if self.n_kv_head != self.n_head:
            k, v = (t.repeat_interleave(self.n_head // self.n_kv_head, dim=1) for t in (k, v))
        y = attend(q, k, v, attn_mask, causal=self.causal, dropout=self.dropout if self.training else 0.0,
                   kind=kernel)
        return y.transpose(1, 2).reshape(B, S, d)

    def _rows(self, qkv: torch.Tensor, R: int, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """A cache step's q, k, v as rows (R, 3, H, D): a view of the fused projection, the QK-norm
        written into it in place (inference), unless rotary positions or shared key heads need them
        apart (then rotated, repeated and stacked)."""
        H, D = self.n_head, self.head_dim
        if rope is None and self.n_kv_head == H:
            rows = qkv.view(R, 3, H, D)
            if self.qk_norm:  # q and k normalised together, each scaled by its own weight
                weight = torch.stack([self.q_norm.weight, self.k_norm.weight])[:, None]
                normed = rms_norm(rows[:, :2], None, self.q_norm.eps)
                if torch.is_grad_enabled():
                    return torch.cat([normed * weight, rows[:, 2:]], dim=1)
                torch.mul(normed, weight, out=rows[:, :2])
            return rows
        q, k, v = (t.view(R, -1, D) for t in qkv.reshape(R, -1).split(self.split, dim=-1))
        if self.qk_norm:
            q, k = rms_norm(q, self.q_norm.weight, self.q_norm.eps), rms_norm(k, self.k_norm.weight, self.k_norm.eps)
        if rope is not None:  # the tables (B, 1, S, D) as one per row (R, 1, D)
            rope = tuple(t.transpose(1, 2).reshape(R, 1, D) for t in rope)
            q, k = apply_rotary(q, rope), apply_rotary(k, rope)
        if self.n_kv_head != H:
            k, v = (t.repeat_interleave(H // self.n_kv_head, dim=1) for t in (k, v))
        return torch.stack([q, k, v], dim=1)
