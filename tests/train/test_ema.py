"""EMA update against a hand computation."""

from __future__ import annotations

import torch

from aogpt.train.ema import EMA


def test_ema_update_matches_formula_with_warmup():
    model = torch.nn.Linear(3, 2)
    ema = EMA(model, decay=0.9, warmup=True)
    expected = [p.detach().clone() for p in model.parameters()]
    for u in range(30):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        d = min(0.9, (1 + u) / (10 + u))
        expected = [d * e + (1 - d) * p.detach() for e, p in zip(expected, model.parameters(), strict=True)]
        ema.update(model)
    for e, p in zip(expected, ema.model.parameters(), strict=True):
        torch.testing.assert_close(p, e, rtol=1e-6, atol=1e-6)
    assert ema.num_updates == 30 and ema.current_decay() == 31 / 40


def test_ema_without_warmup_and_frozen_copy():
    model = torch.nn.Linear(2, 2)
    ema = EMA(model, decay=0.5, warmup=False)
    before = [p.detach().clone() for p in ema.model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update(model)
    for b, p in zip(before, ema.model.parameters(), strict=True):
        torch.testing.assert_close(p, b + 0.5)
        assert not p.requires_grad
