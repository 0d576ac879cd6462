"""Token-level sampling rules: temperature, top-k, top-p, greedy and the categorical draw.

Everything here maps a batch of logits (R, V) to R token ids; the generator decides which rows to
sample. The draw is done in float64 by default: float32 Gumbel noise (or float32 probabilities)
visibly lowers the effective temperature over long sequences (paper section 4.3).

Top-p follows the paper's reference rule, pinned by the fixture's ``topp_*`` arrays: sort the
probabilities in descending order, drop every token whose *inclusive* cumulative sum exceeds p (the
token that crosses p is dropped too), always keep the most likely token, renormalise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from aogpt.errors import AOGPTError


@dataclass(frozen=True)
class SamplingConfig:
    """How one token is drawn from the model's logits."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k truncation
    greedy: bool = False
    dtype: torch.dtype = torch.float64  # precision of the softmax and the categorical draw
    vocab_limit: int | None = None  # ids >= this (vocabulary padding) are never sampled

    def validate(self) -> SamplingConfig:
        if not self.temperature > 0 or self.temperature != self.temperature:
            raise AOGPTError(f"temperature must be > 0, got {self.temperature}", "use e.g. --temperature 1.0")
        if not 0.0 < self.top_p <= 1.0:
            raise AOGPTError(f"top-p must lie in (0, 1], got {self.top_p}", "use e.g. --top-p 0.95 (1 disables it)")
        if self.top_k < 0:
            raise AOGPTError(f"top-k must be >= 0, got {self.top_k}", "use 0 to disable it")
        if self.dtype not in (torch.float64, torch.float32):
            raise AOGPTError(f"sampling dtype {self.dtype} is not supported", "use torch.float64 or torch.float32")
        if self.vocab_limit is not None and self.vocab_limit < 1:
            raise AOGPTError(f"vocab_limit must be positive, got {self.vocab_limit}", "pass the tokenizer's vocab size")
        return self

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["dtype"] = str(self.dtype).removeprefix("torch.")
        return out


def top_p_filter(probs: torch.Tensor, p: float) -> torch.Tensor:
    """The reference top-p rule on probabilities (last dim): returns renormalised probabilities."""
    if p >= 1.0:
        return probs
    sorted_probs, idx = probs.sort(dim=-1, descending=True)
    drop = sorted_probs.cumsum(dim=-1) > p
    drop[..., 0] = False  # the most likely token always survives
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    out = torch.zeros_like(probs).scatter_(-1, idx, sorted_probs)
    return out / out.sum(dim=-1, keepdim=True)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits (ties with the k-th are kept), the rest become -inf."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def probabilities(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The distribution a token is drawn from, after temperature, top-k and top-p, in cfg.dtype."""
    if cfg.vocab_limit is not None and cfg.vocab_limit < logits.shape[-1]:
        logits = logits[..., : cfg.vocab_limit]
    logits = logits.to(cfg.dtype)
    if cfg.temperature != 1.0:
        logits = logits / cfg.temperature
    logits = top_k_filter(logits, cfg.top_k)
    return top_p_filter(torch.softmax(logits, dim=-1), cfg.top_p)


def sample_tokens(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row of `logits` (R, V) -> (R,) int64."""
    if logits.shape[0] == 0:
        return torch.empty(0, dtype=torch.long, device=logits.device)
    if cfg.greedy:  # temperature and truncation cannot change the argmax
        limit = cfg.vocab_limit or logits.shape[-1]
        return logits[..., :limit].argmax(dim=-1)
    probs = probabilities(logits, cfg)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
