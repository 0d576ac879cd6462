"""The plan of an output directory: fixed at the first invocation, reused, never mixed."""

from __future__ import annotations

import json
import os

import pytest

from aogpt.errors import AOGPTError
from aogpt.io import directory_lock
from aogpt.reproduce import pipeline
from aogpt.reproduce.scale import QUICK


def test_a_budget_is_timed_once_and_then_fixed(tmp_path, monkeypatch):
    calls = []

    def fake_budget(plan, data, minutes, jobs=1):
        calls.append(minutes)
        return 48, {"seconds_per_step_all_runs": 0.5}

    monkeypatch.setattr(pipeline, "fit_budget", fake_budget)
    request = {"quick": False, "budget_minutes": 7.0, "device": "cpu"}
    scale = pipeline.resolve_scale(tmp_path, QUICK, request, lambda s: s, data=None)
    assert scale.steps == 48 and scale.n_embd == QUICK.n_embd and calls == [7.0]
    stored = json.loads((tmp_path / "plan.json").read_text())
    assert stored["scale"]["steps"] == 48 and stored["budget_timing"] == {"seconds_per_step_all_runs": 0.5}
    assert pipeline.resolve_scale(tmp_path, QUICK, request, lambda s: s, data=None) == scale and calls == [7.0]
    with pytest.raises(AOGPTError, match="other options"):
        pipeline.resolve_scale(tmp_path, QUICK, {**request, "budget_minutes": 8.0}, lambda s: s, data=None)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"seeds": 0}, "--seeds"),
    ({"quick": True, "budget_minutes": 5.0}, "--budget-minutes"),
    ({"budget_minutes": -1.0}, "--budget-minutes"),
])
def test_bad_options_are_refused_before_any_work(tmp_path, kwargs, fragment):
    with pytest.raises(AOGPTError, match=fragment):
        pipeline.reproduce(tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_a_directory_in_use_is_refused_in_users_words(tmp_path):
    """reproduce holds the one lock every writing command takes (`aogpt.io.directory_lock`): a second
    writer is refused before any work, naming who holds DIR and what to do."""
    out = tmp_path / "out"
    out.mkdir()
    with directory_lock(out, "aogpt reproduce", inside=True):
        with pytest.raises(AOGPTError) as refused:
            pipeline.reproduce(out, ["f6"], quick=True, show_progress=False)
    message = str(refused.value)
    assert message.startswith(f"{out} is in use by process {os.getpid()} (aogpt reproduce on ")
    assert message.endswith("(wait for it to finish, or choose another --out)")
    assert sorted(p.name for p in out.iterdir()) == []  # nothing was prepared, planned or trained
