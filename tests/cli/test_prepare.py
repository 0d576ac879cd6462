"""`aogpt prepare` through the CLI entry point: summary, --json, one-line errors with exit status 2."""

from __future__ import annotations

import json

import pytest

import aogpt.cli


@pytest.fixture(autouse=True)
def only_prepare(monkeypatch: pytest.MonkeyPatch) -> None:
    """Build the parser with this command alone, so these tests do not depend on the others."""
    monkeypatch.setattr(aogpt.cli, "COMMANDS", ["prepare"])


def test_prepare_json_summary(tmp_path, cli) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"line {i}\n" for i in range(200)))
    r = cli("prepare", "--corpus", corpus, "--tokenizer", "bytes", "--out", tmp_path / "o", "--json")
    assert r.code == 0, r.err
    summary = r.json
    n = len(corpus.read_text())
    assert summary["train_tokens"] + summary["val_tokens"] == n + 2  # one EOT per part of the cut document
    assert summary["train_documents"] == summary["val_documents"] == 1
    assert summary["tokenizer"] == "bytes" and summary["dtype"] == "uint16" and summary["out"] == str(tmp_path / "o")
    assert summary["seconds"] >= 0
    assert "train" in r.out and (tmp_path / "o" / "meta.json").is_file()


def test_prepare_defaults(tmp_path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"body": f"text {i}"}) + "\n" for i in range(30)))
    r = cli("prepare", "--corpus", "docs.jsonl", "--text-field", "body", "--val-fraction", "0.1", "--no-progress")
    assert r.code == 0, r.err
    meta = json.loads((tmp_path / "data" / "docs-bpe4096" / "meta.json").read_text())
    assert meta["tokenizer"] == "bpe:4096" and meta["splits"]["val"]["documents"] == 3
    assert meta["options"] == {"text_field": "body", "txt_docs": "file"} and meta["seed"] == 1337


def test_help(cli) -> None:
    r = cli("prepare", "--help")
    assert r.code == 0
    assert "shakespeare" in r.out and "--val-fraction" in r.out and "bpe:N" in r.out


def _bad_inputs(tmp_path) -> list[tuple[list[str], str]]:
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n")
    (tmp_path / "small.txt").write_text("x")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "keep.txt").write_text("keep")
    (tmp_path / "rows.jsonl").write_text('{"content": "x"}\n')
    out = ["--out", str(tmp_path / "o"), "--tokenizer", "bytes"]
    return [
        (["--corpus", "nosuchcorpus", *out], "unknown corpus 'nosuchcorpus'"),
        (["--corpus", "shakespeare", "--out", str(tmp_path / "o"), "--tokenizer", "gpt-2"], "unknown tokenizer spec"),
        (["--corpus", str(tmp_path / "missing.txt"), *out], "does not exist"),
        (["--corpus", str(tmp_path / "empty.txt"), *out], "contains no text"),
        (["--corpus", str(tmp_path / "latin1.txt"), *out], "is not valid UTF-8"),
        (["--corpus", str(tmp_path / "small.txt"), *out], "too small to split"),
        (["--corpus", str(tmp_path / "rows.jsonl"), *out], "no string field 'text'"),
        (["--corpus", "shakespeare", "--val-fraction", "0.2", *out], "validation plays are fixed"),
        (["--corpus", str(tmp_path / "rows.jsonl"), "--val-fraction", "2", *out], "between 0 and 1"),
        (["--corpus", "shakespeare", "--tokenizer", "bytes", "--out", str(tmp_path / "foreign")], "refusing"),
        (["--corpus", "shakespeare", "--max-docs", "0", *out], "at least 1"),
        (["--corpus", "hf:", *out], "names no dataset"),
        (["--tokenizer", "bytes", "--bogus-flag"], "unrecognized arguments"),
    ]


def test_bad_input_is_one_line_exit_2(tmp_path, cli) -> None:
    for argv, message in _bad_inputs(tmp_path):
        r = cli("prepare", *argv)
        assert r.code == 2, argv
        assert r.err.startswith("error: ") and r.err.count("\n") == 1, r.err
        assert message in r.err and "Traceback" not in r.err, r.err
    assert (tmp_path / "foreign" / "keep.txt").read_text() == "keep"
    assert not (tmp_path / "o").exists()
