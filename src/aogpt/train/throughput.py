"""Throughput: training FLOPs per token, known GPUs' peaks (for MFU), and the logging window."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from aogpt.config import ModelConfig


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward): 6 x weights used in matmuls + attention."""
    d, L = cfg.n_embd, cfg.n_layer
    kv, hidden = cfg.kv_heads * cfg.head_dim, cfg.mlp_hidden or 4 * d  # 12 d^2 per block for AO-GPT's own blocks
    mlp = (3 if cfg.mlp == "swiglu" else 2) * d * hidden
    per_block = 2 * d * d + 2 * d * kv + mlp + (6 * d * cfg.target_dim if cfg.target == "adaln" else 0)
    matmul_params = L * per_block + d * cfg.vocab_size
    return 6 * matmul_params + 12 * L * d * seq_len


PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


def peak_flops(device: torch.device) -> float | None:
    """Dense bf16 peak of known GPUs (for MFU in the logs); None when unknown or on CPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


@dataclass
class Window:
    """The steps since the last train record: their mean loss, and tokens per second over the time
    spent training them (the clock restarts after validation and checkpoints)."""

    tokens: int = 0
    loss: float = 0.0
    steps: int = 0
    start: float = field(default_factory=time.perf_counter)

    def add(self, loss: float, tokens: int) -> None:
        self.tokens += tokens
        self.loss += loss
        self.steps += 1

    def restart_clock(self) -> None:
        self.start = time.perf_counter()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the open window (the clock restarts on resume)."""
        return {"tokens": self.tokens, "loss": self.loss, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tokens, self.loss, self.steps = int(state["tokens"]), float(state["loss"]), int(state["steps"])
        self.restart_clock()

    def close(self, *, flops_per_token: float, peak: float | None, devices: int) -> dict[str, Any]:
        """The window's figures (`loss`, `tokens_per_s`, and `mfu` where the peak is known); then a
        new, empty window begins."""
        elapsed = time.perf_counter() - self.start
        tps = self.tokens / max(elapsed, 1e-9)
        figures: dict[str, Any] = {"loss": self.loss / self.steps, "tokens_per_s": tps}
        if peak:
            figures["mfu"] = tps * flops_per_token / (peak * devices)
        self.tokens, self.loss, self.steps = 0, 0.0, 0
        self.restart_clock()
        return figures
