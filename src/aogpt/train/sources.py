"""Where training batches come from: the `BatchSource` protocol and a synthetic source."""

from __future__ import annotations

from typing import Protocol

import torch


class BatchSource(Protocol):
    """What the trainer reads from: `aogpt.data.PreparedData` or a synthetic stand-in. A source of
    real text may also offer ``token_byte_lengths() -> Tensor`` (UTF-8 bytes behind each id), from
    which validation reports bits per byte."""

    def get_batch(self, split: str, batch_size: int, block_size: int, generator: torch.Generator) -> torch.Tensor: ...

    def iter_eval_batches(self, split: str, batch_size: int, block_size: int, max_batches: int | None = None): ...


class RandomTokens:
    """Uniform random tokens: a data source for benchmarks and tests that need no corpus."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def get_batch(self, split, batch_size, block_size, generator):
        return torch.randint(self.vocab_size, (batch_size, block_size), generator=generator)

    def iter_eval_batches(self, split, batch_size, block_size, max_batches=None):
        g = torch.Generator().manual_seed(0)
        for _ in range(max_batches or 1):
            yield torch.randint(self.vocab_size, (batch_size, block_size), generator=g)
