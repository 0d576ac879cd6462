"""The `hf` tokenizer spec: a pretrained model's own tokenizer.json, carried and reloaded as it is."""

from __future__ import annotations

import numpy as np
import pytest

from aogpt.data.pretrained_tokenizer import PretrainedTokenizer
from aogpt.data.tokenizer import load_tokenizer
from aogpt.errors import AOGPTError
from aogpt.hf.tokenization import backend_tokenizer

TEXT = "To be, or not to be: <|endoftext|> that is the question. Ünïcödé"


def test_round_trip_save_load_and_exact_byte_lengths(tmp_path):
    gpt2 = load_tokenizer("gpt2")
    tok = PretrainedTokenizer.from_backend(backend_tokenizer(gpt2), gpt2.eot_id)
    ids = tok.encode(TEXT)
    assert ids == gpt2.encode(TEXT) and tok.eot_id not in ids  # special-token text stays ordinary text
    assert tok.decode(ids) == TEXT
    assert int(tok.byte_lengths()[ids].sum()) == len(TEXT.encode("utf-8"))
    tok.save(tmp_path)
    back = load_tokenizer("hf", tmp_path)
    assert back.encode(TEXT) == ids and back.eot_id == tok.eot_id and back.vocab_size == tok.vocab_size
    np.testing.assert_array_equal(back.byte_lengths(), tok.byte_lengths())


def test_missing_files_are_one_error(tmp_path):
    with pytest.raises(AOGPTError, match="cannot load the pretrained tokenizer"):
        load_tokenizer("hf", tmp_path)
