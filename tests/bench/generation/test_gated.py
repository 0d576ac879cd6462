"""`aogpt bench gated`: four contenders timed side by side, the gated ones on the gated decode path, and
the ratios its goals read, computed from the rows."""

from __future__ import annotations

import pytest

from aogpt.bench.generation.gated import CONTENDERS, GOALS, bench_gated, to_markdown


def test_the_benchmark_times_every_contender_and_reads_its_goals_off_the_rows():
    result = bench_gated(n=12, batch=2, repeats=2, width=64, rank=4)
    rows = {r["contender"]: r for r in result["rows"]}
    assert set(rows) == set(CONTENDERS) and all(len(r["cpu_ms_runs"]) == 2 for r in rows.values())
    paths = result["decode_path"]
    assert paths["gated-l2r"] == paths["gated-random"] == "fast, gated" and paths["source"] == paths["aogpt"] == "fast"
    for k, (ref, goal) in GOALS.items():
        r = result["ratios"][k]
        assert r["cpu"] == pytest.approx(rows[k]["cpu_ms_per_step"] / rows[ref]["cpu_ms_per_step"])
        assert r["met_cpu"] == (r["cpu"] <= goal)
        rounds = [a / b for a, b in zip(rows[k]["cpu_ms_runs"], rows[ref]["cpu_ms_runs"], strict=True)]
        paired = r["cpu_paired"]
        assert r["cpu_rounds"] == pytest.approx(rounds) and paired["value"] == pytest.approx(sum(rounds) / 2)
        assert paired["low"] < paired["value"] < paired["high"] or rounds[0] == rounds[1]
        verdict = "met" if paired["high"] < goal else "missed" if paired["low"] > goal else "inconclusive"
        assert r["verdict"] == verdict
    text = to_markdown(result)
    assert "gated-random / aogpt" in text and "load average" in text and result["environment"]["cpu_class"]


def test_the_command_runs_quick_and_writes_its_report(cli, tmp_path):
    res = cli("bench", "gated", "--quick", "--out", tmp_path, "--json", "--no-progress")
    assert res.code == 0, res.err
    assert res.json["benchmark"] == "gated" and (tmp_path / "gated.md").is_file()
    res = cli("bench", "gated", "--rank", "0", "--quick", "--out", tmp_path)
    assert res.code == 2 and "at least 1" in res.err
