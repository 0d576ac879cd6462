"""Validation: the per-batch losses behind the means, and the loss in a run's own fixed order."""

from __future__ import annotations

import pytest
import torch

from tests.train.runs import make


@pytest.mark.parametrize("order, own", [("fixed-random:2", True), ("blockwise:4", True), ("mixture", False),
                                        ("l2r", False), ("mallows:1", False)])
def test_own_order_loss_only_for_fixed_orders(tmp_path, order, own):
    t = make(None, order=order, max_steps=1)
    results = t.evaluate()
    assert ("val/own/raw" in results) == own and ("val/own/ema" in results) == own
    assert {"val/l2r/raw", "val/any/raw", "val/l2r/ema", "val/any/ema"} <= set(results)
    if own:  # the own-order loss is the exact NLL of the fixed order, recomputed here by hand
        model = t.raw.eval()
        total = tokens = 0.0
        for idx in t.data.iter_eval_batches("val", t.cfg.batch_size, t.block_size, t.cfg.eval_batches):
            sigma = t.order_sampler.sample(idx.shape[0], idx.shape[1])
            with torch.no_grad():
                total += model(idx, sigma)[1].double().sum().item()
            tokens += idx.numel()
        assert results["val/own/raw"] == pytest.approx(total / tokens, rel=1e-5)


def test_per_batch_losses_average_to_the_reported_means():
    t = make(None, max_steps=1, eval_batches=3)
    results = t.evaluate()
    assert set(t.validation.per_batch) == set(results)
    for key, values in t.validation.per_batch.items():
        assert len(values) == 3  # equal-size batches: the plain mean is the token-weighted mean
        assert sum(values) / 3 == pytest.approx(results[key], rel=1e-9)
