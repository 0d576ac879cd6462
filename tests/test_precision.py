"""`aogpt.precision`: one vocabulary for every command (both spellings, printed one way), what `auto`
means on each CPU class, and explicit requests a CPU cannot serve refused in one line."""

from __future__ import annotations

import argparse

import pytest
import torch

from aogpt import capability, precision
from aogpt.errors import AOGPTError


@pytest.mark.parametrize("names,short", [(("fp32", "float32", "FP32", torch.float32, None), "fp32"),
                                         (("bf16", "bfloat16", torch.bfloat16), "bf16"),
                                         (("fp16", "float16", torch.float16), "fp16"),
                                         (("fp64", "float64", torch.float64), "fp64")])
def test_both_spellings_and_dtypes_print_one_way(names, short):
    for name in names:
        assert precision.canonical(name) == short
    assert precision.name_of(precision.to_dtype(short)) == short
    assert precision.to_dtype(precision.LONG_NAMES[short]) == precision.DTYPES[short]


def test_unknown_or_inapplicable_precisions_are_refused_with_the_accepted_names():
    with pytest.raises(AOGPTError, match=r"unknown precision 'int8' \(use auto, fp32 \(float32\)"):
        precision.canonical("int8")
    with pytest.raises(AOGPTError, match="precision fp64 does not apply here"):
        precision.canonical("float64", precision.AUTOCAST)
    parse = precision.precision_arg(precision.AUTOCAST)
    assert parse("bfloat16") == "bf16"
    with pytest.raises(argparse.ArgumentTypeError):
        parse("fp64")
    assert precision.parse_list("fp32,bfloat16,bf16, auto") == ["fp32", "bf16", "auto"]


def test_auto_is_bf16_only_with_bf16_units(as_cpu):
    dtype, why = precision.auto_precision("cpu")
    assert (dtype == torch.bfloat16) == capability.native_precision(torch.bfloat16)
    assert capability.cpu_class() in why
    if capability.cpu().arch == "x86" and capability.cpu().native_class not in ("x86-64",):
        as_cpu("avx2")
        assert precision.auto_precision("cpu") == (None, "fp32 (auto: this CPU, avx2, has no bf16 units)")
        assert precision.resolve_precision("auto", "cpu")[0] is None
    assert precision.auto_precision("cuda")[0] == torch.bfloat16


def test_an_explicit_bf16_on_a_cpu_without_bf16_is_refused(as_cpu):
    if capability.cpu().arch != "x86" or capability.cpu().native_class == "x86-64":
        pytest.skip("the avx2 class needs an x86 CPU with AVX2")
    as_cpu("avx2")
    with pytest.raises(AOGPTError, match=r"this CPU \(avx2\) has no bf16 units.*\(use fp32, or auto"):
        precision.resolve_precision("bfloat16", "cpu")
    assert precision.resolve_precision("fp32", "cpu") == (None, "fp32 (asked for)")
    kept, notes = precision.usable_only(["fp32", "bf16"], "cpu")
    assert kept == ["fp32"] and notes[0].startswith("bf16 skipped: this CPU (avx2)")
    with pytest.raises(AOGPTError, match="bf16 skipped"):
        precision.usable_only(["bf16"], "cpu")


def test_explicit_precisions_the_cpu_has_are_accepted():
    if capability.usable_precision(torch.bfloat16):
        dtype, why = precision.resolve_precision("bf16", "cpu")
        assert dtype == torch.bfloat16 and why.startswith("bf16 autocast (asked for")
    assert precision.weights_precision("float64", "cpu") == (torch.float64, "fp64 weights (asked for)")
    assert precision.weights_precision("fp32", "cpu") == (torch.float32, "fp32 (asked for)")
