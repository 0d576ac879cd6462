"""`aogpt reproduce --quick`: the whole pipeline once (tiny sizes), the report's structure, verdicts
that follow the stated rule, and a rerun that reuses everything."""

from __future__ import annotations

import contextlib
import io
import json
import time

import pytest

from aogpt import stats
from aogpt.reproduce.findings import FINDINGS
from aogpt.reproduce.runner import resolve_findings

pytestmark = pytest.mark.slow  # every test reads the one end-to-end run below
VERDICTS = {stats.REPRODUCED, stats.NOT_REPRODUCED, stats.INCONCLUSIVE}


def run_cli(*args):
    from aogpt.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # flags refused by their argparse types
            code = exc.code
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("reproduce") / "quick"
    start = time.perf_counter()
    code, stdout, stderr = run_cli("reproduce", "--quick", "--out", out, "--json", "--no-progress")
    assert code == 0, stderr
    return out, json.loads(stdout.strip().splitlines()[-1]), time.perf_counter() - start


def test_report_lists_every_finding_with_a_verdict(quick):
    out, summary, _ = quick
    report = json.loads((out / "report.json").read_text())
    assert [f["key"] for f in report["findings"]] == list(resolve_findings(None))  # infill: only when named
    assert report["verdicts"] == summary["verdicts"]  # --json says what report.json says
    assert report["scale"]["name"] == "quick" and report["seeds"] == [1337]
    for finding in report["findings"]:
        spec = FINDINGS[finding["key"]]
        assert len(finding["checks"]) == len(spec.checks)
        if spec.checks:
            assert finding["verdict"] in VERDICTS
            assert finding["verdict"] == stats.combine([c["verdict"] for c in finding["checks"]])
        else:
            assert finding["verdict"].startswith("measured")
        assert finding["figures"], finding["key"]
        for fig in finding["figures"]:
            assert (out / fig).is_file() and (out / fig).stat().st_size > 1000
    markdown = (out / "report.md").read_text()
    assert "How verdicts are decided" in markdown and "**Scale** (quick)" in markdown and "load average" in markdown
    for finding in report["findings"]:
        assert f"## {finding['title']}" in markdown and f"](#{finding['key']})" in markdown


def test_every_check_verdict_follows_the_stated_rule(quick):
    out, _, _ = quick
    report = json.loads((out / "report.json").read_text())
    checked = 0
    for finding in report["findings"]:
        for c in finding["checks"]:
            e = c["estimate"]
            low = -float("inf") if e["low"] is None else e["low"]
            high = float("inf") if e["high"] is None else e["high"]
            estimate = stats.Estimate(e["value"], low, high, e["n"], e["units"])
            rule = stats.verdict_lower if c["rule"] == "lower" else lambda x, m=c["margin"]: stats.verdict_within(x, m)
            assert c["verdict"] == rule(estimate), c["claim"]
            assert (e["n"] >= 2 or e["exact"]) and c["verdict"] in VERDICTS
            checked += 1
    assert checked == sum(len(FINDINGS[k].checks) for k in resolve_findings(None))


def test_the_quick_tables_hold_the_measured_numbers(quick):
    out, _, _ = quick
    report = {f["key"]: f for f in json.loads((out / "report.json").read_text())["findings"]}
    assert set(report["f6"]["table"]) == {"decoder M=1", "decoder M=2", "decoder M=4", "decoder M=8", "encoder"}
    assert all(0 < v["genppl"] for v in report["genppl"]["table"].values())
    assert report["speed"]["speedup_at_n"]["mean"] > 0
    sweep = report["orders"]["sweep"]
    assert [r["theta"] for r in sweep] == ["inf", "1", "0.3", "0.1", "0.03", "0", ""]
    for row in report["f1"]["runs"]:  # the run table's final numbers are the runs' batch records
        run = out / "runs" / f"{row['run']}-seed1337"
        last = json.loads((run / "batches.jsonl").read_text().splitlines()[-1])
        assert row["l2r final"]["mean"] == pytest.approx(sum(last["val/l2r/ema"]) / len(last["val/l2r/ema"]))


def test_a_rerun_reuses_every_run_and_analysis(quick):
    out, summary, first_seconds = quick
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/ckpt-*/model.safetensors")}
    analyses = {p: p.stat().st_mtime_ns for p in (out / "analyses").glob("*.json")}
    start = time.perf_counter()
    code, stdout, stderr = run_cli("reproduce", "--quick", "--out", out, "--json", "--no-progress")
    assert code == 0, stderr
    assert json.loads(stdout.strip().splitlines()[-1])["verdicts"] == summary["verdicts"]
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert {p: p.stat().st_mtime_ns for p in analyses} == analyses
    assert time.perf_counter() - start < first_seconds


@pytest.mark.parametrize("args, fragment", [
    (("--budget-minutes", "30"), "other options"),  # the directory holds a quick reproduction
    (("--seeds", "0"), "--seeds"),
    (("f99",), "unknown finding"),
])
def test_bad_requests_are_one_line_errors(quick, args, fragment):
    out, _, _ = quick
    quick_flag = () if "--budget-minutes" in args else ("--quick",)
    code, _, stderr = run_cli("reproduce", *quick_flag, "--out", out, *args)
    assert code == 2 and stderr.startswith("error: ") and fragment in stderr and "Traceback" not in stderr
