"""Perplexity and bits per byte (`aogpt.measures`), checked against cases whose answer is known."""

from __future__ import annotations

import math

import pytest

from aogpt.measures import bits_per_byte, describe_loss, perplexity


def test_a_uniform_byte_model_spends_eight_bits_per_byte() -> None:
    # uniform over 256 byte values: ln 256 nats per token, one byte per token
    assert bits_per_byte(math.log(256), 1000, 1000) == pytest.approx(8.0)
    # the same text in tokens of 4 bytes: a uniform model over 2**32 such tokens also spends 8 bits a byte
    assert bits_per_byte(math.log(2**32), 250, 1000) == pytest.approx(8.0)


def test_bits_per_byte_scales_with_tokens_per_byte() -> None:
    # 2 nats per token, 100 tokens, 300 bytes: 200 nats = 288.54 bits over 300 bytes
    assert bits_per_byte(2.0, 100, 300) == pytest.approx(200 / math.log(2) / 300)
    assert math.isnan(bits_per_byte(2.0, 100, 0))


def test_perplexity_and_description() -> None:
    assert perplexity(math.log(7.5)) == pytest.approx(7.5)
    assert perplexity(1e9) == math.exp(50)  # a diverged run prints a number
    assert describe_loss(math.log(123.0), 2.3456) == "loss 4.812 nats/token, perplexity 123.0, 2.346 bits/byte"
    assert describe_loss(math.log(123.0)) == "loss 4.812 nats/token, perplexity 123.0"
    assert describe_loss(1.0, math.nan) == "loss 1.000 nats/token, perplexity 2.7"


def test_words_and_their_share_in_a_vocabulary():
    from aogpt.measures import vocabulary, word_share, words

    assert words("To be, or not to be: O'er the HAMLET-ish sea!") == ["not", "the", "hamlet", "ish", "sea"]
    known = vocabulary("Not the sea; never the hamlet.")
    share = word_share(["To be, or not to be: the sea", "zzq hamlet xyzzy", "a I"], known)
    assert (share.known, share.total) == (4, 6) and share.share == pytest.approx(4 / 6)
    assert share.describe() == "4 of 6 words of 3+ letters occur in the training text (67%)"
    empty = word_share(["a, b; I."], known)
    assert empty.total == 0 and math.isnan(empty.share) and empty.describe() == "no words of 3+ letters"
