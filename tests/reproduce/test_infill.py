"""The infilling finding at a tiny scale, two seeds: its checks follow the rule, its rows are the spans'
exact bits per byte averaged over seeds, its price is the runs' own validation, and the report says
which model fills best."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from aogpt import stats
from aogpt.checkpoint import load
from aogpt.data import PreparedData
from aogpt.evaluation.infill import FIM_ROW, make_cuts, score_cuts
from aogpt.reproduce import pipeline
from aogpt.reproduce.findings import FINDINGS, INFILL_LENGTHS, infill_key
from aogpt.reproduce.scale import QUICK

pytestmark = pytest.mark.slow  # every test reads the one end-to-end run below
TINY = dataclasses.replace(QUICK, n_embd=16, steps=6, evals=2, batch_size=4, eval_batches=2, warmup_steps=2, seeds=2,
                           infill_block_size=88, infill_context=8, infill_cuts=4)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("reproduce") / "infill"
    return out, pipeline.reproduce(out, ["infill"], scale=TINY, show_progress=False)


def test_the_checks_follow_the_rule_over_two_seeds(report):
    out, rep = report
    (f,) = rep["findings"]
    assert f["key"] == "infill" and f["seeds"] == [1337, 1338] and len(f["checks"]) == len(FINDINGS["infill"].checks)
    for c in f["checks"]:
        e = c["estimate"]
        est = stats.Estimate(e["value"], e["low"], e["high"], e["n"], e["units"])
        assert c["verdict"] == stats.verdict_lower(est) and e["n"] == 2 and e["units"] == "seeds"
    assert f["verdict"] == stats.combine([c["verdict"] for c in f["checks"]])
    markdown = (out / "report.md").read_text()
    assert "Fills best: at the smaller budget (6 steps)" in markdown and "The left-to-right price" in markdown
    assert (out / "figures" / "infill.png").stat().st_size > 1000
    assert "the infilling runs: context 88, 6 and 18 steps" in rep["scale"]["description"]


def test_rows_are_the_exact_span_scores_of_the_trained_runs(report):
    out, rep = report
    (f,) = rep["findings"]
    data = PreparedData(next((out / "data").iterdir()))
    ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in data.shards("val")])
    n, budget = INFILL_LENGTHS[0], 1
    cuts = make_cuts(ids, n, num_cuts=TINY.infill_cuts, context=TINY.infill_context, seed=1337, eot_id=data.eot_id)
    per_seed = []
    for seed in (1337, 1338):
        model = load(out / "runs" / f"infill-fim-{budget}-seed{seed}").model
        assert model.config.block_size == 88 and model.config.fim_tokens == [257, 258, 259, 260]
        scores = score_cuts(model, cuts, byte_lengths=data.tokenizer.byte_lengths())
        per_seed.append(scores.bpb(FIM_ROW).mean)
    assert f["infill"]["rows"][infill_key("fim", "both", n, budget)]["mean"] == pytest.approx(np.mean(per_seed))
    price = f["infill"]["price"][f"fim {budget}"]
    gpt = f["infill"]["price"][f"gpt {budget}"]
    assert price["vs_gpt"]["mean"] == pytest.approx(price["l2r"]["mean"] - gpt["l2r"]["mean"])
    run = next(r for r in f["runs"] if r["run"] == f"infill-fim-{budget}")
    assert price["l2r"]["mean"] == pytest.approx(run["l2r final"]["mean"] / math.log(2))
