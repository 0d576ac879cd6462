"""A source model read into our terms: what every reader (`aogpt.adaptation.registry`) returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Source:
    """A left-to-right decoder read into our terms (module docstring)."""

    kind: str                         # what it was: "gpt run", "GPT2LMHeadModel", ...
    backbone: dict[str, Any]          # ModelConfig fields: sizes, norm, positions, MLP, heads, biases, head
    state: dict[str, torch.Tensor]    # backbone weights under a `gpt` model's names
    tokenizer: Any                    # an aogpt tokenizer (`aogpt.data.tokenizer`)
    start_note: str                   # what the start slot holds, said in docs and the checkpoint
