"""A fill-in-the-middle GPT's infill likelihood against independent computations: token-by-token forwards
of the PSM / SPM row, and, on a tiny vocabulary, the law over every possible fill enumerated (it sums to
one; over spans of one length the span tokens alone sum to one, span and end to that length's probability)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from aogpt.config import model_config
from aogpt.data.fim import Sentinels, arrange
from aogpt.errors import AOGPTError
from aogpt.evaluation.infill import FIM_ROW, fim_span_nll, make_cuts, score_cuts, span_nll, summarize
from aogpt.model import Transformer
from tests.helpers import prefix_conditional, random_model

C = 2
TEXT = 3  # text ids 0, 1, 2; the sentinels follow: end 3, prefix 4, suffix 5, middle 6
S = Sentinels.after(TEXT)


def fim_model(n: int, seed: int = 0, scale: float = 0.6, text: int = TEXT) -> Transformer:
    """A float64 GPT with every weight random and the four sentinels after `text` ids."""
    torch.manual_seed(seed)
    cfg = model_config("gpt", n_layer=2, n_head=2, n_embd=16, block_size=n, vocab_size=text + 4,
                       fim_tokens=Sentinels.after(text).to_list())
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, scale)
    return model.double().eval().requires_grad_(False)


def separately(model: Transformer, row: list[int], first: int, count: int) -> float:
    """Sum of -log p(row[i] | row[:i]) for i in first .. first + count - 1, one forward each."""
    x = torch.tensor([row])
    order = list(range(len(row)))
    return sum(prefix_conditional(model, x, order, i) for i in range(first, first + count))


@pytest.mark.parametrize("mode", ["psm", "spm"])
def test_span_and_end_are_sums_of_separately_computed_conditionals(mode: str) -> None:
    L = 3
    model = fim_model(2 * C + L + 4, seed=1)
    x = torch.randint(0, TEXT, (4, 2 * C + L), generator=torch.Generator().manual_seed(2))
    span, end = fim_span_nll(model, x, C, L, mode)
    for b in range(4):
        p, m, s = x[b, :C].tolist(), x[b, C:C + L].tolist(), x[b, C + L:].tolist()
        row = [S.prefix, *p, S.suffix, *s, S.middle, *m, S.end] if mode == "psm" else \
            [S.prefix, S.suffix, *s, S.middle, *p, *m, S.end]
        first = row.index(S.middle) + (1 if mode == "psm" else 1 + C)
        assert float(span[b]) == pytest.approx(separately(model, row, first, L), abs=1e-10)
        assert float(end[b]) == pytest.approx(separately(model, row, first + L, 1), abs=1e-10)
    assert not torch.allclose(span, fim_span_nll(model, x.flip(1), C, L, mode)[0])  # the check can fail


def _fills(model: Transformer, prefix: list[int], suffix: list[int], length: int, alphabet: list[int]
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(span NLL, end NLL) of every fill of `length` tokens from `alphabet` (one window each)."""
    spans = list(itertools.product(alphabet, repeat=length))
    x = torch.tensor([[*prefix, *s, *suffix] for s in spans], dtype=torch.long).reshape(len(spans), -1)
    return fim_span_nll(model, x, C, length)


def test_the_law_over_every_possible_fill_sums_to_one_on_a_tiny_vocabulary() -> None:
    """A fill is any sequence of non-END ids closed by END. Over fills of 0, 1, 2 tokens plus the mass of
    never closing within 2 (every 3-token run without END), the one-pass probabilities sum to 1. Over the
    fills of one length L alone, the span tokens' chain sums to 1 (all V^L spans) and span + end to the
    probability that the gap has L tokens, which the model's END decisions give independently."""
    Lmax, n = 2, 2 * C + 3 + 4
    model = fim_model(n, seed=3)
    prefix, suffix = [2, 0], [1, 1]
    alphabet = [i for i in range(TEXT + 4) if i != S.end]  # the model may write any id inside a middle
    total = 0.0
    for length in range(Lmax + 1):
        span, end = _fills(model, prefix, suffix, length, alphabet)
        total += float(torch.exp(-(span + end)).sum())
    tail, _ = _fills(model, prefix, suffix, Lmax + 1, alphabet)
    total += float(torch.exp(-tail).sum())
    assert total == pytest.approx(1.0, abs=1e-10)
    every = list(range(TEXT + 4))
    span, end = _fills(model, prefix, suffix, 2, every)  # all V^2 spans: the span tokens' chain alone
    assert float(torch.exp(-span).sum()) == pytest.approx(1.0, abs=1e-10)
    span, end = _fills(model, prefix, suffix, 2, alphabet)
    length_two = float(torch.exp(-(span + end)).sum())
    # P(the gap has 2 tokens) from the END decisions: not END, not END, END, summed over the two tokens
    row = [S.prefix, *prefix, S.suffix, *suffix, S.middle]
    p_len2 = 0.0
    for a, b in itertools.product(alphabet, repeat=2):
        seq = [*row, a, b, S.end]
        p_len2 += math.exp(-separately(model, seq, len(row), 3))
    assert length_two == pytest.approx(p_len2, abs=1e-10) and length_two < 1.0 - 1e-3


def test_score_cuts_gives_a_fim_gpt_its_prefix_and_both_sides_rows() -> None:
    L, n = 3, 2 * C + 3 + 4
    model = fim_model(n, seed=4)
    text = np.random.default_rng(0).integers(0, TEXT, 200)
    cuts = make_cuts(text, L, num_cuts=10, context=C, seed=1)
    s = score_cuts(model, cuts, byte_lengths=torch.ones(TEXT + 4, dtype=torch.long), batch_size=4)
    assert set(s.nll) == {"prefix/l2r", FIM_ROW}
    span, end = fim_span_nll(model, cuts.windows, C, L)
    np.testing.assert_allclose(s.nll[FIM_ROW], (span + end).numpy(), atol=1e-10)
    np.testing.assert_allclose(s.end_nll, end.numpy(), atol=1e-10)
    np.testing.assert_allclose(s.nll["prefix/l2r"], span_nll(model, cuts.windows, C, L, sides="prefix").numpy())
    with pytest.raises(AOGPTError, match=r"11 tokens \(the window and 4 fill-in-the-middle sentinels\)"):
        score_cuts(fim_model(n - 1), cuts)
    with pytest.raises(AOGPTError, match="not trained to fill in the middle"):
        fim_span_nll(random_model("gpt", n=n, vocab=TEXT + 4), cuts.windows, C, L)


def test_gaps_pair_every_model_with_the_any_order_model_or_else_the_fim_model() -> None:
    L, n = 3, 2 * C + 3 + 4
    text = np.random.default_rng(1).integers(0, TEXT, 300)
    cuts = make_cuts(text, L, num_cuts=12, context=C, seed=2)
    ones = torch.ones(TEXT + 4, dtype=torch.long)
    ao = score_cuts(random_model("aogpt", n=n, vocab=TEXT + 4, seed=5), cuts, byte_lengths=ones, num_orders=2)
    fim = score_cuts(fim_model(n, seed=6), cuts, byte_lengths=ones)
    gpt = score_cuts(random_model("gpt", n=n, vocab=TEXT + 4, seed=7), cuts, byte_lengths=ones)
    rows = summarize({"ao": ao, "fim": fim, "gpt": gpt})
    gap = {(r["model"], r["row"]): r["gap_vs_both"] for r in rows if "gap_vs_both" in r}
    assert set(gap) == {("ao", "prefix/l2r"), ("fim", "prefix/l2r"), ("fim", FIM_ROW), ("gpt", "prefix/l2r")}
    direct = np.mean(np.array(fim.nll[FIM_ROW]) - np.array(ao.nll["both/best"])) / L / math.log(2)
    assert gap[("fim", FIM_ROW)]["bpb"] == pytest.approx(direct, abs=1e-10)
    end_row = next(r for r in rows if r["row"] == FIM_ROW)
    assert end_row["end_bpb"] == pytest.approx(np.mean(fim.end_nll) / L / math.log(2), abs=1e-10)
    alone = summarize({"fim": fim, "gpt": gpt})  # no any-order model: gaps against the FIM model
    assert {(r["model"], r["row"]) for r in alone if "gap_vs_both" in r} == {("fim", "prefix/l2r"),
                                                                            ("gpt", "prefix/l2r")}


def test_arrange_for_scoring_and_for_training_is_the_same_function() -> None:
    """The rows scored are built by the training transformation itself, at the eval's cut."""
    x = torch.tensor([[0, 1, 2, 0, 1, 2, 0]])
    row = arrange(x, torch.tensor([C]), torch.tensor([C + 3]), torch.tensor([False]), S)[0].tolist()
    assert row == [S.prefix, 0, 1, S.suffix, 2, 0, S.middle, 2, 0, 1, S.end]
