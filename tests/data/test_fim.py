"""The fill-in-the-middle data path: row layouts written out by hand, plain rows untouched, the cut law
against its enumerated distribution (chi-square, with a wrong law rejected), and the sentinels as
special tokens of the tokenizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from aogpt.data.fim import FIM_TEXT, SENTINELS, Sentinels, arrange, fim_rows, psm_row, sentinels_of, with_sentinels
from aogpt.data.tokenizer import ByteTokenizer
from aogpt.errors import AOGPTError

S = Sentinels.after(100)  # end 100, prefix 101, suffix 102, middle 103


def test_psm_and_spm_rows_as_written_by_hand() -> None:
    raw = torch.arange(10, 18)[None]  # m = 8 tokens: 10 .. 17
    for d, lo, hi in [(8, 0, 0), (8, 0, 8), (8, 3, 5), (8, 2, 2), (8, 8, 8), (8, 5, 8), (5, 2, 4), (1, 0, 1),
                      (3, 3, 3)]:
        pre, mid, suf = list(range(10, 10 + lo)), list(range(10 + lo, 10 + hi)), list(range(10 + hi, 10 + d))
        tail = list(range(10 + d, 18))  # the window after the document: plain text after END
        psm, spm = (arrange(raw, torch.tensor([lo]), torch.tensor([hi]), torch.tensor([mode]), S,
                            torch.tensor([d]))[0].tolist() for mode in (False, True))
        assert psm == [101, *pre, 102, *suf, 103, *mid, 100, *tail] == [*psm_row(pre, suf, S, mid, end=True), *tail]
        assert spm == [101, 102, *suf, 103, *pre, *mid, 100, *tail]
    whole = arrange(raw, torch.tensor([3]), torch.tensor([5]), torch.tensor([False]), S)  # default: all of it
    assert whole[0].tolist() == [101, 10, 11, 12, 102, 15, 16, 17, 103, 13, 14, 100]


def test_rows_not_drawn_are_returned_untouched_and_drawn_rows_hold_their_window() -> None:
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 100, (64, 20), generator=g)
    out = fim_rows(idx, 0.5, 0.5, S, torch.Generator().manual_seed(1))
    plain = (out == idx).all(1)
    assert 10 < int(plain.sum()) < 54  # both kinds occur
    for row, window in zip(out[~plain], idx[~plain], strict=True):
        assert row[0] == S.prefix and int((row == S.end).sum()) == 1
        assert sorted(row[row < 100].tolist()) == sorted(window[:20 - SENTINELS].tolist())
    assert torch.equal(fim_rows(idx, 0.0, 0.5, S, torch.Generator().manual_seed(1)), idx)  # rate 0: a GPT's batch
    assert not (fim_rows(idx, 1.0, 0.5, S, torch.Generator().manual_seed(1)) == idx).all(1).any()
    with pytest.raises(AOGPTError, match="more than 4 tokens"):
        fim_rows(idx[:, :4], 0.5, 0.5, S, g)


def _psm_cuts(row: list[int]) -> tuple[int, int, int]:
    """(D, lo, hi) read back from a PSM row: PRE prefix SUF suffix MID middle END, then plain text."""
    suf, mid, end = row.index(S.suffix), row.index(S.middle), row.index(S.end)
    return end - 3, suf - 1, suf - 1 + (end - mid - 1)


def test_documents_and_cut_points_follow_their_law_and_a_wrong_law_is_rejected() -> None:
    """The document's length D is uniform on 1..m; given D, (lo, hi) is a sorted pair of two uniform
    draws from {0..D} (P = 2/(D+1)^2 off the diagonal, 1/(D+1)^2 on it). With an empty prefix PSM and
    SPM rows are the same sequence, so SUFFIX right after PREFIX has probability spm + (1 - spm) P(lo =
    0); the other rows are PSM with lo >= 1, whose (D, lo, hi) follow the law restricted to lo >= 1.
    The FIM rate is binomial."""
    n, m, B, rate, spm_rate = 8, 4, 12000, 0.7, 0.4
    idx = torch.arange(n).expand(B, n)
    out = fim_rows(idx, rate, spm_rate, S, torch.Generator().manual_seed(3))
    fim = ~(out == idx).all(1)
    suffix_first = fim & (out[:, 1] == S.suffix)
    p_lo0 = sum(1 - (d / (d + 1)) ** 2 for d in range(1, m + 1)) / m
    assert stats.binomtest(int(fim.sum()), B, rate).pvalue > 1e-3
    assert stats.binomtest(int(suffix_first.sum()), int(fim.sum()), spm_rate + (1 - spm_rate) * p_lo0).pvalue > 1e-3
    cells = [(d, lo, hi) for d in range(1, m + 1) for lo in range(1, d + 1) for hi in range(lo, d + 1)]
    counts = dict.fromkeys(cells, 0)
    for row in out[fim & ~suffix_first].tolist():
        counts[_psm_cuts(row)] += 1
    observed = np.array([counts[c] for c in cells])
    law = np.array([(1.0 if lo == hi else 2.0) / (d + 1) ** 2 / m for d, lo, hi in cells])
    total = observed.sum()
    assert stats.chisquare(observed, law / law.sum() * total).pvalue > 1e-3
    whole = np.array([(1.0 if lo == hi else 2.0) * (d == m) for d, lo, hi in cells]) + 1e-9  # D always m
    assert stats.chisquare(observed, whole / whole.sum() * total).pvalue < 1e-6
    wrong = np.full(len(cells), 1 / len(cells))  # uniform over the cells: a plausible mistake
    assert stats.chisquare(observed, wrong * total).pvalue < 1e-6


def test_sentinels_are_special_tokens_of_the_tokenizer() -> None:
    base = ByteTokenizer()
    tok = with_sentinels(base)
    assert tok.vocab_size == 261 and tok.text_vocab_size == 257 and tok.spec == "bytes"
    assert tok.sentinels == Sentinels(257, 258, 259, 260) and tok.padded_vocab_size == 320
    assert tok.encode("a<|fim_prefix|>b") == base.encode("a<|fim_prefix|>b")  # text never becomes a sentinel
    assert tok.decode([104, 258, 105, 257, 256]) == f"h{FIM_TEXT[1]}i{FIM_TEXT[0]}<|endoftext|>"
    lengths = tok.byte_lengths()
    assert lengths.shape == (261,) and lengths[257:].tolist() == [0] * 4 and lengths[:256].tolist() == [1] * 256
    assert with_sentinels(tok).sentinels == tok.sentinels  # wrapping twice changes nothing


def test_a_model_config_records_the_sentinels() -> None:
    from aogpt.config import model_config

    cfg = model_config("gpt", n_layer=1, n_head=1, n_embd=8, block_size=16, vocab_size=320,
                       fim_tokens=[257, 258, 259, 260])
    assert sentinels_of(cfg) == Sentinels(257, 258, 259, 260)
    assert sentinels_of(model_config("gpt", n_layer=1, n_head=1, n_embd=8, block_size=16, vocab_size=320)) is None
    with pytest.raises(AOGPTError, match="variant aogpt reads in other orders"):
        model_config("aogpt", n_layer=1, n_head=1, n_embd=8, block_size=16, vocab_size=320,
                     fim_tokens=[257, 258, 259, 260])
    with pytest.raises(AOGPTError, match="4 distinct ids below the vocabulary size 258"):
        model_config("gpt", n_layer=1, n_head=1, n_embd=8, block_size=16, vocab_size=258,
                     fim_tokens=[257, 258, 259, 260])
