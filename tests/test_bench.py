"""The benchmark library: tiny configurations run, measure what they claim, and refuse bad input.

No timing is asserted (timed unit tests are flaky on shared machines): only structure, the work each
contender does (forward counts), the reported ratios' arithmetic and the exact-likelihood values.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from aogpt.bench.common import QUICK_SIZE, Size, Target, interleaved_medians, parse_checkpoints, parse_int_list
from aogpt.bench.density import bench_density
from aogpt.bench.generate import METHODS, bench_generate, check_methods, ratios
from aogpt.bench.train_step import bench_train
from aogpt.checkpoint import save_checkpoint
from aogpt.config import to_dict
from aogpt.errors import AOGPTError

TINY = Size(n_layer=1, n_embd=16, n_head=2, vocab_size=32)


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


def test_density_scores_the_same_sequences_exactly(tmp_path):
    res = bench_density(n=10, batch=2, size=TINY, repeats=1, out=tmp_path)
    assert res["forwards_per_sequence"] == {"aogpt": 1, "gpt": 1, "encoder-mdm": 10}
    # untrained models over 32 tokens: every exact NLL per token is near log(32)
    assert all(abs(v - math.log(32)) < 0.5 for v in res["nll_per_token"].values())
    assert math.isclose(res["ratios"]["encoder-mdm/aogpt"],
                        res["seconds"]["encoder-mdm"] / res["seconds"]["aogpt"])
    assert "encoder-only MDM (10 passes" in (tmp_path / "density.md").read_text()


def test_train_times_the_real_step_of_every_variant(tmp_path):
    res = bench_train(block=8, batch=2, size=TINY, steps=2, warmup=1, out=tmp_path)
    assert res["variants"] == ["gpt", "sigma", "aogpt", "encoder-mdm"]
    assert res["ratio_to_gpt"]["gpt"] == 1.0
    assert all(len(r) == 2 for r in res["runs"].values())
    assert all(math.isfinite(v) for v in res["last_loss"].values())
    assert res["tokens_per_second"]["aogpt"] == pytest.approx(16 / res["seconds_per_step"]["aogpt"])
    assert "paper code" in (tmp_path / "train.md").read_text()


def test_checkpoints_are_timed_and_must_match_the_size(tmp_path):
    from aogpt.bench.common import build_model

    model = build_model("aogpt", TINY, 12, torch.device("cpu"), seed=1)
    save_checkpoint(tmp_path / "ao", model, config={"model": to_dict(model.config)})
    res = bench_density(n=12, batch=1, repeats=1, checkpoints={"aogpt": tmp_path / "ao"})
    assert res["size"] == TINY.to_dict()  # the checkpoint's size is used for every contender
    with pytest.raises(AOGPTError, match="unequal size"):
        bench_density(n=12, batch=1, repeats=1, size=QUICK_SIZE, checkpoints={"aogpt": tmp_path / "ao"})
    with pytest.raises(AOGPTError, match="holds a aogpt model"):
        bench_density(n=12, batch=1, repeats=1, checkpoints={"gpt": tmp_path / "ao"})
    with pytest.raises(AOGPTError, match="context"):
        bench_density(n=20, batch=1, repeats=1, checkpoints={"aogpt": tmp_path / "ao"})


def test_bad_inputs():
    with pytest.raises(AOGPTError, match="steps"):
        bench_generate(n=8, steps=[16], size=TINY)
    with pytest.raises(AOGPTError, match="unknown method"):
        check_methods(["aogpt", "sedd"])
    with pytest.raises(AOGPTError, match="unknown variant"):
        bench_train(variants=["bert"], size=TINY)
    with pytest.raises(AOGPTError, match="positive"):
        bench_density(n=0, size=TINY)
    for bad in ("", "a,b", "0,4"):
        with pytest.raises(AOGPTError):
            parse_int_list(bad, "steps")
    assert parse_int_list("64, 16,64", "steps") == [16, 64]
    with pytest.raises(AOGPTError, match="VARIANT=PATH"):
        parse_checkpoints(["ckpt/dir"], ("aogpt",))


def test_helpers():
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    med, runs = interleaved_medians(fns, torch.device("cpu"), repeats=3, long_run=10.0)
    assert calls == ["a", "b"] * 3 and med["a"] == sorted(runs["a"])[1]  # round robin, median of 3
    calls.clear()
    med, runs = interleaved_medians(fns, torch.device("cpu"), repeats=3, long_run=-1.0)
    assert calls == ["a", "b"] and len(runs["a"]) == 1  # a run longer than long_run is not repeated
    assert Target("x", 30.0, 25.0, True).met and not Target("y", 1.4, 1.3, False).met
    assert Target("z", None, 1.0, True).met is None
    fake = {"steps": [4], "n": 4, "seconds": {"aogpt": {"4": 2.0}, "encoder": {"4": 50.0}, "gpt": {"4": 1.0}}}
    r = ratios(fake)["4"]
    assert r["encoder/aogpt"] == 25.0 and r["aogpt/gpt"] == 2.0 and r["aogpt-nocache/aogpt"] is None
