"""prepare -> token files, PreparedData and its batches; exact counts, determinism, bad input."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from aogpt.data import PreparedData, default_out_dir, prepare, split_pieces, token_dtype
from aogpt.data import prepared as data_mod
from aogpt.data.corpora import load_corpus
from aogpt.data.tokenizer import ByteTokenizer, load_tokenizer, train_bpe
from aogpt.errors import AOGPTError

# Measured once and pinned: a change in cleaning, splitting or EOT placement changes these.
SHAKESPEARE_BYTES = {"train": (4_444_401, 35), "val": (373_948, 3)}
SHAKESPEARE_GPT2 = {"train": (1_353_130, 35), "val": (115_255, 3)}
SHAKESPEARE_BPE512_2DOCS = {"train": (104_770, 2), "val": (107_106, 2)}


@pytest.fixture(scope="module")
def shakespeare_bytes(tmp_path_factory: pytest.TempPathFactory) -> PreparedData:
    out = tmp_path_factory.mktemp("prep") / "shakespeare-bytes"
    prepare("shakespeare", "bytes", out, progress=False)
    return PreparedData(out, expect_tokenizer="bytes")


def _counts(meta: dict) -> dict:
    return {s: (v["tokens"], v["documents"]) for s, v in meta["splits"].items()}


def test_prepare_shakespeare_bytes(shakespeare_bytes: PreparedData) -> None:
    d, meta = shakespeare_bytes, shakespeare_bytes.meta
    assert _counts(meta) == SHAKESPEARE_BYTES
    assert meta["tokenizer"] == "bytes" and meta["vocab_size"] == 257 and meta["padded_vocab_size"] == 320
    assert meta["dtype"] == "uint16" and meta["format_version"] == 1 and meta["corpus"] == "shakespeare"
    assert len(meta["sources"]) == 38 and "seconds" not in meta
    train = d.split("train")
    assert isinstance(train, np.memmap) and train.dtype == np.uint16
    assert (d.directory / "train.bin").stat().st_size == 2 * SHAKESPEARE_BYTES["train"][0]
    # one EOT after every document, and the bytes are the cleaned UTF-8 text
    for split, (_, docs) in SHAKESPEARE_BYTES.items():
        arr = np.asarray(d.split(split))
        assert int((arr == 256).sum()) == docs and arr[-1] == 256
    plays = list(load_corpus("shakespeare").documents("val"))
    expected = b"".join(p.encode() + b"\x00" for p in plays)  # \x00 stands in for EOT
    got = np.asarray(d.split("val")).copy()
    got[got == 256] = 0
    assert got.astype(np.uint8).tobytes() == expected


def test_prepare_shakespeare_gpt2(tmp_path) -> None:
    meta = prepare("shakespeare", "gpt2", tmp_path / "g", progress=False)
    assert _counts(meta) == SHAKESPEARE_GPT2
    assert (meta["vocab_size"], meta["padded_vocab_size"], meta["eot_id"]) == (50257, 50304, 50256)
    d = PreparedData(tmp_path / "g", "gpt2")
    assert d.tokenizer.decode(d.split("val")[:7]) == "Julius Caesar\n\nACT I"
    assert list(d.split("val")[:3]) == [16980, 3754, 24088]  # "Jul", "ius", " Caesar"


def test_prepare_bpe_is_deterministic(tmp_path) -> None:
    a = prepare("shakespeare", "bpe:512", tmp_path / "a", progress=False, max_docs=2)
    assert (
        _counts(a) == SHAKESPEARE_BPE512_2DOCS and a["vocab_size"] == 512 and a["tokenizer_files"] == ["tokenizer.json"]
    )
    prepare("shakespeare", "bpe:512", tmp_path / "b", progress=False, max_docs=2)
    for name in ("train.bin", "val.bin", "meta.json", "tokenizer.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    d = PreparedData(tmp_path / "a")
    # the tokenizer was trained on the two training plays only and round-trips the val text
    val_text = "".join(load_corpus("shakespeare", max_docs=2).documents("val"))
    ids = np.asarray(d.split("val"))
    assert d.tokenizer.decode(ids[ids != d.eot_id]) == val_text


def test_prepare_records_the_utf8_bytes_of_each_split(tmp_path) -> None:
    """meta.json's bytes are the UTF-8 length of the split's text; folders prepared without them count
    them from their ids."""
    prepare("shakespeare", "bpe:512", tmp_path / "a", progress=False, max_docs=2)
    d = PreparedData(tmp_path / "a")
    for split in ("train", "val"):
        text = "".join(load_corpus("shakespeare", max_docs=2).documents(split))
        assert d.meta["splits"][split]["bytes"] == d.num_bytes(split) == len(text.encode("utf-8"))
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    for info in meta["splits"].values():
        del info["bytes"]
    (tmp_path / "a" / "meta.json").write_text(json.dumps(meta))
    legacy = PreparedData(tmp_path / "a")
    assert "bytes" not in legacy.meta["splits"]["val"]
    assert legacy.num_bytes("val") == d.num_bytes("val") and legacy.num_bytes("train") == d.num_bytes("train")
    lengths = legacy.token_byte_lengths()
    window = torch.from_numpy(np.asarray(legacy.split("val")[:300], dtype=np.int64))
    assert int(lengths[window].sum()) == len(legacy.tokenizer.decode(window[window != legacy.eot_id]).encode())


def test_split_pieces_do_not_change_ids() -> None:
    play = next(load_corpus("shakespeare", max_docs=1).documents("train"))[:60_000]
    text = play + "tricky  \n\n\n  spaces\n\t\nx\n \n" * 50
    pieces = split_pieces(text, 700)
    assert len(pieces) > 50 and "".join(pieces) == text
    for tok in (load_tokenizer("gpt2"), train_bpe([play], 600)):
        whole = tok.encode(text)
        assert [i for ids in tok.encode_batch(pieces) for i in ids] == whole


def test_token_dtype() -> None:
    assert token_dtype(257) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32 and token_dtype(1_000_000) == np.uint32


def test_large_vocabulary_uses_uint32(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    class WideBytes(ByteTokenizer):  # bytes, but with EOT at 70000
        spec, vocab_size, eot_id = "bytes", 70001, 70000

    monkeypatch.setattr(data_mod, "load_tokenizer", lambda spec: WideBytes())
    (tmp_path / "c.txt").write_text("hello\nworld\n" * 10)
    meta = prepare(str(tmp_path / "c.txt"), "bytes", tmp_path / "out", progress=False)
    assert meta["dtype"] == "uint32"
    train = PreparedData(tmp_path / "out").split("train")
    assert train.dtype == np.uint32 and train[-1] == 70000 and list(train[:5]) == list(b"hello")


def test_get_batch_windows_and_determinism(shakespeare_bytes: PreparedData) -> None:
    d, n = shakespeare_bytes, SHAKESPEARE_BYTES["train"][0]
    x = d.get_batch("train", 8, 64, torch.Generator().manual_seed(7))
    assert x.shape == (8, 64) and x.dtype == torch.long
    assert torch.equal(x, d.get_batch("train", 8, 64, torch.Generator().manual_seed(7)))
    assert not torch.equal(x, d.get_batch("train", 8, 64, torch.Generator().manual_seed(8)))
    starts = torch.randint(n - 64 + 1, (8,), generator=torch.Generator().manual_seed(7)).tolist()
    data = np.asarray(d.split("train"))
    for row, s in zip(x, starts, strict=True):
        assert row.tolist() == data[s : s + 64].tolist()
    # a kept generator advances: consecutive batches differ, and replaying its state replays them
    g = torch.Generator().manual_seed(1)
    state = g.get_state()
    first, second = d.get_batch("train", 4, 16, g), d.get_batch("train", 4, 16, g)
    assert not torch.equal(first, second)
    g.set_state(state)
    assert torch.equal(d.get_batch("train", 4, 16, g), first)
    # numpy generators and int seeds work too
    a = d.get_batch("val", 3, 5, np.random.default_rng(0))
    assert torch.equal(a, d.get_batch("val", 3, 5, np.random.default_rng(0)))
    assert torch.equal(d.get_batch("val", 3, 5, 11), d.get_batch("val", 3, 5, 11))


def test_get_batch_whole_split(tmp_path) -> None:
    (tmp_path / "t.txt").write_text("abcdefghij\n" * 2)
    prepare(str(tmp_path / "t.txt"), "bytes", tmp_path / "o", progress=False)
    d = PreparedData(tmp_path / "o")
    n = d.num_tokens("val")
    x = d.get_batch("val", 5, n, 0)  # block == split size: the only window starts at 0
    assert (x == torch.as_tensor(np.array(d.split("val")), dtype=torch.long)).all()


def test_iter_eval_batches(shakespeare_bytes: PreparedData) -> None:
    d, n = shakespeare_bytes, SHAKESPEARE_BYTES["val"][0]
    block, batch = 1000, 64
    batches = list(d.iter_eval_batches("val", batch, block))
    windows = n // block
    assert len(batches) == d.num_eval_batches("val", batch, block) == -(-windows // batch)
    assert all(b.shape == (batch, block) for b in batches[:-1])
    assert batches[-1].shape == (windows - batch * (len(batches) - 1), block)
    flat = torch.cat([b.reshape(-1) for b in batches])
    assert flat.tolist() == np.asarray(d.split("val"))[: windows * block].tolist()
    assert len(list(d.iter_eval_batches("val", batch, block, max_batches=2))) == 2


def test_split_smaller_than_a_block(shakespeare_bytes: PreparedData) -> None:
    n = SHAKESPEARE_BYTES["val"][0]
    with pytest.raises(AOGPTError, match=rf"the val split of .* has {n} tokens, fewer than one block of {n + 1}"):
        shakespeare_bytes.get_batch("val", 1, n + 1, 0)
    with pytest.raises(AOGPTError, match="fewer than one block"):
        next(shakespeare_bytes.iter_eval_batches("val", 1, n + 1))
    with pytest.raises(AOGPTError, match="has no split 'test'"):
        shakespeare_bytes.get_batch("test", 1, 8, 0)


def test_prepared_data_errors(shakespeare_bytes: PreparedData, tmp_path) -> None:
    with pytest.raises(AOGPTError, match="does not exist"):
        PreparedData(tmp_path / "missing")
    with pytest.raises(AOGPTError, match="has no meta.json"):
        PreparedData(tmp_path)
    with pytest.raises(AOGPTError, match=r"prepared with tokenizer bytes, not gpt2 \(use --tokenizer bytes"):
        PreparedData(shakespeare_bytes.directory, expect_tokenizer="gpt2")
    with pytest.raises(AOGPTError, match="unknown tokenizer spec"):
        PreparedData(shakespeare_bytes.directory, expect_tokenizer="gpt-2")
    copy = tmp_path / "copy"
    shutil.copytree(shakespeare_bytes.directory, copy)
    with open(copy / "val.bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(AOGPTError, match="val.bin has 10 bytes, but meta.json promises 373948 uint16"):
        PreparedData(copy).split("val")
    meta = json.loads((copy / "meta.json").read_text())
    (copy / "meta.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(AOGPTError, match="data format 99"):
        PreparedData(copy)


def test_failed_prepare_keeps_the_old_directory(shakespeare_bytes: PreparedData, tmp_path) -> None:
    out = tmp_path / "keep"
    shutil.copytree(shakespeare_bytes.directory, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(self, texts):
        raise RuntimeError("boom")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ByteTokenizer, "encode_batch", broken)
        with pytest.raises(RuntimeError, match="boom"):
            prepare("shakespeare", "bytes", out, progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["keep"]  # no temporary directory left behind


def test_prepare_refuses_a_foreign_directory(tmp_path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")
    with pytest.raises(AOGPTError, match="not a prepared data directory; refusing to replace it"):
        prepare("shakespeare", "bytes", tmp_path / "mine", progress=False)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "precious"
    (tmp_path / "file").write_text("x")
    with pytest.raises(AOGPTError, match="not a directory"):
        prepare("shakespeare", "bytes", tmp_path / "file", progress=False)


def test_prepare_bad_tokenizer_before_work(tmp_path) -> None:
    with pytest.raises(AOGPTError, match="unknown tokenizer spec 'bpe:1'"):
        prepare("shakespeare", "bpe:1", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_literal_eot_text_is_not_a_separator(tmp_path) -> None:
    (tmp_path / "e.jsonl").write_text('{"text": "a<|endoftext|>b"}\n{"text": "c"}\n')
    meta = prepare(str(tmp_path / "e.jsonl"), "bytes", tmp_path / "o", progress=False)
    assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == 2
    d = PreparedData(tmp_path / "o")
    both = np.concatenate([d.split("train"), d.split("val")])
    assert int((both == 256).sum()) == 2


def test_default_out_dir() -> None:
    assert default_out_dir("shakespeare", "bpe:4096").as_posix() == "data/shakespeare-bpe4096"
    assert default_out_dir("~/texts/my corpus.txt", "gpt2").as_posix() == "data/my-corpus-gpt2"
    assert default_out_dir("hf:Skylion007/openwebtext", "gpt2").as_posix() == "data/hf-Skylion007-openwebtext-gpt2"
