"""`aogpt.bench.training.recipe`: candidates, equal text for every candidate, a short sweep scored in bits per byte."""

from __future__ import annotations

import math

import pytest
import torch

from aogpt.bench.training import recipe as br
from aogpt.errors import AOGPTError

TINY = "tiny:tokenizer=bytes,n_layer=1,n_embd=16,n_head=2,target_dim=8,block_size=16,batch_size=2,lr=0.003"


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipe-data")
    br.data_for("bytes", root)  # Shakespeare, bytes: prepared once (offline)
    return root


def test_candidates_are_parsed_and_split_into_model_and_train_fields():
    c = br.parse_candidate(TINY)
    assert c.name == "tiny" and c.tokenizer == "bytes" and c.fields["lr"] == 0.003
    mc, tc = c.configs(vocab_size=320, max_steps=7, seed=3)
    assert (mc.n_layer, mc.n_embd, mc.block_size, mc.vocab_size, mc.variant) == (1, 16, 16, 320, "aogpt")
    assert (tc.batch_size, tc.lr, tc.max_steps, tc.seed) == (2, 0.003, 7, 3)
    assert tc.warmup_steps == br.train_config(br.BASE_PRESET, "aogpt").warmup_steps  # the rest from the preset
    registered = br.parse_candidate(next(iter(br.CANDIDATES)))
    assert registered.fields == br.CANDIDATES[registered.name]
    based = br.parse_candidate(f"{registered.name}:lr=0.01")
    assert based.fields == {**br.CANDIDATES[registered.name], "lr": 0.01}
    with pytest.raises(AOGPTError, match="unknown candidate"):
        br.parse_candidate("no-such-recipe")
    with pytest.raises(AOGPTError, match="key=value"):
        br.parse_candidate("x:lr")
    with pytest.raises(AOGPTError, match="unknown key"):
        br.parse_candidate("x:not_a_field=3").configs(320, 1, 0)


def test_every_candidate_is_scored_on_the_same_text(data_root):
    data = br.data_for("bytes", data_root)
    lengths = data.token_byte_lengths()
    for block in (16, 50):
        windows = br.eval_windows(data, block, 1000)
        covered = lengths[windows].sum(1).cumsum(0)
        assert covered[-1] >= 1000 > covered[-2]  # the fewest windows that cover the first 1000 bytes
        assert torch.equal(windows.flatten(), torch.from_numpy(data.split("val")[: windows.numel()].astype("int64")))
    assert br.eval_windows(data, 64, None).shape[0] == data.num_tokens("val") // 64


def test_a_short_sweep_scores_in_bits_per_byte(data_root, tmp_path):
    res = br.sweep([br.parse_candidate(TINY)], data_root, steps=3, eval_bytes=600, out=tmp_path, speedup=1.5,
                   minutes=1)
    row = res["rows"][0]
    assert row["steps"] == 3 and row["tokens"] == 3 * 2 * 16 and row["cpu_seconds"] > 0
    assert row["eval_bytes"] >= 600 and row["eval_tokens"] == row["eval_bytes"]  # bytes: one byte a token
    for key in ("l2r_ema", "l2r_raw", "any_ema"):
        assert row[key]["bpb"] == pytest.approx(row[key]["nll"] / math.log(2))
    assert row["steps_in_budget"] == int(60 * 1.5 / row["cpu_seconds_per_step"])
    table = (tmp_path / "recipe.md").read_text()
    assert "| tiny | bytes | 1/16/2 | 16 | 2 |" in table and "quiet machine" in table


def test_a_cpu_budget_buys_steps(data_root, monkeypatch):
    monkeypatch.setattr(br, "cpu_seconds_per_step", lambda candidate, data, seed: 0.5)
    row = br.run_candidate(br.parse_candidate(TINY), data_root, cpu_budget=2.2, eval_bytes=100)
    assert row["steps"] == 4
    with pytest.raises(AOGPTError, match="not both"):
        br.run_candidate(br.parse_candidate(TINY), data_root, steps=2, cpu_budget=1.0)


@pytest.mark.slow
def test_seeds_run_side_by_side_with_curves_diagnostics_and_intervals(data_root, tmp_path):
    """Two seeds in two processes at once: a row each, curves every 2 steps with the target pathway's
    diagnostics, the unigram level, one table row with 95% intervals over the seeds, and the PNG."""
    res = br.sweep([br.parse_candidate(TINY)], data_root, steps=4, eval_bytes=300, seeds=2, jobs=2, curve_every=2,
                   diagnose=True, seed=5, out=tmp_path)
    assert sorted(r["seed"] for r in res["rows"]) == [5, 6]
    for row in res["rows"]:
        assert [p["step"] for p in row["curve"]] == [2, 4] and row["unigram_bpb"] > 0
        last = row["curve"][-1]
        assert last["any"] == pytest.approx(row["any_ema"]["bpb"])
        assert last["l2r"] == pytest.approx(row["l2r_ema"]["bpb"])
        assert {"gate_attn", "shift_attn/target", "grad/target_table", "grad/all", "lift/L0", "lift/max"} <= set(last)
    a, b = (r["any_ema"]["bpb"] for r in res["rows"])
    assert a != b  # different seeds, different runs
    table = (tmp_path / "recipe.md").read_text()
    assert "| tiny | bytes | 1/16/2 | 16 | 2 |" in table and f"{(a + b) / 2:.3f} [" in table
    assert "unigram level of the scored text" in table and (tmp_path / "recipe.png").stat().st_size > 10_000


def test_registered_candidates_of_the_any_order_sweep_build():
    for name in ("ramp", "slow-ramp+open-gates+lr10", "batch-32x64", "uniform-start", "l2r-share-0.25"):
        mc, tc = br.parse_candidate(name).configs(512, 1000, 0)
        assert tc.lr == 3e-3 and mc.n_embd == 192  # the quickstart recipe as it was, one remedy changed
    assert br.parse_candidate("batch-32x64").configs(512, 10, 0)[0].block_size == 64
