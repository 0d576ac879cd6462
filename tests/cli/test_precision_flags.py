"""`--dtype` of every command: the one vocabulary (`aogpt.precision`) in both spellings, and on a CPU
without bf16 (the avx2 class) an explicit bf16 refused in one line before anything is written."""

from __future__ import annotations

import argparse

import pytest

from aogpt import capability
from aogpt.cli import build_parser

COMMANDS = {  # a valid invocation without --dtype, and the precisions the command applies to
    "train": (["train", "--preset", "tiny", "--data", "d", "--out", "r"], ("auto", "fp32", "bf16", "fp16")),
    "eval": (["eval", "--checkpoint", "c", "--data", "d"], ("auto", "fp32", "bf16", "fp16", "fp64")),
    "sample": (["sample", "--checkpoint", "c"], ("auto", "fp32", "bf16", "fp16", "fp64")),
}
LONG = {"auto": "auto", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp64": "float64"}
BENCHES = ("generate", "train", "attention")


def subparser(parser: argparse.ArgumentParser, *names: str) -> argparse.ArgumentParser:
    for name in names:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_takes_both_spellings_and_keeps_the_short_one(command):
    base, allowed = COMMANDS[command]
    parser = build_parser()
    for short in allowed:
        for spelled in {short, LONG[short], LONG[short].upper()}:
            assert parser.parse_args([*base, "--dtype", spelled]).dtype == short
    assert "bf16 (bfloat16)" in " ".join(subparser(parser, command).format_help().split())


@pytest.mark.parametrize("bench", BENCHES)
def test_benchmarks_take_both_spellings_in_lists(bench):
    from aogpt.precision import parse_list

    parser = build_parser()
    value = parser.parse_args(["bench", bench, "--dtype", "float32,bf16"]).dtype
    assert parse_list(value) == ["fp32", "bf16"]
    assert "bf16 (bfloat16)" in " ".join(subparser(parser, "bench", bench).format_help().split())


def test_unknown_precision_is_one_line_with_the_names(cli):
    res = cli("sample", "--checkpoint", "nowhere", "--dtype", "half")
    assert res.code == 2 and res.err.count("\n") == 1
    assert "unknown precision 'half' (use auto, fp32 (float32), bf16 (bfloat16)" in res.err


@pytest.fixture
def avx2(as_cpu):
    if capability.cpu().arch != "x86":
        pytest.skip("the avx2 class is an x86 class")
    as_cpu("avx2")


def test_explicit_bf16_without_bf16_units_is_refused_before_any_work(cli, tiny_run, bytes_data, tmp_path, avx2):
    before = sorted(p.name for p in tiny_run.rglob("*"))
    for args in (["sample", "--checkpoint", tiny_run, "--dtype", "bf16", "-n", "1", "--length", "8"],
                 ["sample", "--checkpoint", tiny_run, "--dtype", "bfloat16", "-n", "1", "--length", "8"],
                 ["eval", "--checkpoint", tiny_run, "--data", bytes_data, "--dtype", "bf16", "--max-batches", "1"],
                 ["train", "--preset", "tiny", "--data", bytes_data, "--out", tmp_path / "run", "--dtype", "bf16",
                  "--max-steps", "1", "--no-progress"]):
        res = cli(*args)
        assert res.code == 2, res.out + res.err
        assert res.err == ("error: this CPU (avx2) has no bf16 units, so bf16 would be emulated, far slower than "
                           "fp32 (use fp32, or auto to let aogpt choose)\n")
    assert not (tmp_path / "run").exists() and sorted(p.name for p in tiny_run.rglob("*")) == before


def test_auto_falls_back_to_fp32_and_says_so(cli, tiny_run, avx2):
    res = cli("sample", "--checkpoint", tiny_run, "-n", "1", "--length", "8", "--json", "--no-progress")
    assert res.code == 0, res.err
    assert res.json["precision"] == "fp32"
    assert res.json["precision_why"] == "fp32 (auto: this CPU, avx2, has no bf16 units)"
