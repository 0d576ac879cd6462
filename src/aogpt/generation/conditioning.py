"""What is known before generation: the output length and the given (position, token) pairs.

Three ways to say it: a prefix prompt (`prompt_condition`), a template with ``[MASK]`` /
``[MASK:k]`` blanks, a {position: token} mapping, or a list of ids with None for blanks
(`parse_template`). Known tokens are prefilled once and never changed (docs/generation.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from aogpt.errors import AOGPTError


@dataclass
class Conditioning:
    """What is known before generation: output length and the given (position, token) pairs."""

    length: int
    positions: torch.Tensor  # (m,) int64, distinct
    tokens: torch.Tensor  # (m,) int64


BLANK = re.compile(r"\[MASK(?::([^\]]*))?\]")


def _check_length(n: int, config: Any, what: str) -> None:
    if not 1 <= n <= config.block_size:
        raise AOGPTError(f"{what} of {n} tokens does not fit the model's context of {config.block_size}",
                         f"use a length in 1..{config.block_size}")


def _known(n: int, pairs: list[tuple[int, int]], config: Any) -> Conditioning:
    bad = [t for _, t in pairs if not 0 <= t < config.vocab_size]
    if bad:
        raise AOGPTError(f"token ids {bad[:5]} are outside the model's vocabulary of {config.vocab_size}",
                         "use ids from the model's tokenizer")
    pos = torch.tensor([p for p, _ in pairs], dtype=torch.long)
    tok = torch.tensor([t for _, t in pairs], dtype=torch.long)
    return Conditioning(n, pos, tok)


def _encode(text: str, tokenizer: Any, what: str) -> list[int]:
    if tokenizer is None:
        raise AOGPTError(f"a text {what} needs a tokenizer", "pass tokenizer=..., or token ids")
    return list(tokenizer.encode(text)) if text else []


def prompt_condition(prompt: Any, length: int | None, tokenizer: Any, config: Any) -> Conditioning:
    """A prefix prompt (text or ids) of an output of `length` tokens (default: the context)."""
    n = config.block_size if length is None else int(length)
    _check_length(n, config, "an output length")
    if prompt is None:
        ids: list[int] = []
    elif isinstance(prompt, str):
        ids = _encode(prompt, tokenizer, "prompt")
    else:
        ids = [int(t) for t in torch.as_tensor(prompt).flatten().tolist()]
    if len(ids) >= n:
        raise AOGPTError(f"the prompt has {len(ids)} tokens, leaving nothing to generate in a length of {n}",
                         f"use a length above {len(ids)} (at most {config.block_size})")
    return _known(n, list(enumerate(ids)), config)


def parse_template(template: Any, *, tokenizer: Any, length: int | None, config: Any) -> Conditioning:
    """Text with ``[MASK]`` / ``[MASK:k]`` blanks, a {position: token} mapping, or ids with None blanks."""
    if isinstance(template, str):
        if not BLANK.search(template):
            raise AOGPTError("the infilling template has no blank",
                             "mark blanks with [MASK] or [MASK:k], or use a prompt to continue a prefix")
        slots: list[int | None] = []
        at = 0
        for mt in BLANK.finditer(template):
            slots += _encode(template[at:mt.start()], tokenizer, "template")
            arg = mt.group(1)
            if arg is not None and not (arg.isdigit() and int(arg) > 0):
                raise AOGPTError(f"bad blank {mt.group(0)!r} in the template", "write [MASK] or [MASK:k], k >= 1")
            blanks = int(arg) if arg else 1
            _check_length(len(slots) + blanks, config, "the template")  # before a list of that size exists
            slots += [None] * blanks
            at = mt.end()
        slots += _encode(template[at:], tokenizer, "template")
    elif isinstance(template, Mapping):
        if length is None:
            raise AOGPTError("a {position: token} template needs an output length", "pass length=...")
        _check_length(int(length), config, "an output length")
        slots = [None] * int(length)
        for p, t in template.items():
            if not 0 <= int(p) < int(length):
                raise AOGPTError(f"template position {p} is outside 0..{int(length) - 1}", "fix the position")
            slots[int(p)] = int(t)
    else:
        slots = [None if t is None else int(t) for t in template]
    n = len(slots) if length is None else int(length)
    if n < len(slots):
        raise AOGPTError(f"the template has {len(slots)} tokens, more than the length {n}", "raise the length")
    _check_length(max(n, len(slots)), config, "the template")
    slots += [None] * (n - len(slots))
    if all(t is not None for t in slots):
        raise AOGPTError("the infilling template has no blank", "leave some positions blank")
    return _known(n, [(p, t) for p, t in enumerate(slots) if t is not None], config)
