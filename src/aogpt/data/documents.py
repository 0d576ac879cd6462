"""What every corpus is: a `Corpus` (a re-iterable stream of ``(split, text)`` documents), and the
validation-split primitives that both `aogpt.data.corpora` and `aogpt.data.hf_corpora` use.

`unit_hash` maps ``(seed, document index)`` to [0, 1) with a keyed BLAKE2 hash: deterministic and
independent of library versions. In-memory corpora rank documents by it, streamed ones compare it
with ``val_fraction`` (rules in `aogpt.data.corpora`'s docstring).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice

from aogpt.errors import AOGPTError

DEFAULT_VAL_FRACTION = 0.05


@dataclass
class Corpus:
    """A re-iterable stream of ``(split, text)`` documents plus what `meta.json` records about it."""

    name: str
    docs: Callable[[], Iterator[tuple[str, str]]]
    sources: dict[str, str] = field(default_factory=dict)
    split_rule: str = ""
    total_chars: int | None = None  # for the progress bar; None when streamed
    # restart after {split: documents already consumed}; None = skip by reading `docs()` (in memory)
    resume: Callable[[dict[str, int]], Iterator[tuple[str, str]]] | None = None
    # every document has the same length (synthetic tasks): `prepare` then checks that every one
    # encodes to the same number of tokens and records it, so training windows hold whole documents
    fixed_length: bool = False

    def documents(self, split: str | None = None) -> Iterator[str]:
        """The texts of one split (or all), in corpus order."""
        return (text for s, text in self.docs() if split is None or s == split)

    def stream(self, done: Mapping[str, int] | None = None) -> Iterator[tuple[str, str]]:
        """`docs()` without its first ``sum(done.values())`` documents (``done`` counts them per split)."""
        k = sum(done.values()) if done else 0
        if k == 0:
            return self.docs()
        if self.resume is not None:
            return self.resume(dict(done or {}))
        return islice(self.docs(), k, None)


def unit_hash(seed: int, index: int) -> float:
    """A deterministic number in [0, 1) for document `index` under `seed`."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def check_val_docs(val_docs: int) -> int:
    if int(val_docs) < 1:
        raise AOGPTError(f"--val-docs must be at least 1, got {val_docs}", "pass a positive number of documents")
    return int(val_docs)


def check_val_fraction(val_fraction: float) -> float:
    if not 0.0 < float(val_fraction) < 1.0:
        raise AOGPTError(f"--val-fraction must be between 0 and 1, got {val_fraction}", "pass e.g. 0.05")
    return float(val_fraction)


__all__ = ["DEFAULT_VAL_FRACTION", "Corpus", "check_val_docs", "check_val_fraction", "unit_hash"]
