"""The plan's Lemma 4.1 counts: read from each sequence's stream in blocks, they are the draws of the
literal step-by-step definition (`aogpt.schedules.bernoulli_counts` with one stream call per step)."""

from __future__ import annotations

import numpy as np
import pytest

from aogpt.generation.plan import step_counts
from aogpt.generation.streams import SequenceStreams
from aogpt.schedules import bernoulli_counts, unmask_probabilities


def literal(masked: int, steps: int, schedule: str, streams: SequenceStreams, batch: int) -> np.ndarray:
    left = np.full(batch, masked, dtype=np.int64)
    out = np.zeros((batch, steps), dtype=np.int64)
    for t, p in enumerate(unmask_probabilities(steps, schedule)):
        out[:, t] = bernoulli_counts(left, p, lambda seqs: streams.uniforms(seqs, "plan"))
        left -= out[:, t]
    return out


@pytest.mark.parametrize("batch, masked, steps, schedule", [(1, 96, 96, "linear"), (16, 40, 40, "linear"),
                                                            (3, 50, 7, "cosine"), (5, 6, 30, "linear"),
                                                            (2, 1, 1, "linear"), (4, 300, 300, "cosine")])
def test_bernoulli_counts_are_the_step_by_step_draws(batch, masked, steps, schedule):
    for seed in range(3):
        fast, slow = SequenceStreams(seed, 5, batch), SequenceStreams(seed, 5, batch)
        got = step_counts("bernoulli", schedule, steps, masked, batch, fast)
        want = literal(masked, steps, schedule, slow, batch)
        assert np.array_equal(got, want)
        assert (got.sum(axis=1) == masked).all()
        # the stream is left where the literal draws leave it: later draws (adaptive candidates) agree
        assert np.array_equal(fast.uniforms(np.arange(batch), "plan"), slow.uniforms(np.arange(batch), "plan"))


def test_the_block_read_ahead_is_not_taken():
    s = SequenceStreams(7, 0, 2)
    ahead = s.ahead("plan", 5)
    assert ahead.shape == (2, 5) and ((0 <= ahead) & (ahead < 1)).all()
    assert np.array_equal(s.ahead("plan", 5), ahead)  # reading ahead takes nothing
    s.advance("plan", np.array([2, 0]))
    assert np.array_equal(s.uniforms(np.array([0, 1]), "plan"), [ahead[0, 2], ahead[1, 0]])
