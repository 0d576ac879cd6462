"""The findings' specs are consistent: what a check reads is trained or measured by its finding."""

from __future__ import annotations

import pytest

from aogpt.orders import make_order_sampler
from aogpt.reproduce.analyses import ANALYSES
from aogpt.reproduce.findings import ALIASES, FINDINGS, RUNS
from aogpt.reproduce.scale import DEFAULT, QUICK, configs


@pytest.mark.parametrize("key", list(FINDINGS))
def test_checks_read_only_what_the_finding_provides(key):
    finding = FINDINGS[key]
    for check in finding.checks:
        for q in (check.a, check.b):
            if q.source == "curve":
                assert q.run in finding.runs and q.metric in ("l2r", "any", "own") and q.stage in ("early", "final")
            elif q.source != "const":
                assert q.source in finding.analyses
        assert check.rule in ("lower", "within")
    for analysis in finding.analyses:
        assert set(ANALYSES[analysis]) <= set(finding.runs)  # the models an analysis loads are trained
    for panel in finding.panels:
        assert set(panel.runs) <= set(finding.runs)


@pytest.mark.parametrize("scale", [QUICK, DEFAULT], ids=["quick", "default"])
def test_every_run_has_a_valid_config_of_the_same_size(scale):
    """Every model of a comparison: the same size, batch and steps; the infilling finding's runs have
    their own context and two budgets, each shared by its three models (equal tokens)."""
    sizes: dict = {}
    for spec in RUNS.values():
        mc, tc = configs(spec, scale, vocab_size=320, seed=1, text_vocab=257)
        make_order_sampler(tc.order)
        sizes.setdefault(spec.infill_budget, set()).add((mc.n_layer, mc.n_embd, mc.n_head, mc.block_size,
                                                         tc.batch_size, tc.max_steps))
        assert tc.eval_interval * scale.evals == tc.max_steps
        assert (mc.fim_tokens is not None) == (spec.fim_rate > 0) and tc.fim_rate == spec.fim_rate
    assert all(len(s) == 1 for s in sizes.values()) and set(sizes) == {None, 0, 1}
    (standard,), (small,), (large,) = sizes[None], sizes[0], sizes[1]
    assert small[3] == large[3] == scale.infill_block_size and large[5] == 3 * small[5] == 3 * standard[5]


def test_aliases_point_at_findings():
    assert set(ALIASES.values()) <= set(FINDINGS)


def test_any_order_runs_start_with_the_recommended_curriculum_and_fixed_orders_do_not():
    from aogpt.reproduce.findings import RUNS
    from aogpt.reproduce.scale import DEFAULT, configs

    def train(key):
        return configs(RUNS[key], DEFAULT, 320, 0)[1]

    for key in ("uniform", "mixture", "aogpt-blocks", "sigma-input", "mallows-0.3", "mixture-ema-none"):
        start = f"l2r@{DEFAULT.steps // 18},mallows:4.."  # the first 1/18 of the run left to right
        assert train(key).curriculum.startswith(start) and train(key).target_lr_mult == 10.0, key
    assert train("aogpt-blocks").init_open_gates and not train("sigma-input").init_open_gates
    for key in ("l2r", "fixed-random", "blockwise", "encoder"):
        assert train(key).curriculum == "" and train(key).target_lr_mult == 1.0, key
    assert configs(RUNS["uniform"], DEFAULT, 320, 0)[0].variant == "aogpt"  # AO-GPT's own blocks again
