"""`aogpt compare` end to end."""

from __future__ import annotations

from pathlib import Path


def test_compare_cli(cli, tiny_run, tmp_path):
    result = cli("compare", tiny_run, tiny_run, "--out", tmp_path / "cmp", "--weights", "both", "--json")
    assert result.code == 0, result.err
    summary = result.json
    assert Path(summary["files"]["png"]).is_file() and "| run | step |" in result.out
    assert len(summary["final"]) == 2  # the same directory twice: told apart by its path


def test_compare_errors_are_one_line(cli, tmp_path):
    result = cli("compare", tmp_path, "--out", tmp_path / "cmp")
    assert result.code == 2 and result.err.startswith("error: ") and "Traceback" not in result.err
    assert cli("compare", "--help").code == 0
