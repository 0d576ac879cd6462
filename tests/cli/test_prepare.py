"""`aogpt prepare` through the CLI entry point: summary, --json, one-line errors with exit status 2."""

from __future__ import annotations

import json

import pytest

import aogpt.cli
from tests.data.test_corpora import fake_datasets


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
        (["--corpus", str(tmp_path / "rows.jsonl"), "--val-fraction", "2", *out],
         "argument --val-fraction: must be in (0, 1), got 2.0"),
        (["--corpus", "shakespeare", "--tokenizer", "bytes", "--out", str(tmp_path / "foreign")], "refusing"),
        (["--corpus", "shakespeare", "--max-docs", "0", *out], "argument --max-docs: must be >= 1, got 0"),
        (["--corpus", "hf:", *out], "names no dataset"),
        (["--tokenizer", "bytes", "--bogus-flag"], "unrecognized arguments"),
        (["--corpus", "shakespeare", "--shard-tokens", "0", *out], "argument --shard-tokens: must be in [1, "),
        (["--corpus", "shakespeare", "--workers", "0", *out], "argument --workers: must be in [1, 1024], got 0"),
        (["--corpus", str(tmp_path / "foreign"), "--val-docs", "0", *out], "argument --val-docs: must be >= 1, got 0"),
        (["--corpus", str(tmp_path / "foreign"), "--val-docs", "1", *out], "leaves no training documents"),
        (["--corpus", "shakespeare", "--val-docs", "3", *out], "--val-docs does not apply to shakespeare"),
        (["--corpus", str(tmp_path / "foreign"), "--val-docs", "1", "--val-fraction", "0.1", *out], "exclude each"),
        (["--corpus", "shakespeare", "--resume", *out], "nothing to resume"),
        (["--corpus", "shakespeare", "--resume", "--restart", *out], "not allowed with argument"),
    ]


def test_bad_input_is_one_line_exit_2(tmp_path, cli) -> None:
    for argv, message in _bad_inputs(tmp_path):
        r = cli("prepare", *argv)
        assert r.code == 2, argv
        assert r.err.startswith("error: ") and r.err.count("\n") == 1, r.err
        assert message in r.err and "Traceback" not in r.err, r.err
    assert (tmp_path / "foreign" / "keep.txt").read_text() == "keep"
    assert not (tmp_path / "o").exists() and not (tmp_path / ".o.partial").exists()


def test_openwebtext_offline_is_one_line(tmp_path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util
    import sys

    with monkeypatch.context() as m:
        m.setitem(sys.modules, "datasets", None)
        m.setattr(importlib.util, "find_spec", lambda name: None)  # `datasets` is not installed
        r = cli("prepare", "--corpus", "openwebtext", "--tokenizer", "gpt2", "--out", tmp_path / "o")
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert r.err.startswith("error: corpus hf:Skylion007/openwebtext needs the Hugging Face `datasets` package")
    fake_datasets(monkeypatch, OSError("We couldn't connect to 'https://huggingface.co' (offline)\ndetails"))
    r = cli("prepare", "--corpus", "openwebtext", "--tokenizer", "gpt2", "--out", tmp_path / "o")
    assert r.code == 2 and r.err.count("\n") == 1 and "Traceback" not in r.err, r.err
    assert "cannot load Hugging Face dataset hf:Skylion007/openwebtext: We couldn't connect" in r.err
    assert list(tmp_path.iterdir()) == []


def test_interrupted_prepare_resumes(tmp_path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from aogpt.data import shards

    docs = [{"text": f"document {i}: " + "words and more words " * (i % 9 + 1)} for i in range(1500)]
    fake_datasets(monkeypatch, {"train": docs})
    args = ["prepare", "--corpus", "hf:fake/web", "--tokenizer", "bytes", "--val-docs", "100", "--shard-tokens", "5000"]
    r = cli(*args, "--out", tmp_path / "reference", "--json", "--no-progress")
    assert r.code == 0, r.err
    assert r.json["train_shards"] == -(-r.json["train_tokens"] // 5000) > 10
    assert r.json["val_shards"] == -(-r.json["val_tokens"] // 5000) > 1
    assert r.json["val_documents"] == 100 and r.json["resumed_documents"] == 0

    commits = r.json["train_tokens"] // 5000 + r.json["val_tokens"] // 5000  # one per filled shard
    real, calls = shards.write_json, []

    def interrupt_at_the_last_commit(path, obj):  # the validation shards are written last
        if len(calls) == commits - 1:
            raise KeyboardInterrupt
        calls.append(obj["partial"])
        real(path, obj)

    monkeypatch.setattr(shards, "write_json", interrupt_at_the_last_commit)
    r = cli(*args, "--out", tmp_path / "out")
    assert r.code == 130 and "interrupted" in r.err
    monkeypatch.setattr(shards, "write_json", real)
    assert not (tmp_path / "out").exists() and (tmp_path / ".out.partial" / "progress.json").is_file()
    assert calls[-1]["split"] == "val"  # resuming inside a validation document

    r = cli(*args[:-1], "6000", "--out", tmp_path / "out")
    assert r.code == 2 and "differs in: shard_tokens" in r.err and "--restart" in r.err
    r = cli(*args, "--out", tmp_path / "out", "--resume", "--json")
    assert r.code == 0, r.err
    assert r.json["resumed_documents"] > 0 and "resumed an interrupted run" in r.out
    for name in sorted(p.name for p in (tmp_path / "reference").iterdir()):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "reference" / name).read_bytes(), name
    assert not (tmp_path / ".out.partial").exists()
