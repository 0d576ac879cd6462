"""Hugging Face datasets as streamed corpora (``hf:NAME[:CONFIG]`` and a few aliases).

* Streamed with ``datasets.load_dataset(..., streaming=True)``: nothing is downloaded up front and
  nothing is cached by us; ``datasets`` is imported only here, lazily. Without the package, or
  offline, or for an unknown dataset, the user gets one line (`AOGPTError`), never a traceback.
* One row = one document (its ``text_field``), except wikitext, whose one-row-per-line text is
  regrouped into articles (a `` = Title = `` row starts one). Blank rows stay in the stream as empty
  documents, so that document index = row index and a resumed run can skip rows at the source
  (``IterableDataset.skip``); `aogpt.data.shards` writes nothing for them. ``max_docs`` counts rows.
* Validation: the dataset's own ``validation``/``valid``/``val`` split when it has one. Otherwise
  ``val_docs=N`` holds out the **last N documents** of the train split, or ``val_fraction`` puts each
  document in validation by a keyed hash of ``(seed, index)``. OpenWebText has only a train split;
  its default is the last 100,000 documents, the rule of MDLM's code (``train[-100000:]``), see
  docs/data.md. A stream's length is unknown in advance, so the last N documents are found with a
  delay line: each document is released to training only once N more have been read, which holds N
  documents' text in memory (about 0.5 GB for OpenWebText's 100,000).
* Re-positioning (`Corpus.stream`): a row-per-document dataset calls ``.skip(n)`` on the stream;
  wikitext re-reads and discards. Skipping is cheaper than tokenizing but not free: in streaming
  mode the skipped rows are, as far as we know, still fetched and decoded by ``datasets``.
"""

from __future__ import annotations

import importlib.util
import re
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from aogpt.data.documents import DEFAULT_VAL_FRACTION, Corpus, check_val_fraction, unit_hash
from aogpt.errors import AOGPTError

HF_ALIASES = {
    "openwebtext": ("Skylion007/openwebtext", None),
    "wikitext-103-raw-v1": ("wikitext", "wikitext-103-raw-v1"),
    "wikitext-2-raw-v1": ("wikitext", "wikitext-2-raw-v1"),
}
OPENWEBTEXT_NAMES = ("Skylion007/openwebtext", "openwebtext")
OPENWEBTEXT_VAL_DOCS = 100_000  # MDLM: openwebtext split="train[-100000:]" is validation

_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = \n?$")


def parse_hf_name(corpus: str) -> tuple[str, str | None] | None:
    """``(name, config)`` for an alias or ``hf:NAME[:CONFIG]``; None for anything else."""
    if corpus in HF_ALIASES:
        return HF_ALIASES[corpus]
    if not corpus.startswith("hf:"):
        return None
    name, _, config = corpus[3:].partition(":")
    if not name:
        raise AOGPTError(f"corpus {corpus!r} names no dataset", "use hf:NAME or hf:NAME:CONFIG")
    return name, config or None


def hold_back_last(texts: Iterable[str], n: int) -> Iterator[tuple[str, str]]:
    """``("train", t)`` for all but the last `n` texts, then ``("val", t)`` for those, in order."""
    held: deque[str] = deque()
    for text in texts:
        held.append(text)
        if len(held) > n:
            yield "train", held.popleft()
    for text in held:
        yield "val", text


def _wikitext_articles(rows: Iterable[str]) -> Iterator[str]:
    """Regroup wikitext's one-row-per-line text into articles (a `` = Title = `` row starts one)."""
    article: list[str] = []
    for row in rows:
        if _WIKITEXT_TITLE.match(row) and any(r.strip() for r in article):
            yield "".join(article)
            article = []
        article.append(row)
    if any(r.strip() for r in article):
        yield "".join(article)


def _hf_fail(label: str, exc: BaseException) -> AOGPTError:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return AOGPTError(
        f"cannot load Hugging Face dataset {label}: {first[:200]}",
        "check the network (and that HF_HUB_OFFLINE is unset) or use a local corpus",
    )


def _import_datasets(label: str) -> Any:
    if importlib.util.find_spec("datasets") is None:
        raise AOGPTError(
            f"corpus {label} needs the Hugging Face `datasets` package, which is not installed",
            "pip install datasets (and allow network access), or use a local corpus",
        )
    import datasets  # only here: importing it is slow and it may be absent

    return datasets


def hf_corpus(
    name: str,
    config: str | None,
    val_fraction: float | None,
    val_docs: int | None,
    seed: int,
    max_docs: int | None,
    text_field: str,
) -> Corpus:
    """A streamed Hugging Face dataset as a `Corpus` (rules in the module docstring)."""
    label = f"hf:{name}" + (f":{config}" if config else "")
    datasets = _import_datasets(label)
    try:
        splits = datasets.get_dataset_split_names(name, config)
    except Exception as exc:  # offline, unknown name, hub errors: all one line for the user
        raise _hf_fail(label, exc) from None
    val_split = next((s for s in ("validation", "valid", "val") if s in splits), None)
    if "train" not in splits:
        raise AOGPTError(
            f"Hugging Face dataset {label} has no train split (only {', '.join(splits)})", "choose another dataset"
        )
    if val_split and (val_fraction is not None or val_docs is not None):
        flag = "--val-fraction" if val_fraction is not None else "--val-docs"
        raise AOGPTError(f"{flag} does not apply to {label} (it has a {val_split} split)", f"drop {flag}")
    if val_docs is None and val_fraction is None and name in OPENWEBTEXT_NAMES:
        val_docs = OPENWEBTEXT_VAL_DOCS
    f = DEFAULT_VAL_FRACTION if val_fraction is None else check_val_fraction(val_fraction)
    regroup = name == "wikitext"

    def rows(split: str, start: int) -> Iterator[str]:
        try:
            ds = datasets.load_dataset(name, config, split=split, streaming=True)
            if start:
                ds = ds.skip(start) if hasattr(ds, "skip") else islice(ds, start, None)
            for n, row in enumerate(ds, start):
                value = row.get(text_field)
                if not isinstance(value, str):
                    raise AOGPTError(
                        f"{label} row {n} has no string field {text_field!r}", "name the text field with --text-field"
                    )
                yield value
        except AOGPTError:
            raise
        except Exception as exc:
            raise _hf_fail(label, exc) from None

    def part(split: str, start: int) -> Iterator[str]:
        """Documents of one source split from document `start` on, at most `max_docs` in all."""
        if regroup:  # articles span rows: no row offset to skip to
            return islice(_wikitext_articles(rows(split, 0)), start, max_docs)
        return islice(rows(split, start), None if max_docs is None else max(0, max_docs - start))

    def docs_from(done: dict[str, int]) -> Iterator[tuple[str, str]]:
        if val_split:
            train_done, val_done = done.get("train", 0), done.get("val", 0)
            if not val_done:  # validation comes after all training documents
                yield from (("train", t) for t in part("train", train_done))
            yield from (("val", t) for t in part(val_split, val_done))
            return
        k = sum(done.values())
        if val_docs is not None:  # the stream order is the output order: skip k, hold back the rest's last N
            yield from hold_back_last(part("train", k), val_docs)
            return
        for i, text in enumerate(part("train", k), k):
            yield ("val" if unit_hash(seed, i) < f else "train"), text

    if val_split:
        rule = f"the dataset's {val_split} split"
    elif val_docs is not None:
        rule = f"last {val_docs} documents of the train split"
    else:
        rule = f"documents by hash, val_fraction={f}"
    return Corpus(
        label,
        lambda: docs_from({}),
        {label: "streamed from the Hugging Face hub, not checksummed"},
        rule,
        resume=docs_from,
    )


__all__ = ["HF_ALIASES", "OPENWEBTEXT_VAL_DOCS", "hf_corpus", "hold_back_last", "parse_hf_name"]
