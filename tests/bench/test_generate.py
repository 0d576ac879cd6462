"""`aogpt.bench.generate`: every method runs, does the work it claims (forward counts), and the reported
ratios are those of the medians."""

from __future__ import annotations

import json
import math

import pytest
import torch

from aogpt.bench.generate import METHODS, bench_generate, check_methods, ratios
from aogpt.errors import AOGPTError
from tests.bench import TINY


def test_generate_runs_every_method_and_writes_table_json_png(tmp_path):
    res = bench_generate(n=12, batch=2, steps=[3, 12], size=TINY, methods=list(METHODS), repeats=2, out=tmp_path)
    assert set(res["seconds"]) == set(METHODS)
    assert set(res["seconds"]["gpt"]) == {"12"}  # the AR model always takes n steps
    for m in METHODS:
        if m != "gpt":
            assert set(res["seconds"][m]) == {"3", "12"}
            assert all(len(r) == 2 for r in res["runs"][m].values())  # repeats, median of them
    f = res["forwards"]
    assert f["gpt"]["12"] == 12 and f["aogpt-count"]["3"] == 3 and f["encoder-noskip"]["12"] == 12
    assert f["encoder"]["12"] <= 12 and f["aogpt"]["12"] <= 12
    r = res["ratios"]["12"]
    assert math.isclose(r["encoder/aogpt"], res["seconds"]["encoder"]["12"] / res["seconds"]["aogpt"]["12"])
    assert math.isclose(r["aogpt/gpt"], res["seconds"]["aogpt"]["12"] / res["seconds"]["gpt"]["12"])
    md = (tmp_path / "generate.md").read_text()
    assert "| 12 |" in md and "Targets (issue 6):" in md
    saved = json.loads((tmp_path / "generate.json").read_text())
    assert saved["seconds"] == res["seconds"]
    assert (tmp_path / "generate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [t["name"].split()[0] for t in res["targets"]] == ["encoder", "AO-GPT"]


def test_skip_and_noskip_encoders_generate_the_same_samples():
    """The two encoder contenders do the same work apart from skipped forwards (same samples)."""
    from aogpt.bench.common import build_model
    from aogpt.generate import generate

    model = build_model("encoder-mdm", TINY, 16, torch.device("cpu"), seed=0)
    a = generate(model, num_samples=3, length=16, steps=16, batch_size=1, seed=3, **METHODS["encoder"][1])
    b = generate(model, num_samples=3, length=16, steps=16, batch_size=1, seed=3, **METHODS["encoder-noskip"][1])
    assert torch.equal(a.tokens, b.tokens)
    assert a.timing["forwards"] < b.timing["forwards"] == 48


def test_bad_inputs():
    with pytest.raises(AOGPTError, match="steps"):
        bench_generate(n=8, steps=[16], size=TINY)
    with pytest.raises(AOGPTError, match="unknown method"):
        check_methods(["aogpt", "sedd"])


def test_ratios_of_the_medians():
    fake = {"steps": [4], "n": 4, "seconds": {"aogpt": {"4": 2.0}, "encoder": {"4": 50.0}, "gpt": {"4": 1.0}}}
    r = ratios(fake)["4"]
    assert r["encoder/aogpt"] == 25.0 and r["aogpt/gpt"] == 2.0 and r["aogpt-nocache/aogpt"] is None
