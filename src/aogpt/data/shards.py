"""Documents -> token shards: multi-process encoding, fixed-size shard files, resumable progress.

`write_splits` reads ``(split, text)`` documents in corpus order, encodes them (each followed by one
EOT id; blank documents write nothing) and appends the ids of each split to shard files
``{split}-00000.bin``, ``{split}-00001.bin``, ... of exactly ``shard_tokens`` ids each (the last one
shorter): the shards of a split, concatenated, are the split's whole token stream, whatever the
shard size. A shard counts the documents whose EOT it holds.

Decisions:

* **Workers.** With ``workers > 1`` documents go in chunks of about `CHUNK_CHARS` characters to a
  pool of *spawned* processes (fork is unsafe with the tokenizer thread pools), each of which
  rebuilds the tokenizer from its spec and the work directory's files and encodes single-threaded.
  Results are consumed in submission order and at most ``2 * workers`` chunks are in flight, so the
  output is identical for any number of workers and memory stays bounded on endless streams.
  ``workers=1`` encodes in this process (with the tokenizer's own threads).
* **Progress.** Whenever a shard fills, every open shard file is flushed and fsynced and
  ``progress.json`` is rewritten atomically: the settings, the finished shards (token and document
  counts, sha256), the committed length of each open shard, the documents consumed per split, and
  how many ids of a document cut by the shard boundary are already written. A resumed run checks
  the settings and the finished shards' checksums, truncates open shards to their committed length,
  deletes shard files written after the last commit, restarts the corpus after the consumed
  documents (`aogpt.data.documents.Corpus.stream`) and drops the already-written ids of the cut document.
  Resuming therefore redoes at most one shard's worth of work and gives byte-identical files.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import re
import signal
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from aogpt.data.tokenizer import Tokenizer, load_tokenizer
from aogpt.errors import AOGPTError
from aogpt.io import read_json, write_json

SPLITS = ("train", "val")
PROGRESS_FILE = "progress.json"
PROGRESS_VERSION = 1
PIECE_CHARS = 1 << 16  # documents longer than this are encoded in pieces (parallelism, memory)
CHUNK_CHARS = 1 << 22  # text per encoding task
AUTO_WORKERS_CHARS = 1 << 25  # corpora of known size below this encode in-process by default

_SAFE_CUT = re.compile(r"(?<=\S)\n")


def split_pieces(text: str, target: int = PIECE_CHARS) -> list[str]:
    """Cut `text` into pieces of about `target` characters, only where the encoding is unaffected.

    A newline right after a non-space character is a point where the GPT-2 pre-tokenizer always
    splits, so the ids of the pieces, concatenated, equal those of the whole text.
    """
    pieces, start = [], 0
    while len(text) - start > target:
        m = _SAFE_CUT.search(text, start + target)
        if m is None:
            break
        pieces.append(text[start : m.start()])
        start = m.start()
    pieces.append(text[start:])
    return pieces


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.bin"


def default_workers(total_chars: int | None) -> int:
    """In-process for small corpora of known size (starting processes costs more), else one per CPU."""
    if total_chars is not None and total_chars < AUTO_WORKERS_CHARS:
        return 1
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# --- encoding -----------------------------------------------------------------------------------------


def encode_documents(tok: Tokenizer, texts: list[str], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Ids of every document + EOT, concatenated, and each document's length (0 for a blank one)."""
    counts, pieces = [], []
    for text in texts:
        parts = split_pieces(text) if text.strip() else []
        counts.append(len(parts))
        pieces += parts
    ids = tok.encode_batch(pieces) if pieces else []
    eot, k, seqs, lengths = [tok.eot_id], 0, [], []
    for c in counts:
        n = 0
        if c:
            seqs += ids[k : k + c]
            seqs.append(eot)
            n = sum(len(x) for x in ids[k : k + c]) + 1
            k += c
        lengths.append(n)
    arr = np.fromiter(chain.from_iterable(seqs), dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= tok.vocab_size):
        raise RuntimeError(f"tokenizer {tok.spec} produced an id outside its vocabulary")
    return arr.astype(dtype), np.asarray(lengths, dtype=np.int64)


_worker: dict[str, Any] = {}


def _init_worker(spec: str, directory: str, dtype: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops the pool
    os.environ["RAYON_NUM_THREADS"] = "1"  # HF tokenizers: one thread per process
    try:
        tok = load_tokenizer(spec, Path(directory))
    except Exception as exc:  # raised from the first task instead: a failing initializer makes Pool respawn forever
        _worker["error"] = exc
        return
    tok.threads = 1
    _worker.update(tok=tok, dtype=np.dtype(dtype))


def _encode_in_worker(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    if "error" in _worker:
        raise _worker["error"]
    return encode_documents(_worker["tok"], texts, _worker["dtype"])


Chunk = list[tuple[str, str]]


def chunks(pairs: Iterable[tuple[str, str]], chars: int | None = None) -> Iterator[Chunk]:
    """Consecutive documents grouped into chunks of about `chars` characters."""
    limit = CHUNK_CHARS if chars is None else chars
    chunk: Chunk = []
    size = 0
    for pair in pairs:
        chunk.append(pair)
        size += len(pair[1])
        if size >= limit:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def encoded(
    source: Iterable[Chunk], tok: Tokenizer, directory: Path, dtype: np.dtype, workers: int
) -> Iterator[tuple[Chunk, np.ndarray, np.ndarray]]:
    """``(chunk, ids, lengths)`` for every chunk, in order; encoded by `workers` processes if > 1."""
    if workers <= 1:
        for chunk in source:
            yield (chunk, *encode_documents(tok, [t for _, t in chunk], dtype))
        return
    ctx = multiprocessing.get_context("spawn")
    pool = ctx.Pool(workers, initializer=_init_worker, initargs=(tok.spec, str(directory), dtype.name))
    pending: deque = deque()
    try:
        for chunk in source:
            pending.append((chunk, pool.apply_async(_encode_in_worker, ([t for _, t in chunk],))))
            if len(pending) >= 2 * workers:
                chunk, result = pending.popleft()
                yield (chunk, *result.get())
        while pending:
            chunk, result = pending.popleft()
            yield (chunk, *result.get())
        pool.close()
    finally:
        pool.terminate()
        pool.join()


# --- shard files ----------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


class ShardWriter:
    """Appends one split's ids to fixed-size shard files; `state` (from progress.json) resumes it."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype, shard_tokens: int, state: dict | None) -> None:
        self.directory, self.split, self.dtype, self.shard_tokens = directory, split, dtype, shard_tokens
        self.closed: list[dict] = list(state["closed"]) if state else []
        opened = state["open"] if state else {"tokens": 0, "documents": 0}
        self.tokens, self.documents = int(opened["tokens"]), int(opened["documents"])
        self.path = directory / shard_name(split, len(self.closed))
        self.f = open(self.path, "r+b" if self.path.exists() else "w+b")  # noqa: SIM115 (closed by finish)
        self.f.truncate(self.tokens * dtype.itemsize)  # drop whatever was written after the last commit
        self.f.seek(0, os.SEEK_END)

    @property
    def room(self) -> int:
        return self.shard_tokens - self.tokens

    def write(self, ids: np.ndarray, documents: int) -> None:
        self.f.write(ids.tobytes())
        self.tokens += len(ids)
        self.documents += documents

    def sync(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())

    def rotate(self) -> None:
        """Close the full shard (checksummed) and open the next one."""
        self.sync()
        self.f.close()
        entry = {"file": self.path.name, "tokens": self.tokens, "documents": self.documents}
        self.closed.append({**entry, "sha256": _sha256(self.path)})
        self.tokens = self.documents = 0
        self.path = self.directory / shard_name(self.split, len(self.closed))
        self.f = open(self.path, "w+b")  # noqa: SIM115

    def state(self) -> dict:
        opened = {"file": self.path.name, "tokens": self.tokens, "documents": self.documents}
        return {"closed": self.closed, "open": opened}

    def finish(self) -> list[dict]:
        """Close; drop a trailing empty shard; the shards as ``{file, tokens, documents}``."""
        self.f.close()
        shards = [{k: s[k] for k in ("file", "tokens", "documents")} for s in self.closed]
        if self.tokens or not shards:
            shards.append({"file": self.path.name, "tokens": self.tokens, "documents": self.documents})
        else:
            self.path.unlink()
        return shards

    def close(self) -> None:
        if not self.f.closed:
            self.f.close()


# --- progress (resume) ------------------------------------------------------------------------------------


def new_progress(settings: dict, dtype: np.dtype) -> dict:
    return {
        "version": PROGRESS_VERSION,
        "settings": settings,
        "dtype": np.dtype(dtype).name,
        "commits": 0,
        "done": {s: 0 for s in SPLITS},
        "partial": None,
        "chars": 0,
        "splits": {},
    }


def has_progress(work: Path) -> bool:
    """Whether `work` holds committed progress worth resuming."""
    try:
        return read_json(work / PROGRESS_FILE).get("commits", 0) > 0
    except (AOGPTError, AttributeError):
        return False


def load_progress(work: Path, settings: dict, mode: str) -> dict | None:
    """The progress to resume in `work`, or None to start afresh; `mode` is auto, require or restart.

    Refuses (user error) progress made with other settings, unless told to restart, and checks the
    finished shards against their recorded sizes and checksums.
    """
    if mode not in ("auto", "require", "restart"):
        raise ValueError(f"unknown resume mode {mode!r}")
    found = mode != "restart" and has_progress(work)
    if not found:
        if mode == "require":
            raise AOGPTError(f"nothing to resume: no interrupted prepare in {work}", "drop --resume")
        return None
    progress = read_json(work / PROGRESS_FILE, "progress file")
    old = progress.get("settings", {})
    if progress.get("version") != PROGRESS_VERSION or old != settings:
        keys = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k)) or ["version"]
        raise AOGPTError(
            f"{work} holds an interrupted prepare with other settings (differs in: {', '.join(keys)})",
            "re-run with the same settings to resume it, or pass --restart to discard it",
        )
    itemsize = np.dtype(progress["dtype"]).itemsize
    for split, state in progress["splits"].items():
        for shard in state["closed"]:
            path = work / shard["file"]
            size = shard["tokens"] * itemsize
            if not path.is_file() or path.stat().st_size != size or _sha256(path) != shard["sha256"]:
                raise AOGPTError(f"finished shard {path} is missing or changed", "pass --restart to start afresh")
        opened = work / state["open"]["file"]
        if not opened.is_file() or opened.stat().st_size < state["open"]["tokens"] * itemsize:
            raise AOGPTError(f"open shard {opened} is shorter than recorded", "pass --restart to start afresh")
        keep = {s["file"] for s in state["closed"]} | {state["open"]["file"]}
        for path in work.glob(f"{split}-*.bin"):  # shards begun after the last commit
            if path.name not in keep:
                path.unlink()
    return progress


# --- the writer loop -------------------------------------------------------------------------------------


def write_splits(
    pairs_from: Any,
    tok: Tokenizer,
    work: Path,
    dtype: np.dtype,
    shard_tokens: int,
    workers: int,
    progress: dict,
    *,
    total_chars: int | None = None,
    show_progress: bool = True,
) -> dict[str, list[dict]]:
    """Encode the documents of ``pairs_from(done)`` into shards in `work`; returns shards per split.

    `progress` is `new_progress(...)` or a loaded one (resume); it is updated and saved at every commit.
    """
    if shard_tokens < 1:
        raise AOGPTError(f"--shard-tokens must be at least 1, got {shard_tokens}", "pass e.g. 100000000")
    writers = {s: ShardWriter(work, s, dtype, shard_tokens, progress["splits"].get(s)) for s in SPLITS}
    done = {s: int(progress["done"].get(s, 0)) for s in SPLITS}
    partial = progress["partial"]  # {"split", "tokens"}: ids of the next document already written

    def commit(position: dict[str, int], cut: dict | None) -> None:
        for w in writers.values():
            w.sync()
        progress.update(
            commits=progress["commits"] + 1,
            done=dict(position),
            partial=cut,
            splits={s: w.state() for s, w in writers.items()},
        )
        write_json(work / PROGRESS_FILE, progress)

    def write_doc(split: str, ids: np.ndarray, skip: int) -> None:
        """One document, cut across shards where they fill; commits at every full shard."""
        w, pos = writers[split], skip
        while pos < len(ids):
            take = min(w.room, len(ids) - pos)
            w.write(ids[pos : pos + take], int(pos + take == len(ids)))
            pos += take
            if w.room == 0:
                w.rotate()
                if pos == len(ids):
                    commit({**done, split: done[split] + 1}, None)
                else:
                    commit(done, {"split": split, "tokens": pos})

    bar = tqdm(
        total=total_chars,
        initial=progress["chars"],
        desc=f"tokenizing ({tok.spec})",
        unit="char",
        unit_scale=True,
        disable=None if show_progress else True,
        file=sys.stderr,
        dynamic_ncols=True,
        leave=False,
    )
    stream = encoded(chunks(pairs_from(dict(done))), tok, work, dtype, workers)
    try:
        with contextlib.closing(stream):
            for chunk, ids, lengths in stream:
                ends = np.cumsum(lengths)
                i = 0
                while i < len(chunk):
                    split = chunk[i][0]
                    if partial is not None:  # the document cut by the last commit
                        if partial["split"] != split or partial["tokens"] >= lengths[i]:
                            raise AOGPTError(
                                "the corpus differs from the interrupted run's (the resumed document does not match)",
                                "pass --restart to start afresh",
                            )
                        write_doc(split, ids[ends[i] - lengths[i] : ends[i]], partial["tokens"])
                        partial, done[split], i = None, done[split] + 1, i + 1
                        continue
                    j = i  # a run of documents of one split is one contiguous slice of ids
                    while j < len(chunk) and chunk[j][0] == split:
                        j += 1
                    start = ends[i] - lengths[i]
                    if ends[j - 1] - start < writers[split].room:  # fits: one write
                        writers[split].write(ids[start : ends[j - 1]], int(np.count_nonzero(lengths[i:j])))
                        done[split] += j - i
                    else:
                        for k in range(i, j):
                            write_doc(split, ids[ends[k] - lengths[k] : ends[k]], 0)
                            done[split] += 1
                    i = j
                chars = sum(len(t) for _, t in chunk)
                progress["chars"] += chars
                bar.update(chars)
        return {s: w.finish() for s, w in writers.items()}
    finally:
        bar.close()
        for w in writers.values():
            w.close()


__all__ = [
    "PROGRESS_FILE",
    "ShardWriter",
    "chunks",
    "default_workers",
    "encode_documents",
    "encoded",
    "has_progress",
    "load_progress",
    "new_progress",
    "shard_name",
    "split_pieces",
    "write_splits",
]
