"""Our tokenizers as Hugging Face tokenizers that `AutoTokenizer.from_pretrained` loads.

Each of our tokenizers (`aogpt.data.tokenizer`) becomes a Hugging Face `tokenizers` pipeline that
encodes every string to the same ids:

* ``gpt2``: GPT-2's vocabulary and merges (the same verified files tiktoken reads), split by the
  same pre-tokenizer pattern, byte-level;
* ``bpe:N``: the trained ``tokenizer.json`` itself (it is a Hugging Face tokenizer already);
* ``bytes``: a byte-level BPE without merges whose 256 tokens have the byte values as ids.

``<|endoftext|>`` is the end-of-text token (``eos_token``), and, as in aogpt, the literal text
``<|endoftext|>`` is encoded as ordinary text (``split_special_tokens=True``): GPT-2's own Hugging
Face tokenizer would turn it into the end-of-text id. No start token is added: the model's start
slot plays that part.
"""

from __future__ import annotations

import json
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer
from transformers import PreTrainedTokenizerFast

from aogpt.data.tokenizer import EOT_TEXT, GPT2_PATTERN, Tokenizer, gpt2_files, parse_spec
from aogpt.errors import AOGPTError


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values, in byte order (``alphabet[b]`` is byte b)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def _byte_level(model: models.Model, pattern: str | None) -> BackendTokenizer:
    backend = BackendTokenizer(model)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.pre_tokenizer = (byte_level if pattern is None else pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(pattern), behavior="isolated"), byte_level]))
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(EOT_TEXT, special=True)])
    return backend


def backend_tokenizer(tokenizer: Tokenizer) -> BackendTokenizer:
    """The Hugging Face `tokenizers` pipeline that encodes like `tokenizer`."""
    kind, _ = parse_spec(tokenizer.spec)
    if kind in ("bpe", "hf"):  # a Hugging Face tokenizer already (hf: a pretrained model's own)
        return BackendTokenizer.from_str(tokenizer.to_json())
    if kind == "bytes":
        vocab = {char: byte for byte, char in enumerate(_byte_alphabet())}
        return _byte_level(models.BPE(vocab=vocab, merges=[]), pattern=None)
    files = gpt2_files()
    vocab = json.loads(files["encoder.json"].read_text(encoding="utf-8"))
    lines = files["vocab.bpe"].read_text(encoding="utf-8").split("\n")[1:]  # the first line is a version header
    merges = [tuple(line.split(" ")) for line in lines if line]
    return _byte_level(models.BPE(vocab=vocab, merges=merges), pattern=GPT2_PATTERN)


def to_hf_tokenizer(tokenizer: Tokenizer, model_max_length: int | None = None) -> PreTrainedTokenizerFast:
    """`tokenizer` as a Hugging Face tokenizer (``save_pretrained`` writes what `AutoTokenizer` reads)."""
    if not isinstance(tokenizer, Tokenizer):
        raise AOGPTError(f"{type(tokenizer).__name__} is not an aogpt tokenizer", "pass aogpt.load(path).tokenizer")
    extra: dict[str, Any] = {} if model_max_length is None else {"model_max_length": model_max_length}
    backend = backend_tokenizer(tokenizer)
    eos = backend.id_to_token(tokenizer.eot_id) if tokenizer.spec == "hf" else EOT_TEXT  # hf: the source's own
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=eos,
                                 split_special_tokens=True, clean_up_tokenization_spaces=False, **extra)
    if hf.eos_token_id != tokenizer.eot_id:
        raise AOGPTError(f"the {tokenizer.spec} tokenizer's end-of-text id {tokenizer.eot_id} did not carry over "
                         f"(got {hf.eos_token_id})", "report this with the tokenizer files")
    return hf


__all__ = ["backend_tokenizer", "to_hf_tokenizer"]
