"""`aogpt bench adapt`'s report: the paired differences and the targets, against an independent computation."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from aogpt.bench.training.adapt_report import summary, to_markdown


def _rows(rng: np.random.Generator) -> list[dict]:
    rows = []
    for seed in range(3):
        src = 2.5 + rng.normal(0, 0.05)
        rows.append({"seed": seed, "source": {"l2r": src, "steps": 10, "cpu_seconds": 1.0},
                     "adapted_start": {"l2r": src, "any": 4.4 + rng.normal(0, 0.05)},
                     "scratch/F5": {"l2r": 2.9 + rng.normal(0, 0.05), "any": 3.8 + rng.normal(0, 0.005), "steps": 5,
                                    "cpu_seconds": 1.0},
                     "scratch-sf/F5": {"l2r": 2.7 + rng.normal(0, 0.05), "any": 3.15 + rng.normal(0, 0.005),
                                       "steps": 15, "cpu_seconds": 2.0},
                     "recipe/F5": {"l2r": src + 0.01 + rng.normal(0, 0.002), "any": 3.1 + rng.normal(0, 0.005)
                                   + (0.12 if seed == 2 else 0.0), "steps": 5, "cpu_seconds": 1.0}})
    return rows


def test_the_paired_differences_and_the_targets():
    rows = _rows(np.random.default_rng(0))
    result = {"rows": rows, "finetune": [5], "candidates": ["recipe"], "steps": 10, "eval_bytes": 100,
              "tokenizer": "bpe:512", "preset": "quickstart", "threads": 1, "unigram": 3.6,
              "environment": {"device": "cpu", "threads": 1, "torch": "x"}}
    s = summary(result)
    for ref in ("scratch", "scratch-sf"):  # independently: Student's t over the paired differences
        diff = np.array([r["recipe/F5"]["any"] - r[f"{ref}/F5"]["any"] for r in rows])
        half = stats.t.ppf(0.975, 2) * diff.std(ddof=1) / np.sqrt(3)
        got = s[f"F5/recipe-{ref}/any"]
        assert got["mean"] == pytest.approx(diff.mean()) and got["high"] == pytest.approx(diff.mean() + half)
    l2r = np.array([r["recipe/F5"]["l2r"] - r["source"]["l2r"] for r in rows])
    assert s["F5/recipe-source/l2r"]["mean"] == pytest.approx(l2r.mean())
    # off the plateau (3.6 - 0.4 = 3.2): seeds 0 and 1 of the recipe, every seed of both scratch paths
    assert s["F5/recipe/off"] == {"seeds": 2, "n": 3} and s["F5/scratch/off"] == {"seeds": 0, "n": 3}
    assert s["F5/scratch-sf/off"] == {"seeds": 3, "n": 3}
    result["summary"] = s
    table = to_markdown(result)
    # left to right kept (+0.01 of 0.03); random below scratch at F by its whole interval; against scratch at
    # S + F by its mean only (the third seed is 0.07 worse, the others 0.05 better)
    assert "| recipe | yes | yes | mean only | 2/3 |" in table
    assert "AO-GPT from scratch (10 + 5 steps) | 15/15/15 |" in table


def test_a_scratch_family_branch_is_the_run_budgeted_for_it(tmp_path):
    """AO-GPT from scratch for 10 and 12 steps, their start fitted to 10, trained as one trunk with the decays
    branched off: each gives, score for score, the run budgeted for its own steps; the trunk is trained once,
    to the last decay's start, and a path under way resumes exactly from its checkpoint."""
    from aogpt.bench.training.adapt import Study, _train

    said: list[str] = []
    study = Study(tmp_path / "data", tmp_path / "work", 0, 5, eval_bytes=600, curve_every=3, width=64,
                  save_every=3, progress=said.append, tokenizer="bytes")
    long = study.scratch_family(12, (10, 12))
    short = study.scratch_family(10, (10, 12))
    assert (long["branched_at"], short["branched_at"]) == (10, 8)
    assert sum("scratch trunk" in line and "step 9/12" in line for line in said) == 1  # the trunk, once
    for n, got in ((10, short), (12, long)):
        mc, cfg = study._scratch_configs(n, 10)
        direct = _train(mc, cfg, study.data, study.windows, 0, 3, "direct", None, tmp_path / f"direct{n}", 0)[1]
        assert (got["l2r"], got["any"]) == (direct["l2r"], direct["any"]) and got["steps"] == n
        assert [p["step"] for p in got["curve"]] == [p["step"] for p in direct["curve"]]
        assert [p["any"] for p in got["curve"]] == [p["any"] for p in direct["curve"]]
    # interrupted at step 7 (checkpointed at 6), a run resumes and ends as the uninterrupted one
    mc, cfg = study._scratch_configs(10, 10)
    _train(mc, cfg, study.data, study.windows, 0, 3, "cut", None, tmp_path / "cut", 3, stop_at=7)
    resumed = _train(mc, cfg, study.data, study.windows, 0, 3, "cut", None, tmp_path / "cut", 3)[1]
    assert (resumed["l2r"], resumed["any"]) == (short["l2r"], short["any"])


def test_the_gated_table_pairs_infilling_with_the_source_by_seed():
    from aogpt.bench.training.adapt_report import gated_table

    rng = np.random.default_rng(1)
    rows = _rows(rng)
    for r in rows:
        r["source"]["infill"] = {"prefix/l2r": 2.4 + rng.normal(0, 0.05)}
        r["gated-r8/F5"] = {"l2r": r["source"]["l2r"], "any": 3.0 + rng.normal(0, 0.01), "steps": 5,
                            "cpu_seconds": 2.0, "trainable_parameters": 1234,
                            "infill": {"both/l2r": 2.2 + rng.normal(0, 0.02)}}
    result = {"rows": rows, "finetune": [5], "candidates": ["recipe", "gated-r8"], "steps": 10, "eval_bytes": 100,
              "tokenizer": "bpe:512", "preset": "quickstart", "threads": 1, "unigram": 3.6,
              "environment": {"device": "cpu", "threads": 1, "torch": "x"}}
    result["summary"] = summary(result)
    gap = np.array([r["gated-r8/F5"]["infill"]["both/l2r"] - r["source"]["infill"]["prefix/l2r"] for r in rows])
    got = result["summary"]["F5/gated-r8-source/infill/both/l2r"]
    half = stats.t.ppf(0.975, 2) * gap.std(ddof=1) / np.sqrt(3)
    assert got["mean"] == pytest.approx(gap.mean()) and got["low"] == pytest.approx(gap.mean() - half)
    assert result["summary"]["F5/gated-r8-source/l2r"]["mean"] == 0.0
    text = "\n".join(gated_table(result))
    assert "adapted + gated-r8" in text and "1,234" in text and "400" in text  # 2 CPU s / 5 steps
    assert "## The gated pathway" in to_markdown(result)


def test_a_gated_family_branch_is_the_run_budgeted_for_it_and_the_source_left_to_right(tmp_path):
    from aogpt.bench.training.adapt import Study, _train

    study = Study(tmp_path / "data", tmp_path / "work", 0, 5, eval_bytes=600, curve_every=0, width=64,
                  save_every=0, tokenizer="bytes")
    source = study.source()
    got = study.candidate("gated-r8", 10, (10, 12))
    assert got["branched_at"] == 8 and got["l2r"] == source["l2r"]  # left to right: the source, exactly
    mc, cfg, start, _ = study._candidate_configs("gated-r8", 10, 0)
    direct = _train(mc, cfg, study.data, study.windows, 0, 0, "direct", None, tmp_path / "direct", 0, start,
                    infill=False)[1]
    assert (got["l2r"], got["any"]) == (direct["l2r"], direct["any"])
    assert got["trainable_parameters"] < got["parameters"] and "infill" in got
