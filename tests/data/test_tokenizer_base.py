"""`HFTokenizer`: the methods of every tokenizer held by Hugging Face `tokenizers` (our trained bpe:N
and a pretrained model's own hf), written once and behaving the same for both."""

from __future__ import annotations

from aogpt.data.pretrained_tokenizer import PretrainedTokenizer
from aogpt.data.tokenizer import EOT_TEXT, BPETokenizer, train_bpe
from aogpt.data.tokenizer_base import HFTokenizer

TEXTS = ["To be, or not to be: <|endoftext|> that is the question.", "Ünïcödé and spaces  ", "", "x"]


def test_the_backed_methods_live_in_the_base_only() -> None:
    shared = ("encode", "encode_batch", "_decode", "to_json", "special_ids")
    for cls in (BPETokenizer, PretrainedTokenizer):
        assert issubclass(cls, HFTokenizer)
        assert [name for name in shared if name in vars(cls)] == [], cls


def test_bpe_and_pretrained_on_one_backend_encode_decode_and_serialize_alike(tmp_path) -> None:
    bpe = train_bpe(["the king and the queen went to the sea"] * 20, 300)
    pre = PretrainedTokenizer.from_backend(bpe._hf, bpe.eot_id)
    for text in TEXTS:
        ids = bpe.encode(text)
        assert pre.encode(text) == ids and bpe.eot_id not in ids  # a literal EOT text stays ordinary text
        assert bpe.decode(ids) == pre.decode(ids) == text
    assert pre.encode_batch(TEXTS) == bpe.encode_batch(TEXTS) == [bpe.encode(t) for t in TEXTS]
    assert pre.to_json() == bpe.to_json() and EOT_TEXT in bpe.to_json()
    assert bpe.special_ids() == pre.special_ids() == {bpe.eot_id}
    for name, tok in (("a", bpe), ("b", pre)):
        (tmp_path / name).mkdir()
        tok.save(tmp_path / name)
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == sorted(pre.files)
