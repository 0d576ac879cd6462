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


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    if x.is_cuda:
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


class LayerNorm(nn.LayerNorm):
    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, None, None, self.eps)


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
    `mlp_hidden` (default 4d). SwiGLU's gate and up projections are one matrix, [gate; up]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = cfg.mlp_hidden or 4 * cfg.n_embd
        bias = cfg.bias if cfg.mlp_bias is None else cfg.mlp_bias
        self.swiglu = cfg.mlp == "swiglu"
        self.c_fc = nn.Linear(cfg.n_embd, (2 if self.swiglu else 1) * hidden, bias=bias)
        self.gelu = nn.GELU(approximate="tanh" if cfg.mlp == "gelu-tanh" else "none")
        self.c_proj = nn.Linear(hidden, cfg.n_embd, bias=bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = self.gelu(h)
        return self.dropout(self.c_proj(h))
