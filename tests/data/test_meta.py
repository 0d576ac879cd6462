"""meta.json is checked before it is trusted, and token ids are checked against a vocabulary once,
in chunks, at load."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from aogpt.data import PreparedData
from aogpt.data.meta import check_meta, max_token_id
from aogpt.errors import AOGPTError


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.pop("tokenizer"), "lacks the key 'tokenizer'"),
    (lambda m: m.update(vocab_size=0), "vocab_size must be in [1, "),
    (lambda m: m.update(eot_id=999), "eot_id 999 is outside the vocabulary of 257"),
    (lambda m: m.update(dtype="float32"), "dtype 'float32' is not one of uint16, uint32"),
    (lambda m: m["splits"]["val"].update(tokens=-1), "splits.val.tokens must be in [0, "),
    (lambda m: m["splits"]["val"].update(file="/etc/passwd"), "is not a file name inside the directory"),
    (lambda m: m["splits"].update(val=[1]), "splits.val must be a JSON object"),
    (lambda m: m["splits"]["train"].update(shards="x"), "splits.train: shards must be list"),
])
def test_damaged_meta_is_refused_naming_the_key(bytes_data, edit, message):
    meta = json.loads((bytes_data / "meta.json").read_text())
    edit(meta)
    with pytest.raises(AOGPTError) as exc:
        check_meta(meta, bytes_data / "meta.json")
    assert message in str(exc.value)


def test_token_ids_outside_the_vocabulary_are_found_in_any_chunk(bytes_data, tmp_path, monkeypatch):
    data = tmp_path / "data"
    shutil.copytree(bytes_data, data)
    ids = np.fromfile(data / "train.bin", dtype=np.uint16)
    PreparedData(data).check_token_ids(257)  # prepared data: every id below the tokenizer's 257
    monkeypatch.setattr("aogpt.data.meta.CHUNK", 1000)  # many chunks: the scan must see every one
    assert max_token_id([ids]) == int(ids.max())
    ids[-1] = 300  # in the last chunk
    ids.tofile(data / "train.bin")
    prepared = PreparedData(data)
    prepared.check_token_ids(320)
    with pytest.raises(AOGPTError, match="the train split of .* holds token id 300, outside the vocabulary of 257"):
        prepared.check_token_ids(257)
    assert max_token_id([np.zeros(0, np.uint16)]) == -1
