"""Ranges stated once: `Range` itself, every numeric config field declaring one, `validate()` and the
flags refusing the same values (property-based), and `require` for what JSON files give us."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aogpt.cli.common import config_arg
from aogpt.config import ModelConfig, TrainConfig, apply_overrides
from aogpt.errors import AOGPTError
from aogpt.generation.settings import DecodePlan, GenerationSettings
from aogpt.sampling import SamplingConfig
from aogpt.validation import Range, bounded, check_ranges, field_range, require

CONFIGS = (ModelConfig, TrainConfig, SamplingConfig, DecodePlan, GenerationSettings)


def test_range_words_and_checks():
    assert Range(gt=0, le=1).describe() == "in (0, 1]"
    assert Range(ge=1, integer=True).describe() == ">= 1"
    assert Range(lt=5).describe() == "< 5"
    assert Range(ge=0, le=2**62, integer=True).describe() == "in [0, 2^62]"
    assert Range(ge=1, le=10**9, integer=True).describe() == "in [1, 1_000_000_000]"
    r = Range(gt=0, le=1)
    assert r.problem(0.5) is None and r.problem(1) is None
    assert r.problem(0.0) == "must be in (0, 1], got 0.0"
    assert r.problem(math.nan) == "must be a finite number in (0, 1], got nan"
    assert r.problem(True) == "must be a number, got True"
    assert Range(ge=0, integer=True).problem(2.0) == "must be an integer, got 2.0"
    with pytest.raises(ValueError, match="must be a number, got 'x'"):
        r.parse("x")
    assert Range(ge=1, integer=True).parse(" 7 ") == 7


def test_every_number_of_every_config_states_its_range():
    missing = []
    for cls in CONFIGS:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kinds = set(typing.get_args(hints[f.name])) | {hints[f.name]}
            numeric = kinds & {int, float} and not kinds & {bool, str}  # number-or-word fields check themselves
            if numeric and f.metadata.get("range") is None:
                missing.append(f"{cls.__name__}.{f.name}")
    assert missing == []


@dataclasses.dataclass
class Example:
    rate: float = bounded(0.5, gt=0, lt=1)
    count: int = bounded(3, ge=1, le=10)
    optional: int | None = bounded(None, ge=0, integer=True)


def test_check_ranges_names_the_field():
    check_ranges(Example(), "example")
    check_ranges(Example(optional=None), "example")
    with pytest.raises(AOGPTError, match=r"example: count must be in \[1, 10\], got 11"):
        check_ranges(Example(count=11), "example")
    with pytest.raises(AOGPTError, match="example: optional must be >= 0, got -1"):
        check_ranges(Example(optional=-1), "example")


FIELDS = [(cls, f.name) for cls in (ModelConfig, TrainConfig) for f in dataclasses.fields(cls)
          if f.metadata.get("range") is not None]


@pytest.mark.parametrize("cls, name", FIELDS, ids=[f"{c.__name__}.{n}" for c, n in FIELDS])
@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(value=st.one_of(st.integers(-10**20, 10**20), st.floats(allow_nan=True, allow_infinity=True)))
def test_the_flag_and_the_config_accept_exactly_the_same_values(cls, name, value):
    """A value the flag's type accepts is one `validate()` accepts, and the other way round."""
    bounds = field_range(cls, name)
    if bounds.integer and isinstance(value, float):
        value = int(value) if math.isfinite(value) else value
    text = repr(value) if isinstance(value, float) else str(value)
    try:
        config_arg(cls, name)(text)
        flag_ok = True
    except Exception:  # noqa: BLE001 - argparse.ArgumentTypeError
        flag_ok = False
    base = {"min_lr": 0.0} if cls is TrainConfig else {}  # min_lr <= lr is a check across two fields
    try:
        obj = apply_overrides(cls(), {**base, name: value}, "config")
        (obj.validate() if cls is ModelConfig else check_ranges(obj, "config"))
        config_ok = True
    except AOGPTError:
        config_ok = False
    if cls is ModelConfig and name in ("n_head", "n_embd") and flag_ok and not config_ok:
        return  # n_embd must also divide by n_head: a check across two fields
    assert flag_ok == config_ok, (name, value)


def test_train_config_cross_checks():
    with pytest.raises(AOGPTError, match="min_lr 0.5 is above lr 0.1"):
        TrainConfig(lr=0.1, min_lr=0.5).validate()
    with pytest.raises(AOGPTError, match="unknown device"):
        TrainConfig(device="gpu").validate()
    with pytest.raises(AOGPTError, match="unknown precision"):
        TrainConfig(dtype="int8").validate()
    assert TrainConfig(max_steps=9, schedule_steps=0).decay_steps == 9
    assert TrainConfig(max_steps=9, schedule_steps=4).decay_steps == 4


def test_require_names_the_missing_or_mistyped_key():
    assert require({"a": 1}, "a", int, "file.json", "fix it") == 1
    with pytest.raises(AOGPTError, match="file.json lacks the key 'b'"):
        require({"a": 1}, "b", int, "file.json", "fix it")
    with pytest.raises(AOGPTError, match="file.json: a must be int, got True"):
        require({"a": True}, "a", int, "file.json", "fix it")
    with pytest.raises(AOGPTError, match="must be a JSON object, got list"):
        require([1], "a", int, "file.json", "fix it")
