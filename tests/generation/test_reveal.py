"""`generate(on_step=...)`: each step's revealed positions, for every sampler, against the result."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aogpt.generation.generate import generate, infill
from tests.helpers import random_model

CASES = [
    ("aogpt", {}),  # Lemma 4.1, one position per step on average
    ("aogpt", {"steps": 3, "policy": "count", "order": "l2r"}),
    ("aogpt", {"speculative": 3}),
    ("aogpt", {"speculative": "auto"}),
    ("aogpt", {"order": "confidence", "steps": 4}),
    ("sigma", {"order": "margin", "candidates": 2}),
    ("encoder-mdm", {"steps": 4}),
    ("encoder-mdm", {"order": "entropy"}),
]


@pytest.mark.parametrize(("variant", "kw"), CASES)
def test_reveals_rebuild_the_result(variant, kw):
    model = random_model(variant, n=8)
    events = []
    res = infill(model, [3, None, None, 5, None, None, None, None], num_samples=3, seed=4, on_step=events.append,
                 batch_size=2, **kw)
    plain = infill(model, [3, None, None, 5, None, None, None, None], num_samples=3, seed=4, batch_size=2, **kw)
    assert torch.equal(res.tokens, plain.tokens), "watching must not change what is sampled"
    for b in range(3):
        groups = [e.positions[e.samples == b] for e in events]
        tokens = [e.tokens[e.samples == b] for e in events]
        revealed = np.concatenate(groups)
        assert sorted(revealed.tolist()) == [1, 2, 4, 5, 6, 7], "every masked position exactly once"
        assert torch.equal(torch.from_numpy(np.concatenate(tokens)), res.tokens[b, torch.from_numpy(revealed)])
        # the steps' sets, in order, are the chain order cut by the step counts
        counts = res.step_counts[b][res.step_counts[b] > 0].tolist()
        chain = res.orders[b, 2:].tolist()
        cuts = np.cumsum([0, *counts])
        expected = [sorted(chain[a:c]) for a, c in zip(cuts[:-1], cuts[1:], strict=True)]
        assert [sorted(g.tolist()) for g in groups if len(g)] == expected


def test_steps_count_from_one_per_batch_and_samples_are_global():
    model = random_model("aogpt", n=6)
    events = []
    generate(model, num_samples=3, length=6, steps=6, policy="count", seed=0, batch_size=2, on_step=events.append)
    assert [e.step for e in events] == [1, 2, 3, 4, 5, 6] * 2
    assert {int(s) for e in events[:6] for s in e.samples} == {0, 1}
    assert {int(s) for e in events[6:] for s in e.samples} == {2}
