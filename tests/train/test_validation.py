"""Validation: nats per token and bits per byte checked against direct computations, the per-batch
losses behind the means, and the loss in a run's own fixed order."""

from __future__ import annotations

import math

import pytest
import torch

from aogpt.config import model_config, train_config
from aogpt.data import PreparedData
from aogpt.data.tokenizer import EOT_TEXT
from aogpt.train import RandomTokens, Trainer
from aogpt.train.step import autocast
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


def test_bits_per_byte_equal_a_direct_computation(bytes_data) -> None:
    """Left-to-right bits per byte = (summed NLL of the validation windows, from plain forwards) / ln 2 /
    (UTF-8 bytes of their decoded text); the any-order figure uses the same bytes."""
    data = PreparedData(bytes_data)
    mc = model_config("aogpt", preset="tiny", vocab_size=data.padded_vocab_size)
    tc = train_config("tiny", "aogpt", eval_batches=3, batch_size=4)
    trainer = Trainer(mc, tc, data, None, show_progress=False)
    for _ in range(3):
        trainer.train_step()
    got = trainer.evaluate()
    nats = tokens = num_bytes = 0
    model = trainer.raw.eval()
    with torch.no_grad(), autocast(trainer.device, trainer.amp):  # the precision validation ran in
        for idx in data.iter_eval_batches("val", tc.batch_size, mc.block_size, tc.eval_batches):
            nats += float(model(idx)[1].double().sum())
            tokens += idx.numel()
            for row in idx:
                num_bytes += len(data.tokenizer.decode(row).replace(EOT_TEXT, "").encode("utf-8"))
    assert got["val/l2r/raw"] == pytest.approx(nats / tokens, rel=1e-5)
    assert got["bpb/l2r/raw"] == pytest.approx(nats / math.log(2) / num_bytes, rel=1e-5)
    assert got["bpb/any/ema"] == pytest.approx(got["val/any/ema"] * tokens / num_bytes / math.log(2), rel=1e-9)
    assert set(got) == {f"{m}/{k}/{w}" for m in ("val", "bpb") for k in ("l2r", "any") for w in ("raw", "ema")}


def test_random_tokens_have_no_bytes() -> None:
    mc = model_config("gpt", preset="tiny", vocab_size=24)
    trainer = Trainer(mc, train_config("tiny", "gpt", eval_batches=1), RandomTokens(24), None, show_progress=False)
    assert set(trainer.evaluate()) == {"val/l2r/raw", "val/l2r/ema"}


def test_coverage_counts_the_tokens_scored_and_the_whole_split(bytes_data) -> None:
    """`coverage` says how much of the held-out text the last validation read: the first `eval_batches`
    batches, or all of it when they reach past its end (then both counts are the split's whole windows)."""
    data = PreparedData(bytes_data)
    mc = model_config("aogpt", preset="tiny", vocab_size=data.padded_vocab_size)
    windows = sum(len(shard) // mc.block_size for shard in data.shards("val")) * mc.block_size
    for batches, scored in ((3, 3 * 4 * mc.block_size), (10**6, windows)):
        trainer = Trainer(mc, train_config("tiny", "aogpt", eval_batches=batches, batch_size=4), data, None,
                          show_progress=False)
        trainer.evaluate()
        direct = sum(idx.numel() for idx in data.iter_eval_batches("val", 4, mc.block_size, batches))
        assert trainer.validation.coverage() == {"val_tokens": scored, "val_batches": batches,
                                                 "val_split_tokens": windows} and direct == scored
