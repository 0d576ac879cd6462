"""The interface every tokenizer implements (`aogpt.data.tokenizer` names them by spec): text to ids
and back, the end-of-text id, and the bytes behind each id (what bits per byte divides by); and
`HFTokenizer`, what the two tokenizers held by a Hugging Face `tokenizers` object share (our trained
``bpe:N`` and a pretrained model's own ``hf``): encoding, decoding, their JSON and saving it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

TOKENIZER_FILE = "tokenizer.json"
VOCAB_MULTIPLE = 64


def pad_vocab_size(n: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """Round `n` up to a multiple of `multiple` (embedding tables of that size run faster)."""
    return -(-n // multiple) * multiple


def _id_list(ids: Any) -> list[int]:
    """Ids as a flat list of Python ints, from a list, tuple, numpy array or 1-D tensor."""
    if hasattr(ids, "tolist"):  # numpy arrays, torch tensors
        if getattr(ids, "ndim", 1) > 1:
            raise ValueError(f"decode expects a 1-D sequence of ids, got shape {tuple(ids.shape)}")
        ids = ids.tolist()
        if isinstance(ids, int):  # a 0-d array or tensor
            ids = [ids]
    return [int(i) for i in ids]


class Tokenizer(ABC):
    """Text <-> ids. Subclasses set `spec`, `vocab_size` and `eot_id`."""

    spec: str
    vocab_size: int
    eot_id: int
    files: tuple[str, ...] = ()  # what `save` writes
    threads: int | None = None  # encode_batch threads where the backend has them; None = up to 8

    @property
    def padded_vocab_size(self) -> int:
        return pad_vocab_size(self.vocab_size)

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Ids of ordinary text (never the EOT id)."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` over many texts (parallel where the backend allows)."""
        return [self.encode(t) for t in texts]

    def decode(self, ids: Any) -> str:
        """Text of `ids`; out-of-range ids are dropped, EOT becomes ``<|endoftext|>``."""
        n = self.vocab_size
        return self._decode([i for i in _id_list(ids) if 0 <= i < n])

    @abstractmethod
    def _decode(self, ids: list[int]) -> str:
        """Decode ids that are all in ``[0, vocab_size)``."""

    def save(self, directory: Path) -> None:  # noqa: B027 (optional hook, not abstract)
        """Write the files needed to load this tokenizer again (none for gpt2 and bytes)."""

    def byte_lengths(self) -> np.ndarray:
        """UTF-8 bytes each id stands for, shape (vocab_size,), int64; 0 for EOT. The bytes of the
        text behind any ids are ``byte_lengths()[ids].sum()``: bits per byte divides by that."""
        cached = self.__dict__.get("_byte_lengths")
        if cached is None:
            cached = np.asarray(self._byte_lengths(), dtype=np.int64)
            cached.setflags(write=False)
            self.__dict__["_byte_lengths"] = cached
        return cached

    @abstractmethod
    def _byte_lengths(self) -> list[int]:
        """Bytes per id, EOT (and any other special id) 0."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec} vocab={self.vocab_size} eot={self.eot_id}>"


class HFTokenizer(Tokenizer):
    """A tokenizer held by a Hugging Face `tokenizers` object (`backend`), saved as its ``tokenizer.json``.

    `encode` adds no special tokens (the model's start slot plays the beginning-of-text token) and
    encodes special-token text as ordinary text (``encode_special_tokens``), so a literal
    ``<|endoftext|>`` in text never becomes the EOT id. Subclasses set `eot_id` and `_byte_lengths`.
    """

    files: tuple[str, ...] = (TOKENIZER_FILE,)

    def __init__(self, backend: Any, spec: str) -> None:
        self._hf = backend
        backend.encode_special_tokens = True
        self.spec = spec
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        fast = getattr(backend, "encode_batch_fast", None)  # tokenizers >= 0.20: no offsets, faster
        self._encode_batch = fast or backend.encode_batch

    def encode(self, text: str) -> list[int]:
        return self._hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._encode_batch(list(texts), add_special_tokens=False)]

    def _decode(self, ids: list[int]) -> str:
        return self._hf.decode(ids, skip_special_tokens=False)

    def to_json(self) -> str:
        """The tokenizer as Hugging Face `tokenizers` JSON (what `save` writes as ``tokenizer.json``)."""
        return self._hf.to_str(pretty=True)

    def special_ids(self) -> set[int]:
        """Ids of added (special) tokens: they stand for no bytes of text."""
        return set(self._hf.get_added_tokens_decoder())

    def save(self, directory: Path) -> None:
        from aogpt.io import atomic_write_text

        atomic_write_text(Path(directory) / TOKENIZER_FILE, self.to_json())
