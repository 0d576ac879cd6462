"""`aogpt bench adapt`'s report: the paired differences and the targets, against an independent computation."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from aogpt.bench.adapt import BASE, CANDIDATES, MEASURED, _plain
from aogpt.bench.adapt_report import summary, to_markdown
from aogpt.config import ADAPT_RECIPE, train_config


def _rows(rng: np.random.Generator) -> list[dict]:
    rows = []
    for seed in range(3):
        src = 2.5 + rng.normal(0, 0.05)
        rows.append({"seed": seed, "source": {"l2r": src, "steps": 10, "cpu_seconds": 1.0},
                     "adapted_start": {"l2r": src, "any": 4.4 + rng.normal(0, 0.05)},
                     "l2r/F5": {"l2r": src - 0.05, "steps": 5, "cpu_seconds": 1.0},
                     "scratch/F5": {"l2r": 2.9 + rng.normal(0, 0.05), "any": 3.3 + rng.normal(0, 0.05), "steps": 15,
                                    "cpu_seconds": 2.0},
                     "recipe/F5": {"l2r": src + 0.01 + rng.normal(0, 0.002), "any": src + 0.09 + rng.normal(0, 0.005),
                                   "steps": 5, "cpu_seconds": 1.0}})
    return rows


def test_the_paired_differences_and_the_targets():
    rows = _rows(np.random.default_rng(0))
    result = {"rows": rows, "finetune": [5], "candidates": ["recipe"], "steps": 10, "eval_bytes": 100,
              "tokenizer": "bpe:512", "preset": "quickstart", "threads": 1,
              "environment": {"device": "cpu", "threads": 1, "torch": "x"}}
    s = summary(result)
    diff = np.array([r["recipe/F5"]["any"] - r["scratch/F5"]["any"] for r in rows])
    half = stats.t.ppf(0.975, 2) * diff.std(ddof=1) / np.sqrt(3)
    got = s["F5/recipe-scratch/any"]
    assert got["mean"] == pytest.approx(diff.mean()) and got["high"] == pytest.approx(diff.mean() + half)
    own = np.array([r["recipe/F5"]["any"] - r["recipe/F5"]["l2r"] for r in rows])
    assert s["F5/recipe-own/any"]["mean"] == pytest.approx(own.mean())
    result["summary"] = s
    table = to_markdown(result)
    # kept left to right (+0.01 of 0.03), below scratch, 1.8 below the source's random order, 0.09 from its own
    assert "| recipe | yes | yes | yes | yes |" in table


def test_every_candidate_is_a_valid_adapt_recipe():
    for name, fields in CANDIDATES.items():
        cfg = train_config("adapt", "aogpt", **fields(300), max_steps=300, init_from="x")
        assert cfg.max_steps == 300, name
    plain = train_config("adapt", "aogpt", **_plain(300))
    assert plain.backbone_lr_mult == 1.0 and plain.replay_l2r == 0.0 and plain.distill_l2r == 0.0
    quick = train_config("quickstart", "aogpt")
    assert (plain.lr, plain.min_lr, plain.warmup_steps) == (quick.lr, quick.min_lr, quick.warmup_steps)
    assert plain.curriculum != ADAPT_RECIPE["curriculum"] and plain.target_lr_mult == 10.0


def test_the_adapt_preset_is_the_measured_candidate():
    assert {**BASE, **CANDIDATES[MEASURED](300)} == ADAPT_RECIPE
