"""Our tokenizers saved for `AutoTokenizer`: the same ids for every string, the same text back."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from aogpt.data.tokenizer import EOT_TEXT, ByteTokenizer, GPT2Tokenizer, load_tokenizer, train_bpe
from aogpt.errors import AOGPTError
from aogpt.hf import to_hf_tokenizer

TEXTS = [
    "Hello world", "  leading and trailing   ", "a\n\n b\t\tc  \n", "it's they'll I'VE we'd", "",
    "numbers 123 4567 3.14", "unicode: ü é ß 数字 🎉 — “quotes”", "x  y   z    ", "\n", " ",
    f"a literal {EOT_TEXT} stays text", "Mr.   Smith's  'quote'  \r\n end   \n\n", "   \u00a0nbsp\u2009thin",
]


def trained_bpe():
    return train_bpe(["the king and the queen walked by the sea at night " * 30, "数字 ü é 🎉 it's 123"], 320)


@pytest.mark.parametrize("make", [GPT2Tokenizer, ByteTokenizer, trained_bpe], ids=["gpt2", "bytes", "bpe"])
def test_auto_tokenizer_encodes_and_decodes_like_ours(tmp_path: Path, make) -> None:
    ours = make()
    to_hf_tokenizer(ours, model_max_length=128).save_pretrained(tmp_path)
    theirs = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        ids = ours.encode(text)
        assert theirs(text)["input_ids"] == ids, text
        assert theirs.decode(ids) == text == ours.decode(ids)
    assert theirs.eos_token == EOT_TEXT and theirs.eos_token_id == ours.eot_id
    assert theirs.decode([ours.eot_id]) == ours.decode([ours.eot_id]) == EOT_TEXT
    assert theirs.model_max_length == 128 and theirs.bos_token is None
    if ours.spec.startswith("bpe"):  # our own loader reads the saved tokenizer.json too
        again = load_tokenizer(ours.spec, tmp_path)
        assert all(again.encode(t) == ours.encode(t) for t in TEXTS)


def test_refuses_what_is_not_our_tokenizer() -> None:
    with pytest.raises(AOGPTError, match="not an aogpt tokenizer"):
        to_hf_tokenizer("gpt2")
