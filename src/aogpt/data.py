"""Corpora -> memory-mapped token files, and batches drawn from them.

`prepare` writes a directory::

    train.bin, val.bin   token ids, flat, native byte order (uint16 if the vocabulary fits, else uint32)
    meta.json            tokenizer spec and sizes, dtype, token/document counts per split, source
                         checksums, corpus name, split rule, format version
    tokenizer.json       for bpe:N only: the tokenizer trained on the training split

Decisions:

* Every document is followed by one EOT id (so each split ends with EOT and ``documents`` equals
  the number of EOT ids). ``<|endoftext|>`` written inside a text stays ordinary text.
* Deterministic: the same corpus, tokenizer spec, seed and options give byte-identical files (no
  timestamps in meta.json). Documents are encoded in corpus order; large documents are cut into
  ~64K-character pieces only where a non-space character meets a newline, a point where the GPT-2
  pre-tokenizer always splits, so the ids equal those of the whole document. Pieces are encoded in
  parallel (tiktoken threads / HF tokenizers' thread pool).
* The directory is built in a temporary sibling and renamed over ``out`` at the end (`atomic_dir`), so
  a failed run leaves a previous good directory untouched. An existing non-empty ``out`` that is not
  a prepared directory is never replaced.
* bpe:N trains on (at most the first 200 M characters of) the training split only.

Batches: `PreparedData.get_batch` takes ``batch_size`` random windows of exactly ``block_size``
contiguous tokens (the model predicts every token of its window); window starts are uniform over
``[0, n - block_size]``, drawn with ``torch.randint`` from the caller's ``torch.Generator`` (cheap,
seedable, and its state can be checkpointed), a ``numpy.random.Generator``, or an int seed (a fresh
generator per call: same seed, same batch). `PreparedData.iter_eval_batches` yields the sequential
non-overlapping windows ``[0, B)``, ``[B, 2B)``, ... (last batch may be short; a trailing partial window
is dropped). Both read only the windows they need from the memory map.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Iterable, Iterator
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from aogpt.corpora import Corpus, load_corpus
from aogpt.errors import AOGPTError
from aogpt.io import atomic_dir, read_json, write_json
from aogpt.tokenizer import Tokenizer, load_tokenizer, normalize_spec, parse_spec, tokenizer_info, train_bpe

FORMAT_VERSION = 1
SPLITS = ("train", "val")
META_FILE = "meta.json"
PIECE_CHARS = 1 << 16  # documents longer than this are encoded in pieces (parallelism, memory)
BATCH_CHARS = 1 << 22  # text handed to one encode_batch call
BPE_TRAIN_CHARS = 200_000_000

_SAFE_CUT = re.compile(r"(?<=\S)\n")


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


def split_pieces(text: str, target: int = PIECE_CHARS) -> list[str]:
    """Cut `text` into pieces of about `target` characters, only where the encoding is unaffected."""
    pieces, start = [], 0
    while len(text) - start > target:
        m = _SAFE_CUT.search(text, start + target)
        if m is None:
            break
        pieces.append(text[start : m.start()])
        start = m.start()
    pieces.append(text[start:])
    return pieces


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


class _SplitWriter:
    """Encodes batches of documents of one split and appends ids + EOT to its .bin file."""

    def __init__(self, path: Path, tok: Tokenizer, dtype: np.dtype) -> None:
        self.f = open(path, "wb")  # noqa: SIM115 (closed by close())
        self.tok, self.dtype = tok, dtype
        self.docs: list[str] = []
        self.chars = self.tokens = self.documents = 0

    def add(self, text: str) -> int:
        """Queue one document; returns the characters flushed (for the progress bar)."""
        self.docs.append(text)
        self.chars += len(text)
        return self.flush() if self.chars >= BATCH_CHARS else 0

    def flush(self) -> int:
        if not self.docs:
            return 0
        counts, pieces = [], []
        for doc in self.docs:
            parts = split_pieces(doc)
            counts.append(len(parts))
            pieces += parts
        ids = self.tok.encode_batch(pieces)
        eot, k, seqs = [self.tok.eot_id], 0, []
        for c in counts:
            seqs += ids[k : k + c]
            seqs.append(eot)
            k += c
        arr = np.fromiter(chain.from_iterable(seqs), dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() >= self.tok.vocab_size):
            raise RuntimeError(f"tokenizer {self.tok.spec} produced an id outside its vocabulary")
        self.f.write(arr.astype(self.dtype).tobytes())
        self.tokens += arr.size
        self.documents += len(self.docs)
        done, self.docs, self.chars = self.chars, [], 0
        return done

    def close(self) -> None:
        self.f.close()


def _write_splits(src: Corpus, tok: Tokenizer, directory: Path, dtype: np.dtype, progress: bool) -> dict:
    writers = {s: _SplitWriter(directory / f"{s}.bin", tok, dtype) for s in SPLITS}
    bar = tqdm(
        total=src.total_chars,
        desc=f"tokenizing ({tok.spec})",
        unit="char",
        unit_scale=True,
        disable=None if progress else True,
        file=sys.stderr,
        dynamic_ncols=True,
        leave=False,
    )
    try:
        for split, text in src.docs():
            bar.update(writers[split].add(text))
        for w in writers.values():
            bar.update(w.flush())
    finally:
        bar.close()
        for w in writers.values():
            w.close()
    return {s: {"file": f"{s}.bin", "tokens": w.tokens, "documents": w.documents} for s, w in writers.items()}


def prepare(
    corpus: str,
    tokenizer_spec: str,
    out: Path,
    *,
    val_fraction: float | None = None,
    seed: int = 1337,
    progress: bool = True,
    max_docs: int | None = None,
    **opts: Any,
) -> dict:
    """Tokenize `corpus` into ``out/{train,val}.bin`` + meta.json; returns the meta dict.

    `val_fraction` (default 0.05) applies only to corpora without a validation split; `opts` go to
    `aogpt.corpora.load_corpus` (``text_field``, ``txt_docs``).
    """
    start = time.perf_counter()
    spec = normalize_spec(tokenizer_spec)
    kind, n = parse_spec(spec)
    out = Path(out).expanduser()
    _check_out(out)
    src = load_corpus(corpus, val_fraction=val_fraction, seed=seed, max_docs=max_docs, **opts)
    with atomic_dir(out) as tmp:
        if kind == "bpe":
            assert n is not None
            tok = train_bpe(_capped(src.documents("train"), BPE_TRAIN_CHARS), n)
        else:
            tok = load_tokenizer(spec)
        tok.save(tmp)
        dtype = token_dtype(tok.vocab_size)
        splits = _write_splits(src, tok, tmp, dtype, progress)
        for name, info in splits.items():
            if info["tokens"] == 0:
                fix = "add documents" if name == "train" else "raise --val-fraction or add documents"
                raise AOGPTError(f"corpus {src.name} gave an empty {name} split", fix)
        meta = {
            "format_version": FORMAT_VERSION,
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
        }
        write_json(tmp / META_FILE, meta)
    meta["seconds"] = time.perf_counter() - start  # returned, not written: meta.json stays deterministic
    return meta


class PreparedData:
    """A directory written by `prepare`: memory-mapped splits, its tokenizer, and batch sampling."""

    def __init__(self, directory: Path | str, expect_tokenizer: str | None = None) -> None:
        d = Path(directory).expanduser()
        make = f"create it with `aogpt prepare --out {d}`"
        if not d.is_dir():
            raise AOGPTError(f"prepared data directory {d} does not exist", make)
        if not (d / META_FILE).is_file():
            raise AOGPTError(f"{d} has no {META_FILE}, so it is not a prepared data directory", make)
        meta = read_json(d / META_FILE, "prepared data file")
        if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
            found = meta.get("format_version") if isinstance(meta, dict) else None
            raise AOGPTError(f"{d} has data format {found}, expected {FORMAT_VERSION}", "re-run aogpt prepare")
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
        self._maps: dict[str, np.ndarray] = {}

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

    def num_tokens(self, split: str) -> int:
        return int(self._info(split)["tokens"])

    def split(self, name: str) -> np.ndarray:
        """The split's ids as a read-only np.memmap (nothing is read until indexed)."""
        if name not in self._maps:
            info, dtype = self._info(name), np.dtype(self.meta["dtype"])
            path = self.directory / info["file"]
            size = path.stat().st_size if path.is_file() else -1
            if size != info["tokens"] * dtype.itemsize:
                raise AOGPTError(
                    f"{path} has {max(size, 0)} bytes, but {META_FILE} promises {info['tokens']} {dtype.name} tokens",
                    "re-run aogpt prepare",
                )
            if info["tokens"] == 0:
                self._maps[name] = np.zeros(0, dtype)
            else:
                self._maps[name] = np.memmap(path, dtype=dtype, mode="r", shape=(info["tokens"],))
        return self._maps[name]

    def _check_block(self, split: str, block_size: int) -> int:
        n = self.num_tokens(split)
        if block_size < 1:
            raise AOGPTError(f"block size must be at least 1, got {block_size}", "pass a positive --block-size")
        if n < block_size:
            more = "a larger --val-fraction or " if split == "val" else ""
            raise AOGPTError(
                f"the {split} split of {self.directory} has {n} tokens, fewer than one block of {block_size}",
                f"use a smaller block size, or {more}a larger corpus",
            )
        return n

    def get_batch(
        self,
        split: str,
        batch_size: int,
        block_size: int,
        generator: torch.Generator | np.random.Generator | int | None = None,
    ) -> torch.Tensor:
        """``(batch_size, block_size)`` int64 ids from uniformly random windows of one split."""
        n = self._check_block(split, block_size)
        high = n - block_size + 1
        if isinstance(generator, np.random.Generator):
            starts = generator.integers(0, high, size=batch_size).tolist()
        else:
            if isinstance(generator, int) and not isinstance(generator, bool):
                generator = torch.Generator().manual_seed(generator)
            elif generator is not None and not isinstance(generator, torch.Generator):
                raise TypeError(f"generator must be a torch/numpy Generator, an int or None, not {type(generator)}")
            device = generator.device if generator is not None else "cpu"
            starts = torch.randint(high, (batch_size,), generator=generator, device=device).tolist()
        data = self.split(split)
        x = np.empty((batch_size, block_size), dtype=np.int64)
        for i, s in enumerate(starts):
            x[i] = data[s : s + block_size]
        return torch.from_numpy(x)

    def num_eval_batches(self, split: str, batch_size: int, block_size: int, max_batches: int | None = None) -> int:
        """How many batches `iter_eval_batches` yields (for progress bars)."""
        batches = math.ceil(self._check_block(split, block_size) // block_size / batch_size)
        return batches if max_batches is None else min(batches, max_batches)

    def iter_eval_batches(
        self, split: str, batch_size: int, block_size: int, max_batches: int | None = None
    ) -> Iterator[torch.Tensor]:
        """Sequential non-overlapping windows, `batch_size` at a time (the last batch may be short)."""
        windows = self._check_block(split, block_size) // block_size
        data = self.split(split)
        for b in range(self.num_eval_batches(split, batch_size, block_size, max_batches)):
            w0, w1 = b * batch_size, min(windows, (b + 1) * batch_size)
            chunk = np.asarray(data[w0 * block_size : w1 * block_size], dtype=np.int64)
            yield torch.from_numpy(chunk.reshape(w1 - w0, block_size))


__all__ = ["FORMAT_VERSION", "PreparedData", "default_out_dir", "prepare", "split_pieces", "token_dtype"]
