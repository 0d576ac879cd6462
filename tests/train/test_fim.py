"""Training a fill-in-the-middle GPT: the rows it is not asked to rearrange are the plain GPT's rows and
are scored as a GPT scores them, its validation is left to right on untouched text, a stopped run
resumes exactly (the FIM draws included), and planning adds the sentinels or refuses."""

from __future__ import annotations

import pytest
import torch

from aogpt.checkpoint import list_checkpoints
from aogpt.config import model_config, train_config
from aogpt.data.fim import SENTINELS, Sentinels
from aogpt.errors import AOGPTError
from aogpt.train import RandomTokens, Trainer, plan
from tests.train.runs import records, stop_after

TEXT = 36  # random token ids 0..35; the sentinels are 36..39


def make(out, fim_rate: float = 0.5, seed: int = 1337, **train_over) -> Trainer:
    fim = {"fim_tokens": Sentinels.after(TEXT).to_list()} if fim_rate > 0 else {}
    mc = model_config("gpt", preset="tiny", vocab_size=40, **fim)
    tc = train_config("tiny", "gpt", **{"max_steps": 12, "eval_interval": 6, "ckpt_interval": 6, "log_interval": 2,
                                        "keep_last": 5, "fim_rate": fim_rate, "seed": seed, "dtype": "float32",
                                        **train_over})
    return Trainer(mc, tc, RandomTokens(TEXT), out, show_progress=False)


def test_plain_rows_are_the_gpts_rows_and_are_scored_as_a_gpt_scores_them() -> None:
    fim, gpt = make(None), make(None, fim_rate=0.0)
    for _ in range(3):  # the same windows, step after step: FIM draws come from their own stream
        rows, _ = fim._global_batch()
        plain, _ = gpt._global_batch()
        untouched = (rows == plain).all(1)
        assert 0 < int(untouched.sum()) < rows.shape[0]
        assert (rows[~untouched, 0] == TEXT + 1).all() and ((rows[~untouched] == TEXT).sum(1) == 1).all()
        fim.step += 1
        gpt.step += 1
    model = fim.raw.eval()
    with torch.no_grad():  # one pass over the mixed batch gives each plain row its GPT loss, as if alone
        mixed = model(rows)[1]
        alone = model(rows[untouched])[1]
    torch.testing.assert_close(mixed[untouched], alone, rtol=0, atol=1e-6)
    assert int(rows[untouched].max()) < TEXT


def test_validation_reads_untouched_text_left_to_right() -> None:
    t = make(None)
    got = t.evaluate()
    assert set(got) == {"val/l2r/raw", "val/l2r/ema"}  # a GPT: no any-order loss
    model = t.raw.eval()
    with torch.no_grad():
        losses = [model(idx)[1].double().sum() for idx in t.data.iter_eval_batches("val", 8, 32, 2)]
        tokens = sum(idx.numel() for idx in t.data.iter_eval_batches("val", 8, 32, 2))
    assert got["val/l2r/raw"] == pytest.approx(float(sum(losses)) / tokens, rel=1e-5)


def test_a_stopped_fim_run_resumes_exactly(tmp_path) -> None:
    (tmp_path / "full").mkdir()
    full = make(tmp_path / "full").fit()
    (tmp_path / "cut").mkdir()
    first = make(tmp_path / "cut")
    stop_after(first, 6)
    assert first.fit()["stopped_by"] == "SIGTERM"
    second = make(tmp_path / "cut")
    second.resume(list_checkpoints(tmp_path / "cut")[-1])
    cut = second.fit()
    assert records(tmp_path / "cut") == records(tmp_path / "full")
    assert cut["train_loss"] == full["train_loss"] and cut["val/l2r/ema"] == full["val/l2r/ema"]
    other = make(tmp_path / "other", seed=7)  # the check can fail: another FIM stream gives other rows
    assert not torch.equal(other._global_batch()[0], make(None, seed=7, fim_rate=0.0)._global_batch()[0])


def test_planning_adds_the_sentinels_or_refuses(tmp_path, bytes_data) -> None:
    p = plan(tmp_path / "r", data=bytes_data, preset="tiny", variant="gpt", fim_rate=0.5, dry_run=True)
    assert p.model_cfg.fim_tokens == [257, 258, 259, 260] and p.model_cfg.vocab_size == 320
    plain = plan(tmp_path / "r", data=bytes_data, preset="tiny", variant="gpt", dry_run=True)
    assert plain.model_cfg.fim_tokens is None
    with pytest.raises(AOGPTError, match="variant aogpt reads other orders"):
        plan(tmp_path / "r", data=bytes_data, preset="tiny", variant="aogpt", fim_rate=0.5, dry_run=True)
    with pytest.raises(AOGPTError, match=f"{257 + SENTINELS} tokens with the fill-in-the-middle sentinels"):
        plan(tmp_path / "r", data=bytes_data, preset="tiny", variant="gpt", fim_rate=0.5, vocab_size=258,
             dry_run=True)
