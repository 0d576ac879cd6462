"""Perplexity and bits per byte: what a mean loss in nats per token means, defined once.

Perplexity depends on the tokenizer (a token of bpe:4096 holds about three bytes of Shakespeare, a
token of `bytes` one), so runs with different tokenizers compare only by **bits per byte**: the
total loss of a text in bits divided by its length in UTF-8 bytes,

    bpb = nats_per_token * tokens / bytes / ln 2.

The bytes are those of the very tokens scored (`aogpt.data.Tokenizer.byte_lengths`), so the figure
is exact for the evaluated text, not an average over the corpus.
"""

from __future__ import annotations

import math


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
