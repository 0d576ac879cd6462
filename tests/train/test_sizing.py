"""`aogpt.train.sizing` and `--preset auto`: the model sized to the compute the budget holds on this
machine, by the study's rule (the widest candidate with enough tokens per parameter), the curriculum
scaled to the predicted steps, and fields the user gave kept."""

from __future__ import annotations

import pytest
import torch

from aogpt.config import model_config, train_config
from aogpt.errors import AOGPTError
from aogpt.memory import parameter_count
from aogpt.train import plan, sizing

CPU = torch.device("cpu")


def fake_timer(seconds_per_parameter: float):
    """A machine whose step time is proportional to the parameter count (what the rule reads)."""
    calls = []

    def timer(mcfg, tcfg):
        calls.append(mcfg.n_embd)
        return seconds_per_parameter * parameter_count(mcfg)

    timer.calls = calls
    return timer


def choose(seconds_per_parameter: float, minutes: float = 10.0, **over):
    tcfg = train_config("auto", "aogpt", **{"max_minutes": minutes, "compile": "off", **over})
    return sizing.choose_size("aogpt", {}, tcfg, vocab_size=512, device=CPU,
                              timer=fake_timer(seconds_per_parameter))


def test_more_compute_buys_a_wider_model_by_the_tokens_per_parameter_rule():
    fast, slow = choose(2e-8), choose(2e-7)
    assert fast.n_embd > slow.n_embd
    for choice in (fast, slow):
        rows = choice.measured["candidates"]
        assert [r["width"] for r in rows] == [w for w, _ in sizing.CANDIDATES]
        picked = next(r for r in rows if r["width"] == choice.n_embd)
        wider = [r for r in rows if r["width"] > choice.n_embd]
        assert picked["tokens_per_parameter"] >= sizing.MIN_TOKENS_PER_PARAMETER or picked is rows[0]
        assert all(r["tokens_per_parameter"] < sizing.MIN_TOKENS_PER_PARAMETER for r in wider)
        assert choice.curriculum == sizing.curriculum_for(picked["steps"])
        assert choice.why.startswith(f"size: width {choice.n_embd}, ") and "tokens per parameter" in choice.why


def test_tokens_per_parameter_is_steps_times_tokens_over_parameters():
    choice = choose(1e-7)
    for r in choice.measured["candidates"]:
        mcfg = model_config("aogpt", "auto", n_embd=r["width"], n_head=r["heads"], vocab_size=512)
        usable = 600 * (1 - sizing.OVERHEAD_SHARE)
        assert r["steps"] == int(usable / (1e-7 * parameter_count(mcfg)))
        assert r["tokens_per_parameter"] == pytest.approx(r["steps"] * 16 * 128 / parameter_count(mcfg))


def test_no_candidate_fits_means_the_smallest():
    assert choose(1e-3).n_embd == sizing.CANDIDATES[0][0]


def test_the_curriculum_scales_with_the_run():
    assert sizing.curriculum_for(4000) == "l2r@100,mallows:4..0.05@600"
    assert sizing.curriculum_for(2000) == "l2r@50,mallows:4..0.05@300"
    assert sizing.curriculum_for(10) == "l2r@1,mallows:4..0.05@2"


def test_a_compiled_run_is_sized_by_the_compiled_step(monkeypatch):
    from aogpt import compiling

    monkeypatch.setattr(compiling, "c_compiler", lambda: "/usr/bin/g++")
    eager, compiled = choose(1e-7, compile="off"), choose(1e-7, compile="on")
    steps = {r["width"]: r["steps"] for r in eager.measured["candidates"]}
    for r in compiled.measured["candidates"]:
        share = compiling.COMPILED_STEP_SHARE[compiled.measured["precision"]]
        usable = 600 * (1 - sizing.OVERHEAD_SHARE) - compiling.COLD_COMPILE_SECONDS
        assert r["step_seconds"] == pytest.approx(1e-7 * r["params"] * share)
        assert r["steps"] == int(usable / r["step_seconds"]) and steps[r["width"]] > 0


def test_preset_auto_in_a_plan(tmp_path, bytes_data, monkeypatch):
    timer = fake_timer(1e-8)
    monkeypatch.setattr(sizing, "time_steps", timer)
    monkeypatch.setitem(sizing.choose_size.__kwdefaults__, "timer", timer)
    p = plan(tmp_path / "a", data=bytes_data, preset="auto", max_minutes=10, compile="off")
    assert p.sizing_why.startswith(f"size: width {p.model_cfg.n_embd}") and timer.calls
    assert p.train_cfg.extra["sizing"]["candidates"] and p.train_cfg.curriculum.startswith("l2r@")
    given = plan(tmp_path / "b", data=bytes_data, preset="auto", max_minutes=10,
                 overrides=["model.n_embd=64", "model.n_head=2"], curriculum="l2r@7")
    assert given.model_cfg.n_embd == 64 and "as given" in given.sizing_why and given.train_cfg.curriculum == "l2r@7"
    with pytest.raises(AOGPTError, match="--preset auto sizes the model to a time budget"):
        plan(tmp_path / "c", data=bytes_data, preset="auto", max_minutes=0, max_steps=5)


def test_the_real_timer_times_eager_steps():
    mcfg = model_config("aogpt", "tiny", vocab_size=64)
    seconds = sizing.time_steps(mcfg, train_config("tiny", "aogpt"), steps=2)
    assert 0 < seconds < 10
