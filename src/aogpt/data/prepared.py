"""Corpora -> memory-mapped token files, and batches drawn from them.

`prepare` writes a directory::

    train.bin, val.bin   token ids, flat, native byte order (uint16 if the vocabulary fits, else uint32)
    meta.json            tokenizer spec and sizes, dtype, token/document/UTF-8 byte counts per split,
                         source checksums, corpus name, split rule, format version
    tokenizer.json       for bpe:N only: the tokenizer trained on the training split
    record_tokens        (in meta.json) only for fixed-length corpora: tokens per document

A split of more than ``shard_tokens`` ids (default 100 M) is written as shards instead,
``train-00000.bin``, ``train-00001.bin``, ... (`aogpt.data.shards`): meta.json then lists them under
``splits.<name>.shards`` with their token and document counts and says ``format_version: 2``.
Corpora that fit in one shard per split keep the single-file layout and format 1, byte for byte.

Decisions:

* Every document is followed by one EOT id (``documents`` = the number of EOT ids); blank ones are
  skipped. ``<|endoftext|>`` written inside a text stays ordinary text.
* Deterministic: the same corpus, tokenizer spec, seed and options give byte-identical files (no
  timestamps in meta.json), whatever the number of workers, and after any number of interruptions
  and resumptions. Documents are encoded in corpus order; large documents are cut into ~64K-character
  pieces only where a non-space character meets a newline, a point where the GPT-2 pre-tokenizer
  always splits, so the ids equal those of the whole document.
* The work happens in the sibling directory ``.<out>.partial``, renamed over ``out`` at the end, so
  a half-done prepare never looks like a prepared directory and a failed run leaves a previous good
  one untouched. An interrupted run that finished at least one shard keeps its partial directory and
  the next run with the same settings resumes it (`resume="auto"`; ``"require"`` insists on resuming,
  ``"restart"`` discards it); with other settings it is refused. Otherwise the partial directory is
  removed. An existing non-empty ``out`` that is not a prepared directory is never replaced.
* bpe:N trains on (at most the first 200 M characters of) the training split only.
* ``bytes`` of a split counts the UTF-8 bytes its ids stand for (EOT none), for bits per byte;
  older directories compute it from their ids on first use (`PreparedData.num_bytes`).

Batches: `PreparedData.get_batch` takes ``batch_size`` random windows of exactly ``block_size``
contiguous tokens (the model predicts every token of its window); a window never crosses a shard
boundary, and window starts are uniform over all valid starts of all shards (``[0, n_i - block_size]``
in shard i: a shard is chosen with probability proportional to its number of valid starts). A
fixed-length corpus (the synthetic tasks; meta.json's ``record_tokens``: every document, EOT
included, is that many tokens) read with ``block_size == record_tokens`` gets whole documents
instead: starts only at document boundaries, uniformly over the documents. Starts are drawn with
``torch.randint`` from the caller's ``torch.Generator`` (cheap, seedable, checkpointable), a
``numpy.random.Generator``, or an int seed (a fresh generator per call: same seed, same batch).
`PreparedData.iter_eval_batches` yields the sequential windows ``[0, B)``, ``[B, 2B)``, ... of each
shard in turn (the last batch may be short; a shard's trailing partial window is dropped). Both read
only the windows they need from the memory maps.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aogpt.data.corpora import load_corpus
from aogpt.data.meta import check_meta, max_token_id
from aogpt.data.shards import (
    PROGRESS_FILE,
    default_workers,
    has_progress,
    load_progress,
    new_progress,
    split_pieces,
    write_splits,
)
from aogpt.data.tokenizer import (
    Tokenizer,
    checkpoint_tokenizer,
    count_bytes,
    load_tokenizer,
    normalize_spec,
    parse_spec,
    tokenizer_info,
    train_bpe,
)
from aogpt.errors import AOGPTError
from aogpt.io import directory_lock, ensure_writable_dir, read_json, replace_dir, write_json

FORMAT_VERSION = 1  # single-file splits
SHARDED_FORMAT_VERSION = 2  # at least one split in shards
SPLITS = ("train", "val")
META_FILE = "meta.json"
BPE_TRAIN_CHARS = 200_000_000
DEFAULT_SHARD_TOKENS = 100_000_000


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def default_out_dir(corpus: str, tokenizer_spec: str) -> Path:
    """``data/<corpus>-<tokenizer>``, e.g. ``data/shakespeare-bpe4096``."""
    name = corpus
    if not corpus.startswith("hf:") and ("/" in corpus or "\\" in corpus or Path(corpus).suffix):
        name = Path(corpus).stem
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{name}-{tokenizer_spec.replace(':', '')}").strip("-.")
    return Path("data") / slug


def partial_dir(out: Path) -> Path:
    """Where `prepare` builds `out` (kept after an interruption, for resuming)."""
    return out.with_name(f".{out.name}.partial")


def _capped(texts: Iterable[str], limit: int) -> Iterator[str]:
    total = 0
    for t in texts:
        if total >= limit:
            return
        total += len(t)
        yield t


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise AOGPTError(f"{out} exists and is not a directory", "choose another --out")
    if out.is_dir() and any(out.iterdir()) and not (out / META_FILE).is_file():
        raise AOGPTError(
            f"{out} is not empty and is not a prepared data directory; refusing to replace it",
            "choose a new --out or empty that folder",
        )


def _finish_splits(work: Path, name: str, shards_by_split: dict[str, list[dict]]) -> dict:
    """meta.json's ``splits``: a split in one shard becomes ``<split>.bin`` (the format-1 layout)."""
    splits = {}
    for split, shards in shards_by_split.items():
        tokens, documents = sum(s["tokens"] for s in shards), sum(s["documents"] for s in shards)
        if tokens == 0:
            shutil.rmtree(work, ignore_errors=True)  # resuming could not change this
            fix = "add documents" if split == "train" else "raise --val-fraction or add documents"
            raise AOGPTError(f"corpus {name} gave an empty {split} split", fix)
        if len(shards) == 1:
            os.replace(work / shards[0]["file"], work / f"{split}.bin")
            splits[split] = {"file": f"{split}.bin", "tokens": tokens, "documents": documents}
        else:
            splits[split] = {"shards": shards, "tokens": tokens, "documents": documents}
    return splits


def _record_tokens(work: Path, splits: dict, dtype: np.dtype, tok: Tokenizer, name: str) -> int:
    """The common length in tokens (EOT included) of every document of a fixed-length corpus, checked
    on the written files: its EOT ids must sit exactly every R tokens, and every shard hold whole
    documents. Otherwise (a tokenizer that merges characters) training windows could not hold whole
    documents, so this is a user error."""
    lengths = set()
    for info in splits.values():
        for shard in info.get("shards", [info]):
            ids = np.fromfile(work / shard["file"], dtype=dtype)
            ends = np.flatnonzero(ids == tok.eot_id)
            if len(ends) == 0 or len(ids) % len(ends):
                lengths.add(-1)
                continue
            R = len(ids) // len(ends)
            lengths.add(R if np.array_equal(ends, np.arange(R - 1, len(ids), R)) else -1)
    if len(lengths) != 1 or -1 in lengths:
        shutil.rmtree(work, ignore_errors=True)
        raise AOGPTError(f"the documents of {name} do not all encode to the same number of {tok.spec} tokens",
                         "use --tokenizer bytes (one token per character)")
    return lengths.pop()


def prepare(
    corpus: str,
    tokenizer_spec: str,
    out: Path,
    *,
    val_fraction: float | None = None,
    val_docs: int | None = None,
    seed: int = 1337,
    progress: bool = True,
    max_docs: int | None = None,
    workers: int | None = None,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    resume: str = "auto",
    **opts: Any,
) -> dict:
    """Tokenize `corpus` into ``out/{train,val}.bin`` (or shards) + meta.json; returns the meta dict.

    `val_fraction` (default 0.05) or `val_docs` (the last N documents) apply only to corpora without
    a validation split; `workers` processes encode (None: in-process for small corpora, else one per
    CPU); `resume` is auto, require or restart (module docstring); `opts` go to
    `aogpt.data.corpora.load_corpus` (``text_field``, ``txt_docs``). The returned dict adds ``seconds``
    and ``resumed_documents`` to what meta.json holds.
    """
    start = time.perf_counter()
    path = Path(tokenizer_spec).expanduser()  # a checkpoint's own tokenizer (a pretrained model's), or a spec
    given = checkpoint_tokenizer(path) if path.is_dir() else None
    spec = given.spec if given is not None else normalize_spec(tokenizer_spec)
    kind, n = parse_spec(spec)
    out = Path(out).expanduser()
    _check_out(out)
    if workers is not None and workers < 1:
        raise AOGPTError(f"--workers must be at least 1, got {workers}", "pass a positive number")
    if shard_tokens < 1:
        raise AOGPTError(f"--shard-tokens must be at least 1, got {shard_tokens}", "pass e.g. 100000000")
    settings = {"corpus": corpus, "tokenizer": spec, "seed": seed, "max_docs": max_docs, "val_fraction": val_fraction,
                "val_docs": val_docs, "options": dict(sorted(opts.items())), "shard_tokens": shard_tokens}
    src = load_corpus(corpus, val_fraction=val_fraction, val_docs=val_docs, seed=seed, max_docs=max_docs, **opts)
    ensure_writable_dir(out.parent)
    with directory_lock(out, "aogpt prepare"):  # one writer per output (and its .partial directory)
        _check_out(out)
        work = partial_dir(out)
        state = load_progress(work, settings, resume)
        if state is None:
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
        resumed = sum(state["done"].values()) if state else 0
        if state is not None and progress:
            finished = sum(len(v["closed"]) for v in state["splits"].values())
            print(f"resuming {work}: {resumed:,} documents, {finished} shards done", file=sys.stderr)
        try:
            if state is not None and kind == "bpe":
                tok = load_tokenizer(spec, work)  # trained before the interruption
            elif kind == "bpe" and given is None:
                assert n is not None
                tok = train_bpe(_capped(src.documents("train"), BPE_TRAIN_CHARS), n)
            else:
                tok = given or load_tokenizer(spec)
            tok.save(work)
            dtype = token_dtype(tok.vocab_size)
            if state is None:
                state = new_progress(settings, dtype)
            elif state["dtype"] != dtype.name:
                raise AOGPTError(f"{work} was written as {state['dtype']}, not {dtype.name}", "pass --restart")
            shards = write_splits(
                src.stream,
                tok,
                work,
                dtype,
                shard_tokens,
                workers or default_workers(src.total_chars),
                state,
                total_chars=src.total_chars,
                show_progress=progress,
            )
            (work / PROGRESS_FILE).unlink(missing_ok=True)  # from here on, a crash restarts from scratch
            splits = _finish_splits(work, src.name, shards)
            for info in splits.values():
                files = [s["file"] for s in info.get("shards", [info])]
                info["bytes"] = count_bytes([np.memmap(work / f, dtype=dtype, mode="r") for f in files], tok)
            record = _record_tokens(work, splits, dtype, tok, src.name) if src.fixed_length else None
            sharded = any("shards" in info for info in splits.values())
            meta = {
                "format_version": SHARDED_FORMAT_VERSION if sharded else FORMAT_VERSION,
                "corpus": src.name,
                "split_rule": src.split_rule,
                "seed": seed,
                "max_docs": max_docs,
                "options": dict(sorted(opts.items())),
                **tokenizer_info(tok),
                "dtype": dtype.name,
                "eot": "after every document",
                "splits": splits,
                "sources": src.sources,
                **({"shard_tokens": shard_tokens} if sharded else {}),
                **({"record_tokens": record} if record else {}),
            }
            write_json(work / META_FILE, meta)
            replace_dir(work, out)
        except BaseException:
            if not has_progress(work):
                shutil.rmtree(work, ignore_errors=True)
            raise
    # returned, not written: meta.json stays deterministic
    return {**meta, "seconds": time.perf_counter() - start, "resumed_documents": resumed}


class PreparedData:
    """A directory written by `prepare`: memory-mapped splits (or shards), its tokenizer, batches."""

    def __init__(self, directory: Path | str, expect_tokenizer: str | None = None) -> None:
        d = Path(directory).expanduser()
        make = f"create it with `aogpt prepare --out {d}`"
        if not d.is_dir():
            raise AOGPTError(f"prepared data directory {d} does not exist", make)
        if not (d / META_FILE).is_file():
            raise AOGPTError(f"{d} has no {META_FILE}, so it is not a prepared data directory", make)
        meta = read_json(d / META_FILE, "prepared data file")
        found = meta.get("format_version") if isinstance(meta, dict) else None
        if found not in (FORMAT_VERSION, SHARDED_FORMAT_VERSION):
            raise AOGPTError(
                f"{d} has data format {found}, expected {FORMAT_VERSION} or {SHARDED_FORMAT_VERSION}",
                "re-run aogpt prepare",
            )
        check_meta(meta, d / META_FILE)
        if expect_tokenizer is not None:
            want = normalize_spec(expect_tokenizer)
            if meta.get("tokenizer") != want:
                raise AOGPTError(
                    f"{d} was prepared with tokenizer {meta.get('tokenizer')}, not {want}",
                    f"use --tokenizer {meta.get('tokenizer')}, or run `aogpt prepare --tokenizer {want}` "
                    "into another --out",
                )
        self.directory = d
        self.meta: dict = meta
        self._tokenizer: Tokenizer | None = None
        self._maps: dict[str, list[np.ndarray]] = {}

    def __repr__(self) -> str:
        counts = ", ".join(f"{s}={self.num_tokens(s)}" for s in self.meta["splits"])
        return f"<PreparedData {self.directory} {self.meta['tokenizer']} {counts}>"

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.meta["tokenizer"], self.directory)
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def padded_vocab_size(self) -> int:
        return int(self.meta["padded_vocab_size"])

    @property
    def eot_id(self) -> int:
        return int(self.meta["eot_id"])

    def _info(self, split: str) -> dict:
        splits = self.meta.get("splits", {})
        if split not in splits:
            raise AOGPTError(f"{self.directory} has no split {split!r}", f"use one of {', '.join(splits)}")
        return splits[split]

    def shard_info(self, split: str) -> list[dict]:
        """``{file, tokens, documents}`` of each shard of `split` (one for a single-file split)."""
        info = self._info(split)
        return info["shards"] if "shards" in info else [info]

    def num_tokens(self, split: str) -> int:
        return int(self._info(split)["tokens"])

    def num_bytes(self, split: str) -> int:
        """UTF-8 bytes of the split's text: from meta.json, or counted from its ids (then kept)."""
        info = self._info(split)
        if "bytes" not in info:
            info["bytes"] = count_bytes(self.shards(split), self.tokenizer)
        return int(info["bytes"])

    def token_byte_lengths(self) -> torch.Tensor:
        """UTF-8 bytes behind each token id (EOT 0): the bytes of a batch are ``lengths[batch].sum()``."""
        return torch.from_numpy(self.tokenizer.byte_lengths().copy())

    def shards(self, split: str) -> list[np.ndarray]:
        """The split's shards as read-only np.memmaps (nothing is read until indexed)."""
        if split not in self._maps:
            infos, dtype = self.shard_info(split), np.dtype(self.meta["dtype"])
            if sum(int(s["tokens"]) for s in infos) != self.num_tokens(split):
                raise AOGPTError(f"{self.directory / META_FILE} miscounts the {split} shards", "re-run aogpt prepare")
            maps = []
            for info in infos:
                path = self.directory / info["file"]
                size = path.stat().st_size if path.is_file() else -1
                if size != info["tokens"] * dtype.itemsize:
                    raise AOGPTError(
                        f"{path} has {max(size, 0)} bytes, but {META_FILE} promises {info['tokens']} "
                        f"{dtype.name} tokens",
                        "re-run aogpt prepare",
                    )
                tokens = int(info["tokens"])
                maps.append(np.memmap(path, dtype=dtype, mode="r", shape=(tokens,)) if tokens else np.zeros(0, dtype))
            self._maps[split] = maps
        return self._maps[split]

    def check_token_ids(self, vocab_size: int, splits: Iterable[str] = SPLITS) -> None:
        """Refuse a split holding an id >= `vocab_size` (a damaged file, or data of another
        tokenizer). Reads every shard once (`aogpt.data.meta.max_token_id`); skipped when the file's
        dtype cannot hold such an id."""
        for split in splits:
            if np.iinfo(np.dtype(self.meta["dtype"])).max < vocab_size:
                continue
            top = max_token_id(self.shards(split))
            if top >= vocab_size:
                raise AOGPTError(
                    f"the {split} split of {self.directory} holds token id {top}, outside the vocabulary of "
                    f"{vocab_size}",
                    "the files are damaged or were made with another tokenizer: re-run aogpt prepare",
                )

    def split(self, name: str) -> np.ndarray:
        """A single-file split's ids as a read-only np.memmap (sharded splits: use `shards`)."""
        maps = self.shards(name)
        if len(maps) != 1:
            raise ValueError(f"the {name} split of {self.directory} has {len(maps)} shards: use shards({name!r})")
        return maps[0]

    @property
    def record_tokens(self) -> int | None:
        """The length of every document (EOT included) of a fixed-length corpus (synthetic tasks), else None."""
        value = self.meta.get("record_tokens")
        return int(value) if value else None

    def _stride(self, block_size: int) -> int:
        """Distance between window starts: a whole document when windows are exactly one document long."""
        return self.record_tokens if self.record_tokens == block_size else 1

    def _valid_starts(self, split: str, block_size: int) -> np.ndarray:
        """Number of window starts in each shard; a user error when no shard holds one block."""
        if block_size < 1:
            raise AOGPTError(f"block size must be at least 1, got {block_size}", "pass a positive --block-size")
        sizes = np.array([int(s["tokens"]) for s in self.shard_info(split)], dtype=np.int64)
        if sizes.max() < block_size:
            more = "a larger --val-fraction or " if split == "val" else ""
            if len(sizes) == 1:
                raise AOGPTError(
                    f"the {split} split of {self.directory} has {sizes[0]} tokens, "
                    f"fewer than one block of {block_size}",
                    f"use a smaller block size, or {more}a larger corpus",
                )
            raise AOGPTError(
                f"every shard of the {split} split of {self.directory} has fewer than {block_size} tokens "
                f"(largest {sizes.max()})",
                "use a smaller block size, or re-run aogpt prepare with a larger --shard-tokens",
            )
        return np.maximum(sizes - block_size, -1) // self._stride(block_size) + 1

    def get_batch(
        self,
        split: str,
        batch_size: int,
        block_size: int,
        generator: torch.Generator | np.random.Generator | int | None = None,
    ) -> torch.Tensor:
        """``(batch_size, block_size)`` int64 ids from uniformly random windows of one split."""
        counts = self._valid_starts(split, block_size)
        high = int(counts.sum())
        if isinstance(generator, np.random.Generator):
            starts = generator.integers(0, high, size=batch_size)
        else:
            if isinstance(generator, int) and not isinstance(generator, bool):
                generator = torch.Generator().manual_seed(generator)
            elif generator is not None and not isinstance(generator, torch.Generator):
                raise TypeError(f"generator must be a torch/numpy Generator, an int or None, not {type(generator)}")
            device = generator.device if generator is not None else "cpu"
            starts = torch.randint(high, (batch_size,), generator=generator, device=device).cpu().numpy()
        ends = np.cumsum(counts)
        shard = np.searchsorted(ends, starts, side="right")  # global start -> (shard, offset)
        offset = (starts - (ends[shard] - counts[shard])) * self._stride(block_size)
        maps = self.shards(split)
        x = np.empty((batch_size, block_size), dtype=np.int64)
        for i, (k, o) in enumerate(zip(shard.tolist(), offset.tolist(), strict=True)):
            x[i] = maps[k][o : o + block_size]
        return torch.from_numpy(x)

    def num_eval_batches(self, split: str, batch_size: int, block_size: int, max_batches: int | None = None) -> int:
        """How many batches `iter_eval_batches` yields (for progress bars)."""
        self._valid_starts(split, block_size)
        windows = sum(int(s["tokens"]) // block_size for s in self.shard_info(split))
        batches = math.ceil(windows / batch_size)
        return batches if max_batches is None else min(batches, max_batches)

    def iter_eval_batches(
        self, split: str, batch_size: int, block_size: int, max_batches: int | None = None
    ) -> Iterator[torch.Tensor]:
        """Sequential non-overlapping windows of each shard in turn, `batch_size` at a time."""
        total = self.num_eval_batches(split, batch_size, block_size, max_batches)
        rows: list[np.ndarray] = []
        have = emitted = 0
        for data in self.shards(split):
            windows, w = len(data) // block_size, 0
            while w < windows and emitted < total:
                take = min(windows - w, batch_size - have)
                chunk = np.asarray(data[w * block_size : (w + take) * block_size], dtype=np.int64)
                rows.append(chunk.reshape(take, block_size))
                have, w = have + take, w + take
                if have == batch_size:
                    yield torch.from_numpy(np.concatenate(rows))
                    rows, have, emitted = [], 0, emitted + 1
        if rows and emitted < total:
            yield torch.from_numpy(np.concatenate(rows))


__all__ = [
    "DEFAULT_SHARD_TOKENS",
    "FORMAT_VERSION",
    "PreparedData",
    "default_out_dir",
    "partial_dir",
    "prepare",
    "split_pieces",
    "token_dtype",
]
