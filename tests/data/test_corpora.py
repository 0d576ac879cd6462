"""Corpora: cleaning rules, bundled corpora with stable sizes, local files, HF adapter, bad input."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import types

import pytest

from aogpt.data import corpora
from aogpt.data.corpora import clean_play, clean_wikitext, load_corpus, split_documents
from aogpt.data.hf_corpora import OPENWEBTEXT_VAL_DOCS, hold_back_last
from aogpt.errors import AOGPTError

PLAY = """# A Test Play

## ACT I

### SCENE I. A room.

_Enter HAMLET and HORATIO, with
attendants_

**HAMLET**~
To be, or not to be\\--that is the question:~
Whether 'tis nobler in the mind to suffer

**HORATIO**~
_\\[Aside]_~
My lord, I think I saw him yesternight.

*Exit Horatio.*

I'll speak to it though hell itself should gape.

**OSRIC**~
__\\[Awaking]_~
A hit, a very palpable hit.

**PAGE**~
[Within]_~
Who's there?

**KING**~
*[Reads.]*~
'Dear sir,'

_Burthen _\\[dispersedly, within_

# EPILOGUE
""".replace("~\n", "  \n")  # markdown hard line breaks

PLAY_CLEAN = """A Test Play

ACT I

SCENE I. A room.

HAMLET:
To be, or not to be--that is the question:
Whether 'tis nobler in the mind to suffer

HORATIO:
My lord, I think I saw him yesternight.

I'll speak to it though hell itself should gape.

OSRIC:
A hit, a very palpable hit.

PAGE:
Who's there?

KING:
'Dear sir,'

EPILOGUE
"""

WIKI = """{{Infobox person|name=X|image={{nested|a}}}}
'''Alan''' is a [[computer scientist|scientist]]<!-- a comment with <ref>unclosed --> born in \
[[London]].<ref name="a">{{cite web|url=http://x}}</ref> He wrote ''[[On Computable Numbers]]''.<ref name="b" />
[[File:Alan.jpg|thumb|Alan at [[Princeton University|Princeton]]]]

== Early life ==
He liked [http://example.com chess] &amp; running&nbsp;races (<math>x^2</math>).
* first item
* second [[Category:Foo]]
{| class="wikitable"
|-
| cell {{flag|UK}}
|}
Last line.

== References ==
{{reflist}}
* Some book
[[Category:People]]
[[de:Alan]]
"""

WIKI_CLEAN = """Alan

Alan is a scientist born in London. He wrote On Computable Numbers.

Early life
He liked chess & running races.
first item
second

Last line.
"""


def test_clean_play_rules() -> None:
    assert clean_play(PLAY) == PLAY_CLEAN


def test_clean_wikitext_rules() -> None:
    # the comment holds "<ref>": removing refs first would swallow "born in London"
    assert clean_wikitext("Alan", WIKI) == WIKI_CLEAN


def test_shakespeare_corpus_is_stable() -> None:
    c = load_corpus("shakespeare")
    pairs = list(c.docs())
    assert len(pairs) == 38 and len(c.sources) == 38
    val = [text.split("\n", 1)[0] for split, text in pairs if split == "val"]
    assert val == ["Julius Caesar", "The Tempest", "Hamlet"]  # sorted by path: roman/, romances/, tragedies/
    assert c.total_chars == 4_818_183  # a change in the cleaning rules shows here
    for _, text in pairs:
        assert "**" not in text and "\\" not in text and "_[" not in text and "#" not in text
        assert text.endswith("\n") and not text.endswith("\n\n")
    assert pairs[0][1].startswith("A Midsummer Night's Dream\n\nACT I\n\nSCENE I. Athens. The palace of THESEUS.")
    assert "\nHAMLET:\nTo be, or not to be: that is the question:\n" in pairs[-6][1]


def test_shakespeare_max_docs_per_split() -> None:
    c = load_corpus("shakespeare", max_docs=1)
    assert [s for s, _ in c.docs()] == ["train", "val"]


def test_shakespeare_rejects_val_fraction() -> None:
    with pytest.raises(AOGPTError, match="validation plays are fixed"):
        load_corpus("shakespeare", val_fraction=0.1)


def test_wiki_excerpt() -> None:
    if importlib.util.find_spec("gensim") is None:
        pytest.skip("wiki-excerpt needs gensim's test data: pip install --no-deps gensim")
    c = load_corpus("wiki-excerpt")
    pairs = list(c.docs())
    assert len(pairs) == 106 and [s for s, _ in pairs].count("val") == 5
    assert c.total_chars == 2_818_521
    assert pairs[0][1].startswith("Anarchism\n\nAnarchism is a political philosophy that advocates self-governed")
    joined = "".join(t for _, t in pairs)
    assert joined.count("{{") <= 2 and joined.count("<ref") == 0


def test_split_documents() -> None:
    docs = [f"doc {i}\n" for i in range(40)]
    a = split_documents(docs, 0.1, seed=1)
    assert a == split_documents(docs, 0.1, seed=1)
    assert [d for _, d in a] == docs  # corpus order kept
    assert [s for s, _ in a].count("val") == 4
    b = split_documents(docs, 0.1, seed=2)
    assert [s for s, _ in a] != [s for s, _ in b]
    # at least one document each way
    assert [s for s, _ in split_documents(docs[:3], 0.01, 0)].count("val") == 1
    assert [s for s, _ in split_documents(docs[:2], 0.9, 0)].count("train") == 1


def test_split_single_document_at_a_line_end() -> None:
    text = "".join(f"line {i}\n" for i in range(100))
    (s1, train), (s2, val) = split_documents([text], 0.1, 0)
    assert (s1, s2) == ("train", "val") and train + val == text
    assert train.endswith("\n") and val.startswith("line 9")
    with pytest.raises(AOGPTError, match="too small to split"):
        split_documents(["x"], 0.5, 0)


@pytest.mark.parametrize("f", [0, 1, -0.1, 1.5])
def test_bad_val_fraction(f: float) -> None:
    with pytest.raises(AOGPTError, match="between 0 and 1"):
        split_documents(["a", "b"], f, 0)


def test_local_txt_file(tmp_path) -> None:
    p = tmp_path / "a.txt"
    p.write_bytes(b"\xef\xbb\xbfline one\r\nline two\r\n\r\nline three\rend\n")
    c = load_corpus(str(p))
    (_, train), (_, val) = c.docs()  # a single document is cut at a line end
    assert train + val == "line one\nline two\n\nline three\nend\n" and val == "end\n"
    c = load_corpus(str(p), txt_docs="blank-lines")
    assert sorted(t for _, t in c.docs()) == ["line one\nline two", "line three\nend"]
    assert c.sources == {"a.txt": corpora._sha256(p.read_bytes())}


def test_local_directory_sorted_recursive(tmp_path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "b" / "2.txt").write_text("two")
    (tmp_path / "b" / "1.jsonl").write_text('{"text": "one-a"}\n\n{"text": "one-b", "id": 3}\n')
    (tmp_path / "a.txt").write_text("zero")
    (tmp_path / "ignored.md").write_text("not read")
    (tmp_path / ".hidden" / "x.txt").write_text("not read")
    (tmp_path / "empty.txt").write_text("  \n")
    c = load_corpus(str(tmp_path), val_fraction=0.25, seed=0)
    assert [t for _, t in c.docs()] == ["zero", "one-a", "one-b", "two"]
    assert sorted(c.sources) == ["a.txt", "b/1.jsonl", "b/2.txt", "empty.txt"]
    assert [s for s, _ in c.docs()].count("val") == 1
    assert [t for _, t in load_corpus(str(tmp_path), max_docs=2).docs()] == ["zero", "one-a"]


def test_jsonl_text_field(tmp_path) -> None:
    p = tmp_path / "d.jsonl"
    p.write_text('{"body": "x"}\n{"body": "y"}\n')
    assert sorted(t for _, t in load_corpus(str(p), text_field="body").docs()) == ["x", "y"]
    with pytest.raises(AOGPTError, match=r"d.jsonl:1: no string field 'text' \(name the text field with --text-field"):
        load_corpus(str(p))
    p.write_text('{"text": "x"}\n{"text": \n')
    with pytest.raises(AOGPTError, match=r"d.jsonl:2: invalid JSON"):
        load_corpus(str(p))


def test_invalid_utf8_is_refused(tmp_path) -> None:
    p = tmp_path / "latin1.txt"
    p.write_bytes("fine\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(AOGPTError, match=r"not valid UTF-8 \(line 2, byte 8.*iconv"):
        load_corpus(str(p))


def test_missing_empty_unknown(tmp_path) -> None:
    with pytest.raises(AOGPTError, match="does not exist"):
        load_corpus(str(tmp_path / "nope.txt"))
    with pytest.raises(AOGPTError, match="unknown corpus 'shakespear'"):
        load_corpus("shakespear")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(AOGPTError, match="contains no text"):
        load_corpus(str(tmp_path / "empty.txt"))
    (tmp_path / "d").mkdir()
    with pytest.raises(AOGPTError, match="no .txt or .jsonl files"):
        load_corpus(str(tmp_path / "d"))
    with pytest.raises(AOGPTError, match="at least 1"):
        load_corpus("shakespeare", max_docs=0)
    with pytest.raises(AOGPTError, match="unknown --txt-docs"):
        load_corpus(str(tmp_path / "empty.txt"), txt_docs="lines")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read any file")
def test_unreadable_file(tmp_path) -> None:
    p = tmp_path / "secret.txt"
    p.write_text("x")
    p.chmod(0)
    with pytest.raises(AOGPTError, match="cannot read"):
        load_corpus(str(p))


def test_unreadable_file_reported(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "secret.txt"
    p.write_text("x")

    def denied(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(type(p), "read_bytes", denied)
    with pytest.raises(AOGPTError, match=r"cannot read .*secret.txt: Permission denied"):
        load_corpus(str(p))


# --- Hugging Face, through a stand-in `datasets` module (the real one needs the network) -----------


class FakeStream:
    """Stands in for `datasets.IterableDataset`: iterable, with `.skip(n)`; logs skips and rows read."""

    def __init__(self, rows: list[dict], log: dict, offset: int = 0) -> None:
        self.rows, self.log, self.offset = rows, log, offset

    def __iter__(self):
        for row in self.rows[self.offset :]:
            self.log["read"] += 1
            yield row

    def skip(self, n: int) -> FakeStream:
        self.log["skips"].append(n)
        return FakeStream(self.rows, self.log, self.offset + n)


def fake_datasets(monkeypatch: pytest.MonkeyPatch, splits: dict[str, list[dict]] | Exception) -> dict:
    """Install a stand-in `datasets` module serving `splits` (or raising); returns its log."""
    mod = types.ModuleType("datasets")
    mod.__spec__ = importlib.machinery.ModuleSpec("datasets", None)
    log: dict = {"skips": [], "read": 0, "opened": []}

    def get_dataset_split_names(name, config=None):
        if isinstance(splits, Exception):
            raise splits
        return list(splits)

    def load_dataset(name, config=None, split=None, streaming=False):
        assert streaming
        log["opened"].append(split)
        return FakeStream(splits[split], log)

    mod.get_dataset_split_names = get_dataset_split_names
    mod.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", mod)
    return log


def test_hf_missing_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes find_spec/import fail like an absent package
    monkeypatch.setattr(corpora.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(AOGPTError, match="needs the Hugging Face `datasets` package"):
        load_corpus("openwebtext")


def test_hf_offline_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_datasets(monkeypatch, ConnectionError("Couldn't reach 'wikitext' on the Hub (LocalEntryNotFoundError)\nmore"))
    with pytest.raises(AOGPTError) as info:
        load_corpus("wikitext-2-raw-v1")
    assert "\n" not in str(info.value) and "cannot load Hugging Face dataset hf:wikitext:wikitext-2-raw-v1" in str(
        info.value
    )


def test_hf_wikitext_regrouped_into_articles(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = ["", " = A = \n", "", " a text . \n", " = = Sub = = \n", " more . \n", " = B = \n", " b text . \n"]
    fake_datasets(monkeypatch, {"train": [{"text": r} for r in rows], "validation": [{"text": " = V = \n"}]})
    c = load_corpus("wikitext-103-raw-v1")
    assert list(c.docs()) == [
        ("train", " = A = \n a text . \n = = Sub = = \n more . \n"),
        ("train", " = B = \n b text . \n"),
        ("val", " = V = \n"),
    ]
    with pytest.raises(AOGPTError, match="has a validation split"):
        load_corpus("wikitext-103-raw-v1", val_fraction=0.1)


def test_hf_hash_split_and_text_field(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_datasets(monkeypatch, {"train": [{"body": f"doc {i}"} for i in range(200)]})
    c = load_corpus("hf:someone/set:cfg", text_field="body", val_fraction=0.1, seed=3)
    pairs = list(c.docs())
    assert pairs == list(c.docs()) and len(pairs) == 200
    assert 8 <= [s for s, _ in pairs].count("val") <= 35
    assert len(list(load_corpus("hf:someone/set", text_field="body", max_docs=7).docs())) == 7
    with pytest.raises(AOGPTError, match="row 0 has no string field 'text'"):
        list(load_corpus("hf:someone/set").docs())
    with pytest.raises(AOGPTError, match="names no dataset"):
        load_corpus("hf:")


# --- validation by last N documents (the OpenWebText rule) and re-positioning -------------------------


def test_hold_back_last_matches_slicing() -> None:
    for total in range(0, 9):
        texts = [f"t{i}" for i in range(total)]
        for n in range(1, 6):
            expected = [("train", t) for t in texts[: max(0, total - n)]] + [("val", t) for t in texts[-n:]]
            assert list(hold_back_last(iter(texts), n)) == expected, (total, n)


def test_openwebtext_holds_out_its_last_100000_documents(monkeypatch: pytest.MonkeyPatch) -> None:
    assert OPENWEBTEXT_VAL_DOCS == 100_000
    rows = [{"text": f"d{i}"} for i in range(100_003)]
    fake_datasets(monkeypatch, {"train": rows})
    c = load_corpus("openwebtext")
    assert c.name == "hf:Skylion007/openwebtext" and c.split_rule == "last 100000 documents of the train split"
    splits = [s for s, _ in c.docs()]
    assert splits == ["train"] * 3 + ["val"] * 100_000
    small = load_corpus("openwebtext", val_docs=10, max_docs=50)
    assert [t for s, t in small.docs() if s == "val"] == [f"d{i}" for i in range(40, 50)]
    hashed = load_corpus("openwebtext", val_fraction=0.5, max_docs=200)
    assert hashed.split_rule == "documents by hash, val_fraction=0.5"
    assert 60 < [s for s, _ in hashed.docs()].count("val") < 140


def test_hf_stream_skips_rows_at_the_source(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"text": f"d{i}" if i % 7 else ""} for i in range(60)]  # blank rows stay: index = row
    log = fake_datasets(monkeypatch, {"train": rows})
    for kw in ({"val_docs": 9}, {"val_fraction": 0.3}, {"val_docs": 9, "max_docs": 40}):
        c = load_corpus("hf:x/y", **kw)
        everything = list(c.docs())
        for done in ({"train": 5, "val": 0}, {"train": 20, "val": 6}, {"train": 30, "val": 5}):
            log["skips"].clear()
            k = sum(done.values())
            assert list(c.stream(done)) == everything[k:], (kw, done)
            assert log["skips"] == [k]
    assert [t for _, t in everything][:8] == ["", "d1", "d2", "d3", "d4", "d5", "d6", ""]


def test_hf_stream_with_a_validation_split(monkeypatch: pytest.MonkeyPatch) -> None:
    train, val = [{"text": f"t{i}"} for i in range(10)], [{"text": f"v{i}"} for i in range(4)]
    log = fake_datasets(monkeypatch, {"train": train, "validation": val})
    c = load_corpus("hf:x/y")
    everything = list(c.docs())
    log["opened"].clear()
    assert list(c.stream({"train": 10, "val": 2})) == everything[12:]
    assert log["opened"] == ["validation"] and log["skips"] == [2]  # the train split is not read again
    assert list(c.stream({"train": 3, "val": 0})) == everything[3:]
    with pytest.raises(AOGPTError, match="--val-docs does not apply to hf:x/y"):
        load_corpus("hf:x/y", val_docs=3)


def test_wikitext_resumes_by_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [" = A = \n", " a \n", " = B = \n", " b \n", " = C = \n", " c \n"]
    log = fake_datasets(monkeypatch, {"train": [{"text": r} for r in rows], "validation": [{"text": " = V = \n"}]})
    c = load_corpus("wikitext-2-raw-v1")
    assert list(c.stream({"train": 2, "val": 0})) == list(c.docs())[2:]
    assert log["skips"] == []


def test_local_val_docs(tmp_path) -> None:
    for i in range(6):
        (tmp_path / f"{i}.txt").write_text(f"doc {i}")
    c = load_corpus(str(tmp_path), val_docs=2)
    assert list(c.docs()) == [("train", f"doc {i}") for i in range(4)] + [("val", "doc 4"), ("val", "doc 5")]
    assert c.split_rule == "last 2 documents"
    assert list(c.stream({"train": 3, "val": 0})) == list(c.docs())[3:]
    with pytest.raises(AOGPTError, match="--val-docs 6 leaves no training documents"):
        load_corpus(str(tmp_path), val_docs=6)
    with pytest.raises(AOGPTError, match="exclude each other"):
        load_corpus(str(tmp_path), val_docs=2, val_fraction=0.1)
    with pytest.raises(AOGPTError, match="--val-docs must be at least 1"):
        load_corpus(str(tmp_path), val_docs=0)
    with pytest.raises(AOGPTError, match="--val-docs does not apply to shakespeare"):
        load_corpus("shakespeare", val_docs=3)
