"""The data side of aogpt: text corpora -> token files -> training batches, and zero-shot evaluation sets.

Modules, in dependency order (each imports only modules above it; tests/test_structure.py checks for cycles):

* `documents`: `Corpus`, a re-iterable stream of ``(split, text)`` documents, and the validation-split primitives.
* `hf_corpora`: Hugging Face datasets as streamed corpora (``hf:NAME[:CONFIG]``, ``openwebtext``, wikitext).
* `synthetic`: generated tasks where the unmasking order matters (Sudoku), with puzzles and a checker.
* `corpora`: `load_corpus` (bundled shakespeare / wiki-excerpt, local .txt/.jsonl files, or hf_corpora), splits.
* `tokenizer`: the gpt2, bytes and bpe:N tokenizers (`load_tokenizer`, `train_bpe`).
* `shards`: tokenizing documents in worker processes into sharded token files, resumably.
* `prepared`: `prepare` (a corpus -> a prepared directory) and `PreparedData` (batches from it).
* `zeroshot`: the SEDD/MDLM zero-shot evaluation sets: loaders, detokenizers, packing into blocks.
* `fim`: fill in the middle: the sentinel tokens, the PSM/SPM transformation of training rows.

The common entry points are re-exported here (``from aogpt.data import prepare, PreparedData,
load_tokenizer, load_corpus``), each imported on first use: ``import aogpt.data.shards`` (what a spawned
tokenizer worker does) stays free of torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    # prepared
    "BPE_TRAIN_CHARS": "prepared",
    "DEFAULT_SHARD_TOKENS": "prepared",
    "FORMAT_VERSION": "prepared",
    "META_FILE": "prepared",
    "SHARDED_FORMAT_VERSION": "prepared",
    "SPLITS": "prepared",
    "PreparedData": "prepared",
    "default_out_dir": "prepared",
    "partial_dir": "prepared",
    "prepare": "prepared",
    "token_dtype": "prepared",
    # shards
    "split_pieces": "shards",
    # tokenizer
    "DEFAULT_TOKENIZER": "tokenizer",
    "ByteTokenizer": "tokenizer",
    "Tokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
    "normalize_spec": "tokenizer",
    "parse_spec": "tokenizer",
    "tokenizer_info": "tokenizer",
    "train_bpe": "tokenizer",
    # corpora
    "Corpus": "documents",
    "load_corpus": "corpora",
}

if TYPE_CHECKING:  # what the lazy re-exports resolve to, for type checkers and readers
    from aogpt.data.corpora import load_corpus
    from aogpt.data.documents import Corpus
    from aogpt.data.prepared import (
        BPE_TRAIN_CHARS,
        DEFAULT_SHARD_TOKENS,
        FORMAT_VERSION,
        META_FILE,
        SHARDED_FORMAT_VERSION,
        SPLITS,
        PreparedData,
        default_out_dir,
        partial_dir,
        prepare,
        token_dtype,
    )
    from aogpt.data.shards import split_pieces
    from aogpt.data.tokenizer import (
        DEFAULT_TOKENIZER,
        ByteTokenizer,
        Tokenizer,
        load_tokenizer,
        normalize_spec,
        parse_spec,
        tokenizer_info,
        train_bpe,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = [
    "BPE_TRAIN_CHARS",
    "DEFAULT_SHARD_TOKENS",
    "DEFAULT_TOKENIZER",
    "FORMAT_VERSION",
    "META_FILE",
    "SHARDED_FORMAT_VERSION",
    "SPLITS",
    "ByteTokenizer",
    "Corpus",
    "PreparedData",
    "Tokenizer",
    "default_out_dir",
    "load_corpus",
    "load_tokenizer",
    "normalize_spec",
    "parse_spec",
    "partial_dir",
    "prepare",
    "split_pieces",
    "token_dtype",
    "tokenizer_info",
    "train_bpe",
]
