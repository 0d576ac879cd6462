"""Zero-shot evaluation sets as SEDD/MDLM (and the paper) build them: loaders, detokenizers, packing.

Suites (split; where the text comes from):

=============  ==========  =================================================================
lambada        test        OpenAI's LAMBADA test file (``lambada_test.jsonl``, field ``text``)
wikitext2      validation  WikiText-2 raw v1 (rows = lines of ``wiki.valid.raw``)
ptb            validation  Penn Treebank (``ptb.valid.txt``, one sentence per line)
wikitext103    validation  WikiText-103 raw v1 (rows = lines of ``wiki.valid.raw``)
lm1b           test        One Billion Words held-out shard 0 (one sentence per line)
=============  ==========  =================================================================

Never a train split (the reference code scored WikiText-2 on its train split; we don't). Offline
stand-ins, always available through `aogpt.data.corpora`: ``shakespeare`` (the held-out plays Hamlet,
The Tempest, Julius Caesar) and ``wiki-excerpt`` (its validation articles); no detokenizer.

Protocol (`pack`): detokenize each example, tokenize it with the model's tokenizer, append EOS,
concatenate the whole split and cut it into blocks of ``block_len`` tokens, dropping the remainder.
``wrap=True`` is MDLM's wrapped variant: blocks of EOS + (block_len - 2) tokens + EOS. (SEDD groups
every 1000 examples separately and drops each group's remainder, a `datasets.map` artefact; we
concatenate the whole split, which drops less text.)

Sources (`load_examples`): with ``data_dir`` the local files in `Suite.files` (first found wins;
a generic ``NAME.jsonl`` — objects with ``text`` or bare strings — or ``NAME.txt`` — one example per
line — also works); otherwise the Hugging Face hub through the optional ``datasets`` package
(candidate datasets tried in order), with a one-line error when it is missing or offline.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from aogpt.data.corpora import file_docs, load_corpus, local_files
from aogpt.errors import AOGPTError

Rule = tuple[str, str, str]  # ("str" | "re", pattern, replacement), applied in order


def _apply(rules: Sequence[Rule], text: str) -> str:
    for kind, pattern, repl in rules:
        text = text.replace(pattern, repl) if kind == "str" else re.sub(pattern, repl, text)
    return text


# The SEDD/MDLM detokenizers, rule for rule (including their quirks: they are part of the protocol).
_WIKITEXT: tuple[Rule, ...] = (
    ("str", "s '", "s'"),
    ("re", r"/' [0-9]/", r"/'[0-9]/"),  # matches a literal "/' 5/" only: a quirk kept for fidelity
    ("str", " @-@ ", "-"), ("str", " @,@ ", ","), ("str", " @.@ ", "."),
    *(("str", f" {p} ", f"{p} ") for p in ":;.!?,"),
    *(("re", rf"\{o}\s*([^\{c}]*?)\s*\{c}", rf"{o}\1{c}") for o, c in ("()", "[]", "{}")),
    ("re", r"\"\s*([^\"]*?)\s*\"", r'"\1"'),
    ("re", r"'\s*([^']*?)\s*'", r"'\1'"),
    ("str", "= = = =", "===="), ("str", "= = =", "==="), ("str", "= =", "=="),
    ("str", " \u00b0 ", "\u00b0"),
    ("str", " \n", "\n"), ("str", "\n ", "\n"),
    ("str", " N ", " 1 "),
    ("str", " 's", "'s"),
)
_PTB: tuple[Rule, ...] = (
    ("str", " 's", "'s"), ("str", "s ' ", "s' "), ("str", " n't", "n't"), ("str", " \n ", "\n"),
    ("str", "\\/", "/"),
    *(("str", " N ", " 1 "),) * 10,  # ten passes: "N N N" needs more than one
    ("str", "$ 1", "$1"), ("str", "# 1", "#1"), ("str", "<unk>", "?"),
)
_LM1B: tuple[Rule, ...] = (
    ("str", "http : / / ", "http://"), ("str", "https : / / ", "https://"),
    ("re", r" '(\w+)", r"'\1"),
    ("re", r" (\w+) \. ", r" \1. "), ("re", r" (\w+) \.$", r" \1."),
    ("str", " ? ", "? "), ("re", r" \?$", "?"),
    ("str", " ! ", "! "), ("re", r" \!$", "!"),
    ("str", " , ", ", "), ("str", " : ", ": "), ("str", " ; ", "; "), ("str", " / ", "/"),
    ("re", r"\" ([^\"]+) \"", r'"\1"'), ("re", r"' ([^']+) '", r"'\1'"),
    ("re", r"\( ([^\(\)]+) \)", r"(\1)"), ("re", r"\[ ([^\[\]]+) \]", r"[\1]"),
    ("str", "$ ", "$"), ("str", "\u00a3 ", "\u00a3"),
)


def detok_wikitext(text: str) -> str:
    """WikiText: ``@-@`` joiners, spaces before punctuation, ``= =`` headings, brackets, quotes."""
    return _apply(_WIKITEXT, text)


def detok_ptb(text: str) -> str:
    """PTB: ``n't``/``'s`` contractions, ``\\/``, ``N`` numbers become 1, ``<unk>`` becomes ?."""
    return _apply(_PTB, text)


def detok_lm1b(text: str) -> str:
    """One Billion Words: URLs, possessives, punctuation spacing, quotes and brackets."""
    return _apply(_LM1B, text)


def detok_lambada(text: str) -> str:
    """LAMBADA (OpenAI file): curly double quotes become straight; "\\n" + the stripped text."""
    return "\n" + text.replace("\u201c", '"').replace("\u201d", '"').strip()


# ------------------------------------------------------------------------------------------- suites
def _wikitext_rows(text: str) -> list[str]:
    """Rows as the hub's wikitext has them: each line with its newline, blank lines as ""."""
    return [line if line.strip() else "" for line in text.splitlines(keepends=True)]


def _stripped_rows(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def jsonl_rows(text: str, where: str) -> list[str]:
    """Examples of a JSONL text: one object with ``text`` or one bare string per line (`where` names it in errors)."""
    rows = []
    for k, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise AOGPTError(f"{where}:{k} is not valid JSON ({exc.msg})", "one JSON object per line") from None
        value = obj.get("text") if isinstance(obj, dict) else obj
        if not isinstance(value, str):
            raise AOGPTError(f"{where}:{k} holds no text", 'write {"text": "..."} or a JSON string per line')
        rows.append(value)
    return rows


@dataclass(frozen=True)
class Suite:
    name: str
    title: str  # column header of the results table (the paper's)
    split: str
    detokenizer: Callable[[str], str] | None
    files: tuple[str, ...]  # under --data-dir, first found wins (besides NAME.jsonl / NAME.txt)
    rows: Callable[[str], list[str]]  # how a local text file becomes examples
    hub: tuple[tuple[str, str | None, str, str], ...] = ()  # (dataset, config, split, field), in order


SUITES: dict[str, Suite] = {s.name: s for s in (
    Suite("lambada", "LAMBADA", "test", detok_lambada, ("lambada_test.jsonl",), _stripped_rows,
          (("EleutherAI/lambada_openai", "default", "test", "text"),)),
    Suite("wikitext2", "WikiText2", "validation", detok_wikitext,
          ("wikitext-2-raw/wiki.valid.raw", "wikitext-2-raw-v1/wiki.valid.raw"), _wikitext_rows,
          (("Salesforce/wikitext", "wikitext-2-raw-v1", "validation", "text"),
           ("wikitext", "wikitext-2-raw-v1", "validation", "text"))),
    Suite("ptb", "PTB", "validation", detok_ptb, ("ptb.valid.txt", "simple-examples/data/ptb.valid.txt"),
          _stripped_rows,
          (("ptb-text-only/ptb_text_only", None, "validation", "sentence"),
           ("ptb_text_only", None, "validation", "sentence"))),
    Suite("wikitext103", "WikiText103", "validation", detok_wikitext,
          ("wikitext-103-raw/wiki.valid.raw", "wikitext-103-raw-v1/wiki.valid.raw"), _wikitext_rows,
          (("Salesforce/wikitext", "wikitext-103-raw-v1", "validation", "text"),
           ("wikitext", "wikitext-103-raw-v1", "validation", "text"))),
    Suite("lm1b", "1BW", "test", detok_lm1b,
          ("news.en.heldout-00000-of-00050",
           "heldout-monolingual.tokenized.shuffled/news.en.heldout-00000-of-00050"), _stripped_rows,
          (("lm1b", None, "test", "text"), ("dvruette/lm1b", None, "test", "text"))),
)}
PAPER_SUITES = ("lambada", "wikitext2", "ptb", "wikitext103", "lm1b")
STAND_INS = {"shakespeare": "Shakespeare (held out)", "wiki-excerpt": "wiki-excerpt (val)"}


def names(spec: str) -> list[str]:
    """``a,b`` -> [a, b]; ``paper`` = the five benchmark suites; ``offline`` = the two stand-ins."""
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if part == "paper":
            out += PAPER_SUITES
        elif part == "offline":
            out += STAND_INS
        elif part:
            out.append(part)
    if not out:
        raise AOGPTError(f"no evaluation set named in {spec!r}", f"use e.g. {','.join(PAPER_SUITES)}")
    unknown = [n for n in out if n not in SUITES and n not in STAND_INS]
    if unknown:
        raise AOGPTError(f"unknown evaluation set {unknown[0]!r}",
                         f"use one of: {', '.join((*SUITES, *STAND_INS))}, paper, offline")
    return list(dict.fromkeys(out))


def title(name: str) -> str:
    if name in SUITES:
        return SUITES[name].title
    return STAND_INS.get(name, name)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise AOGPTError(f"{path} is not UTF-8 ({exc.reason} at byte {exc.start})", "convert it to UTF-8") from None
    except OSError as exc:
        raise AOGPTError(f"cannot read {path}: {exc.strerror}", "check the file") from None


def load_local(suite: Suite, data_dir: Path) -> list[str]:
    data_dir = Path(data_dir).expanduser()
    for rel in suite.files:
        path = data_dir / rel
        if path.is_file():
            text = _read(path)
            return jsonl_rows(text, str(path)) if path.suffix == ".jsonl" else suite.rows(text)
    if (data_dir / f"{suite.name}.jsonl").is_file():
        path = data_dir / f"{suite.name}.jsonl"
        return jsonl_rows(_read(path), str(path))
    if (data_dir / f"{suite.name}.txt").is_file():
        return suite.rows(_read(data_dir / f"{suite.name}.txt"))
    wanted = ", ".join((*suite.files, f"{suite.name}.jsonl", f"{suite.name}.txt"))
    raise AOGPTError(f"no {suite.name} file in {data_dir}", f"expected one of: {wanted} (docs/evaluation.md)")


def load_hub(suite: Suite) -> list[str]:
    try:
        import datasets  # optional dependency
    except ImportError:
        raise AOGPTError(f"loading {suite.name} from the Hugging Face hub needs the package datasets",
                         "pip install datasets, or pass --data-dir with local files") from None
    errors = []
    for path, config, split, field in suite.hub:
        try:
            rows = datasets.load_dataset(path, config, split=split)
            return [str(r[field]) for r in rows]
        except Exception as exc:  # network, missing dataset, script datasets: all become one line
            errors.append(f"{path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    raise AOGPTError(f"cannot load {suite.name} from the Hugging Face hub ({'; '.join(errors)})",
                     "pass --data-dir with local files (docs/evaluation.md)")


def file_examples(path: Path) -> list[str]:
    """Every document of a local ``.txt``/``.jsonl`` file or folder, unsplit (read by `aogpt.data.corpora`'s
    rules: a text file is one document, a JSONL line one document)."""
    docs: list[str] = []
    for p in local_files(Path(path)):  # the corpus reader, without the train/val split
        docs += file_docs(p, "text", "file", {}, p.name)
    if not docs:
        raise AOGPTError(f"{path} contains no text", "give a non-empty file or folder")
    return docs


def load_examples(name: str, data_dir: Path | None = None) -> tuple[list[str], dict[str, Any]]:
    """Detokenized examples of a suite or stand-in, and where they came from."""
    if name in STAND_INS:
        corpus = load_corpus(name)
        return list(corpus.documents("val")), {"source": corpus.name, "split": "val", "detokenizer": None}
    if name not in SUITES:
        known = ", ".join((*SUITES, *STAND_INS))
        raise AOGPTError(f"unknown evaluation set {name!r}", f"use one of: {known}, or a prepared data dir")
    suite = SUITES[name]
    raw = load_local(suite, data_dir) if data_dir is not None else load_hub(suite)
    detok = suite.detokenizer or (lambda s: s)
    src = str(data_dir) if data_dir is not None else "huggingface hub"
    return [detok(t) for t in raw], {"source": src, "split": suite.split, "detokenizer": name}


def pack(examples: Sequence[Sequence[int]], block_len: int, eos: int, wrap: bool = False) -> torch.Tensor:
    """Concatenate examples, each followed by EOS, and cut (N, block_len) blocks (remainder dropped).

    wrap: MDLM's variant, EOS + (block_len - 2) tokens + EOS per block.
    """
    body = block_len - 2 if wrap else block_len
    if body < 1:
        raise AOGPTError(f"block length {block_len} is too short{' to wrap' if wrap else ''}",
                         "use a longer --block-len")
    stream = torch.tensor([t for ex in examples for t in (*ex, eos)], dtype=torch.long)
    count = stream.numel() // body
    blocks = stream[: count * body].view(count, body)
    if wrap:
        edge = torch.full((count, 1), eos, dtype=torch.long)
        blocks = torch.cat([edge, blocks, edge], dim=1)
    return blocks


def load_blocks(name: str, tokenizer: Any, block_len: int, *, wrap: bool = False,
                data_dir: Path | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """Blocks of an evaluation set tokenized with `tokenizer` (the model's), and a description."""
    texts, info = load_examples(name, data_dir)
    blocks = pack(tokenizer.encode_batch(texts), block_len, tokenizer.eot_id, wrap)
    if blocks.shape[0] == 0:
        raise AOGPTError(f"{name} gives less than one block of {block_len} tokens", "use a smaller --block-len")
    return blocks, {**info, "examples": len(texts), "blocks": blocks.shape[0], "block_len": block_len,
                    "wrap": wrap, "tokenizer": getattr(tokenizer, "spec", None)}
