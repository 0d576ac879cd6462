"""Perplexity and bits per byte: what a mean loss in nats per token means, defined once; and the share
of a sample's words that are words of the training text.

Perplexity depends on the tokenizer (a token of bpe:4096 holds about three bytes of Shakespeare, a
token of `bytes` one), so runs with different tokenizers compare only by **bits per byte**: the
total loss of a text in bits divided by its length in UTF-8 bytes,

    bpb = nats_per_token * tokens / bytes / ln 2.

The bytes are those of the very tokens scored (`aogpt.data.Tokenizer.byte_lengths`), so the figure
is exact for the evaluated text, not an average over the corpus.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass


def perplexity(nats_per_token: float) -> float:
    """exp(loss), capped at exp(50) so a diverged run prints a number, not an overflow."""
    return math.exp(min(nats_per_token, 50.0))


def bits_per_byte(nats_per_token: float, tokens: int, num_bytes: int) -> float:
    """Bits per UTF-8 byte of a text of `tokens` tokens and `num_bytes` bytes scored at
    `nats_per_token`; NaN when the text has no bytes (e.g. only end-of-text tokens)."""
    if num_bytes <= 0:
        return math.nan
    return nats_per_token * tokens / num_bytes / math.log(2)


def describe_loss(nats_per_token: float, bpb: float | None = None) -> str:
    """`loss 4.812 nats/token, perplexity 123.0, 2.37 bits/byte` (the bits per byte when known)."""
    text = f"loss {nats_per_token:.3f} nats/token, perplexity {perplexity(nats_per_token):.1f}"
    if bpb is not None and math.isfinite(bpb):
        text += f", {bpb:.3f} bits/byte"
    return text


# ---------------------------------------------------------------- words: does a sample read as the language?

WORD = re.compile(r"[A-Za-z]+")
MIN_LETTERS = 3  # shorter "words" (a, I, of, to) are too easily hit by chance


def words(text: str, min_letters: int = MIN_LETTERS) -> list[str]:
    """The words of `text` with at least `min_letters` letters, lower-cased: maximal runs of ASCII
    letters (an apostrophe or a hyphen ends a word)."""
    return [w.lower() for w in WORD.findall(text) if len(w) >= min_letters]


@dataclass(frozen=True)
class WordShare:
    """How many of a text's words (`words`) occur in a reference vocabulary: a plain check that a
    sample is made of the language's words, whatever order it was generated in."""

    known: int
    total: int

    @property
    def share(self) -> float:
        return self.known / self.total if self.total else math.nan

    def describe(self) -> str:
        if not self.total:
            return f"no words of {MIN_LETTERS}+ letters"
        return f"{self.known} of {self.total} words of {MIN_LETTERS}+ letters occur in the training text " \
               f"({100 * self.share:.0f}%)"


def word_share(texts: Iterable[str], vocabulary: Collection[str]) -> WordShare:
    """The share of the words of `texts` (`words`) that are in `vocabulary` (lower-case words)."""
    found = [w for text in texts for w in words(text)]
    return WordShare(sum(w in vocabulary for w in found), len(found))


def vocabulary(text: str) -> frozenset[str]:
    """The lower-case words of `text` (`words`), e.g. of a corpus's training split."""
    return frozenset(words(text))
