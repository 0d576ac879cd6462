"""`aogpt bench ...` end to end: --help, --quick --json, outputs on disk, bad input exits 2."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def restore_threads():
    """`--threads` sets torch's global thread count; keep it from leaking into other tests."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("name", ["generate", "density", "train"])
def test_help(cli, name):
    res = cli("bench", name, "--help")
    assert res.code == 0 and "--quick" in res.out and "--json" in res.out and "--seed" in res.out


def test_no_benchmark_named(cli):
    res = cli("bench")
    assert res.code == 2 and res.err.startswith("error: no benchmark named")


def test_generate_quick_json(cli, tmp_path):
    res = cli("bench", "generate", "--quick", "--threads", "1", "--steps", "4,8", "--out", tmp_path, "--json",
              "--no-progress")
    assert res.code == 0, res.err
    summary = res.json
    assert summary["command"] == "bench generate" and summary["n"] == 32 and summary["steps"] == [4, 8]
    assert set(summary["seconds"]) == {"aogpt", "aogpt-nocache", "encoder", "encoder-noskip", "gpt"}
    assert "| T | aogpt |" in res.out and "Targets (issue 6):" in res.out
    for name in ("generate.md", "generate.json", "generate.png"):
        assert (tmp_path / name).is_file()


def test_generate_subset_of_methods_and_sizes(cli, tmp_path):
    res = cli("bench", "generate", "--n", "16", "--batch", "2", "--steps", "16", "--repeats", "1", "--layers", "1",
              "--width", "16", "--heads", "2", "--vocab", "32", "--methods", "aogpt,gpt", "--threads", "1",
              "--out", tmp_path, "--json", "--no-progress")
    assert res.code == 0, res.err
    s = res.json
    assert s["size"] == {"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 32}
    assert set(s["seconds"]) == {"aogpt", "gpt"} and s["ratios"]["16"]["aogpt/gpt"] > 0


def test_density_and_train_quick_json(cli, tmp_path):
    res = cli("bench", "density", "--quick", "--threads", "1", "--out", tmp_path, "--json", "--no-progress")
    assert res.code == 0, res.err
    assert res.json["forwards_per_sequence"]["encoder-mdm"] == 32 and (tmp_path / "density.md").is_file()
    res = cli("bench", "train", "--quick", "--threads", "1", "--variants", "gpt,aogpt", "--out", tmp_path, "--json",
              "--no-progress")
    assert res.code == 0, res.err
    assert res.json["variants"] == ["gpt", "aogpt"] and (tmp_path / "train.md").is_file()


@pytest.mark.parametrize("args, message", [
    (["generate", "--quick", "--steps", "64"], "must lie in 1..n"),
    (["generate", "--quick", "--steps", "x"], "bad steps list"),
    (["generate", "--quick", "--methods", "aogpt,sedd"], "unknown method"),
    (["generate", "--quick", "--checkpoint", "nowhere"], "VARIANT=PATH"),
    (["generate", "--quick", "--checkpoint", "aogpt=/no/such/run"], "does not exist"),
    (["density", "--quick", "--width", "30", "--heads", "4"], "width divisible"),
    (["density", "--quick", "--threads", "0"], "--threads"),
    (["density", "--quick", "--device", "cuda:x"], "device"),
    (["train", "--quick", "--variants", "bert"], "unknown variant"),
    (["train", "--quick", "--steps", "0"], "positive"),
    (["generate", "--n", "abc"], "invalid int"),
])
def test_bad_input_exits_2(cli, tmp_path, args, message):
    res = cli("bench", *args, "--out", tmp_path, "--no-progress")
    assert res.code == 2
    assert res.err.strip().splitlines()[-1].startswith("error:") and message in res.err
    assert "Traceback" not in res.err
