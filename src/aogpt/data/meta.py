"""The shape of a prepared directory's meta.json, checked before anything trusts it, and the check
that a split's token ids fit a vocabulary.

`check_meta` refuses a missing key, a wrong type, a negative count, an unknown dtype or a shard file
name that leaves the directory, each with one line naming the key (`aogpt.validation.require`).
`max_token_id` reads every shard once, vectorised and in chunks, so training can refuse ids outside
the model's vocabulary at load instead of failing with an IndexError at some step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from aogpt.errors import AOGPTError
from aogpt.validation import Range, require

TOKEN_DTYPES = ("uint16", "uint32")
_COUNT = Range(ge=0, le=2**62, integer=True)
_VOCAB = Range(ge=1, le=2**32, integer=True)
CHUNK = 1 << 24  # ids per read when scanning a shard (32-64 MiB)


def check_meta(meta: Any, path: Path) -> dict:
    """`meta` (meta.json of a prepared directory at `path`) if it has every key `PreparedData`
    reads, with the right types and ranges; otherwise one user error naming the key."""
    where, fix = str(path), "re-run aogpt prepare"
    require(meta, "format_version", int, where, fix)
    tokenizer = require(meta, "tokenizer", str, where, fix)
    if not tokenizer:
        raise AOGPTError(f"{where}: tokenizer is empty", fix)
    for key in ("vocab_size", "padded_vocab_size"):
        _VOCAB.check(f"{where}: {key}", require(meta, key, int, where, fix), fix)
    eot = require(meta, "eot_id", int, where, fix)
    if not 0 <= eot < meta["vocab_size"]:
        raise AOGPTError(f"{where}: eot_id {eot} is outside the vocabulary of {meta['vocab_size']}", fix)
    dtype = require(meta, "dtype", str, where, fix)
    if dtype not in TOKEN_DTYPES:
        raise AOGPTError(f"{where}: dtype {dtype!r} is not one of {', '.join(TOKEN_DTYPES)}", fix)
    splits = require(meta, "splits", dict, where, fix)
    for name, info in splits.items():
        here = f"{where}: splits.{name}"
        _COUNT.check(f"{here}.tokens", require(info, "tokens", int, here, fix), fix)
        shards = require(info, "shards", list, here, fix) if isinstance(info, dict) and "shards" in info \
            else [info]
        for i, shard in enumerate(shards):
            at = f"{here}.shards[{i}]" if len(shards) > 1 or "shards" in info else here
            file = require(shard, "file", str, at, fix)
            if Path(file).name != file or file in ("", ".", ".."):
                raise AOGPTError(f"{at}: file {file!r} is not a file name inside the directory", fix)
            _COUNT.check(f"{at}.tokens", require(shard, "tokens", int, at, fix), fix)
    return meta


def max_token_id(maps: list[np.ndarray]) -> int:
    """The largest id in the shards (-1 when they are empty), read in chunks."""
    top = -1
    for data in maps:
        for start in range(0, len(data), CHUNK):
            top = max(top, int(np.max(data[start:start + CHUNK])))
    return top


__all__ = ["TOKEN_DTYPES", "check_meta", "max_token_id"]
