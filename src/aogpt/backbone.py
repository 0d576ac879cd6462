"""The backbone's interchangeable parts: norms, rotary positions, MLPs (`ModelConfig` switches).

AO-GPT's own blocks use RMSNorm, learned position tables and a GELU MLP of width 4d; these switches
also describe the blocks of pretrained left-to-right models, so one `aogpt.model.Transformer`
rebuilds them exactly (`aogpt.adaptation`): GPT-2 (LayerNorm with bias, GELU-tanh, learned
positions, tied head) and the Llama family (RMSNorm, SwiGLU, rotary positions, grouped-query
attention, no biases).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from aogpt.config import ModelConfig
from aogpt.pathway import call, linear


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
    if x.is_cuda or torch.compiler.is_compiling() or shift.dim() != 3 or scale.dim() != 3:
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


class MLP(nn.Module):
    """GELU (exact, as the paper's reference code), GELU-tanh (GPT-2) or SwiGLU (Llama), of width
    `mlp_hidden` (default 4d). SwiGLU's gate and up projections are one matrix, [gate; up]. In a
    gated model (`aogpt.pathway`) `forward(x, pathway=True)` uses the linear layers' W + dW."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = cfg.mlp_hidden or 4 * cfg.n_embd
        bias = cfg.bias if cfg.mlp_bias is None else cfg.mlp_bias
        self.swiglu = cfg.mlp == "swiglu"
        self.c_fc = linear(cfg, cfg.n_embd, (2 if self.swiglu else 1) * hidden, bias)
        self.gelu = nn.GELU(approximate="tanh" if cfg.mlp == "gelu-tanh" else "none")
        self.c_proj = linear(cfg, hidden, cfg.n_embd, bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, pathway: bool = False) -> torch.Tensor:
        h = call(self.c_fc, x, pathway)
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = self.gelu(h)
        return self.dropout(call(self.c_proj, h, pathway))
