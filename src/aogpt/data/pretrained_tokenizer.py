"""A pretrained model's own tokenizer (spec ``hf``): its Hugging Face ``tokenizer.json`` carried as it is.

What `aogpt adapt` stores with a model adapted from `transformers` (GPT-2's own vocabulary is the
``gpt2`` spec instead). Encoding, decoding and the JSON are those of every tokenizer held by
`tokenizers` (`aogpt.data.tokenizer_base.HFTokenizer`): no special tokens added, special-token text
encoded as ordinary text. The source's end-of-text token is `eot_id`, which the data pipeline puts after each document.
Saved as ``tokenizer.json`` plus ``pretrained_tokenizer.json`` (the end-of-text id).

Bits per byte needs the bytes each id stands for: exact for byte-level BPE (GPT-2, Llama 3, Qwen2,
SmolLM2: one character of the byte alphabet per byte), and for SentencePiece-style vocabularies
(Llama 2: ``▁`` for a space, ``<0xNN>`` byte tokens) counted from the piece's text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from aogpt.data.tokenizer_base import TOKENIZER_FILE, HFTokenizer
from aogpt.errors import AOGPTError

META_FILE = "pretrained_tokenizer.json"
SPEC = "hf"
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


class PretrainedTokenizer(HFTokenizer):
    files = (TOKENIZER_FILE, META_FILE)

    def __init__(self, backend: Any, eot_id: int) -> None:
        super().__init__(backend, SPEC)
        if not 0 <= eot_id < self.vocab_size:
            raise AOGPTError(f"end-of-text id {eot_id} is outside the tokenizer's {self.vocab_size} ids",
                             "re-run aogpt adapt")
        self.eot_id = eot_id

    @classmethod
    def from_backend(cls, backend: Any, eot_id: int) -> PretrainedTokenizer:
        from tokenizers import Tokenizer as BackendTokenizer

        return cls(BackendTokenizer.from_str(backend.to_str()), eot_id)  # a copy: its settings are changed

    @classmethod
    def load(cls, directory: Path) -> PretrainedTokenizer:
        from tokenizers import Tokenizer as BackendTokenizer

        directory = Path(directory)
        try:
            backend = BackendTokenizer.from_str((directory / TOKENIZER_FILE).read_text(encoding="utf-8"))
            meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
            eot = int(meta["eot_id"])
        except Exception as exc:  # OSError, bad JSON, HF's bare Exception, a missing key
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise AOGPTError(f"cannot load the pretrained tokenizer in {directory}: {first}",
                             "re-run aogpt adapt to write it again") from None
        return cls(backend, eot)

    def _byte_lengths(self) -> list[int]:
        special = self.special_ids()
        byte_level = "ByteLevel" in json.dumps(json.loads(self._hf.to_str()).get("decoder"))
        out = []
        for i in range(self.vocab_size):
            piece = self._hf.id_to_token(i)
            if i in special or piece is None:
                out.append(0)
            elif byte_level:
                out.append(len(piece))
            elif _BYTE_TOKEN.fullmatch(piece):
                out.append(1)
            else:
                out.append(len(piece.replace("\u2581", " ").encode("utf-8")))
        return out

    def save(self, directory: Path) -> None:
        super().save(directory)
        self.save_meta(directory)

    def save_meta(self, directory: Path) -> None:
        from aogpt.io import atomic_write_text

        atomic_write_text(Path(directory) / META_FILE, json.dumps({"eot_id": self.eot_id}))
