"""What the `transformers` readers share: the start slot, the tokenizer, checks of unusual settings."""

from __future__ import annotations

from typing import Any

import torch

from aogpt.errors import AOGPTError


def refuse(source: Any, what: str, fix: str = "adapt a model with the family's standard settings") -> None:
    raise AOGPTError(f"{source}: {what}, which the adapted backbone does not rebuild", fix)


def start_row(model: Any, tokenizer: Any, embeddings: torch.Tensor) -> tuple[torch.Tensor, str]:
    """The start slot's embedding, and the plan line's words for it. One rule for every source: the
    source's beginning-of-text token (its tokenizer's ``bos_token``, else its config's
    ``bos_token_id``), so the adapted model's first slot is what the source sees before its first
    token. A source without one gets the mean of its token embeddings: left to right the adapted
    model then equals the source fed that vector first (`inputs_embeds`), and fine-tuning learns the
    start slot like any other weight."""
    bos, where = getattr(tokenizer, "bos_token_id", None), "its tokenizer's bos_token"
    if bos is None:
        bos, where = getattr(model.config, "bos_token_id", None), "its config's bos_token_id"
    if isinstance(bos, int) and 0 <= bos < embeddings.shape[0]:
        name = tokenizer.convert_ids_to_tokens(bos) if hasattr(tokenizer, "convert_ids_to_tokens") else None
        shown = f" {name!r}" if isinstance(name, str) else ""
        return embeddings[bos].clone()[None], f"the source's beginning-of-text token{shown} (id {bos}, {where})"
    return embeddings.mean(0, keepdim=True), "the mean token embedding (the source has no beginning-of-text token)"


def our_tokenizer(hf_tokenizer: Any, vocab_size: int, source: Any) -> Any:
    """The source's tokenizer as ours: GPT-2's own files where it is GPT-2's, else the tokenizer's
    `tokenizer.json` carried as it is (`aogpt.data.pretrained_tokenizer`). Refused if it has ids the
    model cannot embed."""
    from aogpt.data.pretrained_tokenizer import PretrainedTokenizer

    if not getattr(hf_tokenizer, "is_fast", False):
        raise AOGPTError(f"{source}: the tokenizer is not a fast (tokenizer.json) tokenizer",
                         "save the model's fast tokenizer beside it")
    n = len(hf_tokenizer)
    if n > vocab_size:
        raise AOGPTError(f"{source}: the tokenizer has {n} tokens but the model embeds only {vocab_size}",
                         "use the tokenizer the model was trained with")
    if _is_gpt2(hf_tokenizer):
        from aogpt.data.tokenizer import GPT2Tokenizer

        return GPT2Tokenizer()
    eos = hf_tokenizer.eos_token_id
    if eos is None:
        raise AOGPTError(f"{source}: the tokenizer has no end-of-text token", "set eos_token in its tokenizer_config")
    return PretrainedTokenizer.from_backend(hf_tokenizer.backend_tokenizer, eos)


def _is_gpt2(hf_tokenizer: Any) -> bool:
    import json

    from aogpt.data.tokenizer import gpt2_files

    vocab = hf_tokenizer.get_vocab()
    if len(vocab) != 50257:
        return False
    try:
        ours = json.loads(gpt2_files()["encoder.json"].read_text(encoding="utf-8"))
    except AOGPTError:
        return False
    return vocab == ours
