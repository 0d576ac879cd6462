"""Token-level sampling rules: temperature, top-k, top-p, greedy and the categorical draw.

Everything here maps a batch of logits (R, V) to R token ids; the generator decides which rows to
sample. The draw is done in float64 by default: float32 Gumbel noise (or a float32 CDF) visibly
lowers the effective temperature over long sequences (paper section 4.3). Float64 is used where it
matters, the draw: the softmax and the truncation rules run in the logits' precision (at least
float32), and the cumulative distribution the token is drawn from is accumulated in float64.

Top-p follows the paper's reference rule, pinned by the fixture's ``topp_*`` arrays: sort the
probabilities in descending order, drop every token whose *inclusive* cumulative sum exceeds p (the
token that crosses p is dropped too), always keep the most likely token, renormalise. Only sorted
values up to the nucleus are needed: on the CPU the top 64 are selected first (`np.partition`) and a
row is fully sorted only when its nucleus is larger; on other devices torch sorts on the device.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from aogpt.errors import AOGPTError
from aogpt.validation import bounded, check_ranges

PARTIAL = 64  # values selected before sorting (CPU); rows whose nucleus is larger are sorted whole


@dataclass(frozen=True)
class SamplingConfig:
    """How one token is drawn from the model's logits."""

    temperature: float = bounded(1.0, gt=0)
    top_p: float = bounded(1.0, gt=0, le=1)  # 1: no nucleus truncation
    top_k: int = bounded(0, ge=0, le=2**31)  # 0: no top-k truncation
    greedy: bool = False
    dtype: torch.dtype = torch.float64  # precision of the softmax and the categorical draw
    vocab_limit: int | None = bounded(None, ge=1, le=2**31, integer=True)  # ids >= this (padding) never sampled

    def validate(self) -> SamplingConfig:
        check_ranges(self, "sampling")
        if self.dtype not in (torch.float64, torch.float32):
            raise AOGPTError(f"sampling dtype {self.dtype} is not supported", "use torch.float64 or torch.float32")
        return self

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["dtype"] = str(self.dtype).removeprefix("torch.")
        return out


def _threshold_numpy(probs: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray, bool]:
    """(tau, K, tie) per row from the values sorted descending, sorting only up to the nucleus."""
    V = probs.shape[-1]
    m = min(V, PARTIAL)
    top = -np.sort(np.partition(-probs, m - 1, axis=-1)[:, :m], axis=-1) if m < V else -np.sort(-probs, axis=-1)
    csum = np.cumsum(top, axis=-1)
    whole = np.nonzero(csum[:, -1] <= p)[0] if m < V else np.empty(0, dtype=np.int64)
    if len(whole):  # the nucleus reaches past the selected values: sort those rows whole
        full = -np.sort(-probs[whole], axis=-1)
        k_full = np.maximum((np.cumsum(full, axis=-1) <= p).sum(axis=-1), 1)
    k = np.maximum((csum <= p).sum(axis=-1), 1)
    k_safe = np.minimum(k, m - 1)
    tau = np.take_along_axis(top, (k - 1)[:, None], axis=-1)[:, 0]
    nxt = np.take_along_axis(top, k_safe[:, None], axis=-1)[:, 0]
    tie_rows = (nxt == tau) & (k < m)
    if len(whole):
        k[whole] = k_full
        tau[whole] = np.take_along_axis(full, (k_full - 1)[:, None], axis=-1)[:, 0]
        nxt_full = np.take_along_axis(full, np.minimum(k_full, V - 1)[:, None], axis=-1)[:, 0]
        tie_rows[whole] = (nxt_full == tau[whole]) & (k_full < V)
    return tau[:, None], k[:, None], bool(tie_rows.any())


def _top_p_threshold(probs: torch.Tensor, p: float, use_numpy: bool | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Per row: tau, the K-th largest probability, and K = #{r : cumsum_r <= p} (at least 1), with the
    cumulative sums taken over the values sorted in descending order; plus whether any row may have
    a tie at its boundary (tau equal to the (K+1)-th value).

    use_numpy (default: on the CPU) selects numpy's vectorised partition and sort, 10-30x faster than
    torch's row-wise sort there; elsewhere torch sorts on the device, without a host sync."""
    if probs.device.type == "cpu" if use_numpy is None else use_numpy:
        lead = probs.shape[:-1]
        tau, k, tie = _threshold_numpy(probs.detach().cpu().reshape(-1, probs.shape[-1]).numpy(), p)
        return (torch.from_numpy(tau).to(probs.device).view(*lead, 1),
                torch.from_numpy(k).to(probs.device).view(*lead, 1), tie)
    s = probs.sort(dim=-1, descending=True).values
    k = (s.cumsum(dim=-1) <= p).sum(dim=-1, keepdim=True).clamp_(min=1)
    return s.gather(-1, k - 1), k, True  # ties resolved on the device, without a host sync


def top_p_mask(probs: torch.Tensor, p: float, use_numpy: bool | None = None) -> torch.Tensor:
    """Which tokens the reference top-p rule keeps (bool, same shape as probs).

    The cumulative sums of the sorted values form a non-decreasing sequence, so the kept tokens are
    the K most likely ones; they are found by value (probs >= tau), without sorting indices. Among
    tokens tied with the K-th value, the lowest ids are kept (the reference's unstable sort leaves
    that choice unspecified).
    """
    tau, k, tie = _top_p_threshold(probs, p, use_numpy)
    if not tie:
        return probs >= tau
    above = probs > tau
    at = probs == tau
    return above | (at & (at.cumsum(dim=-1) <= k - above.sum(dim=-1, keepdim=True)))


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits (ties with the k-th are kept), the rest become -inf."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def _weights(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Unnormalised sampling weights: softmax after temperature and top-k, top-p zeros, in the
    logits' precision (at least float32; at most cfg.dtype)."""
    if cfg.vocab_limit is not None and cfg.vocab_limit < logits.shape[-1]:
        logits = logits[..., : cfg.vocab_limit]
    work = torch.promote_types(logits.dtype, torch.float32)
    target = work if cfg.dtype == torch.float64 else cfg.dtype
    if cfg.temperature == 1.0 and not 0 < cfg.top_k < logits.shape[-1]:
        probs = torch.softmax(logits, dim=-1, dtype=target)  # the conversion inside the softmax: no copy first
    else:
        logits = logits.to(target)
        if cfg.temperature != 1.0:
            logits = logits / cfg.temperature
        probs = torch.softmax(top_k_filter(logits, cfg.top_k), dim=-1)
    if cfg.top_p < 1.0:
        probs = probs * top_p_mask(probs, cfg.top_p)
    return probs


def probabilities(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The distribution a token is drawn from, after temperature, top-k and top-p, in cfg.dtype."""
    w = _weights(logits, cfg).to(cfg.dtype)
    return w / w.sum(dim=-1, keepdim=True)


BLOCK = 256  # tokens per block of `categorical`'s two-level inversion


def _below(target: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """`target` kept strictly below `total`: u < 1, but u * total can round up to total, and the
    first cdf entry above it must never be a zero-weight token (trailing zeros have cdf == total)."""
    return torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))


def categorical(weights: torch.Tensor, generator: torch.Generator | None = None,
                dtype: torch.dtype | None = None, uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """One draw per row from unnormalised non-negative weights (R, V), by inverting the CDF.

    `uniforms` (R, 1) in [0, 1), when given, are the draws' uniforms (each sequence's own stream,
    `aogpt.generation.streams`); otherwise they come from `generator`.

    Exact in `dtype` (default the weights' own; float64: one uniform of 53 bits per draw), and much
    cheaper than torch.multinomial on the CPU. A zero-weight token is never drawn. A large vocabulary
    is inverted in two levels, as one cumulative sum would be: the sums of blocks of `BLOCK` tokens
    choose the block (their running sum accumulated in `dtype`), the cumulative sum inside that block
    alone, in `dtype`, chooses the token, so only R x BLOCK weights are accumulated one by one
    instead of R x V. Each block's own sum is a pairwise (cascade) sum in the weights' precision:
    its relative error, at most a few float32 roundings of that block's mass, is the order of the
    weights' own rounding, and unlike a float32 running sum over the whole vocabulary it does not
    grow with the mass of the tokens before it (a 0.16x cost: no float64 copy of R x V weights).
    """
    dtype = dtype or weights.dtype
    R, V = weights.shape
    u = torch.rand(R, 1, dtype=dtype, device=weights.device, generator=generator) if uniforms is None else \
        uniforms.reshape(R, 1).to(dtype)
    if V <= 2 * BLOCK:
        cdf = weights.to(dtype).cumsum(dim=-1)
        return torch.searchsorted(cdf, _below(u * cdf[:, -1:], cdf[:, -1:]), right=True).squeeze(-1)
    nb = -(-V // BLOCK)
    padded = weights if nb * BLOCK == V and weights.is_contiguous() else \
        torch.nn.functional.pad(weights, (0, nb * BLOCK - V))
    blocks = padded.view(R, nb, BLOCK)
    cdf = blocks.sum(dim=-1).to(dtype).cumsum(dim=-1)
    target = _below(u * cdf[:, -1:], cdf[:, -1:])
    j = torch.searchsorted(cdf, target, right=True)  # cdf[j - 1] <= target < cdf[j]: a block of positive weight
    before = torch.where(j > 0, cdf.gather(1, (j - 1).clamp(min=0)), torch.zeros_like(target))
    inner = blocks.gather(1, j[..., None].expand(R, 1, BLOCK))[:, 0].to(dtype).cumsum(dim=-1)
    k = torch.searchsorted(inner, _below((target - before).clamp(min=0), inner[:, -1:]), right=True)
    return (j * BLOCK + k).squeeze(-1)


def sample_tokens(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None = None,
                  uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """Draw one token per row of `logits` (R, V) -> (R,) int64, with `uniforms` (R, 1) when given
    (`categorical`), else from `generator`."""
    if logits.shape[0] == 0:
        return torch.empty(0, dtype=torch.long, device=logits.device)
    if cfg.greedy:  # temperature and truncation cannot change the argmax
        limit = cfg.vocab_limit or logits.shape[-1]
        return logits[..., :limit].argmax(dim=-1)
    return categorical(_weights(logits, cfg), generator, cfg.dtype, uniforms)
