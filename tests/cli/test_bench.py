"""`aogpt bench ...` end to end: --help, --quick --json, outputs on disk, bad input exits 2."""

from __future__ import annotations

import pytest
import torch


def recorded(env: dict, precision: list[str] | None) -> bool:
    """The report carries the shared environment record (`aogpt.bench.environment`), finished."""
    from aogpt import capability

    return (env["cpu_class"] == capability.cpu_class() and env["precision"] == precision
            and {"threads", "torch", "load_average", "load_average_after"} <= set(env))


@pytest.fixture(autouse=True)
def restore_threads():
    """`--threads` sets torch's global thread count; keep it from leaking into other tests."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("name", ["generate", "density", "train", "eval", "prepare", "adaptive", "recipe"])
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
    assert set(summary["seconds"]) == {"aogpt", "aogpt-count", "aogpt-nocache", "encoder", "encoder-noskip", "gpt",
                                       "hf-gpt2"}
    assert "| T | aogpt (wall / CPU) |" in res.out and "What this run shows:" in res.out
    for name in ("generate.md", "generate.json", "generate.png"):
        assert (tmp_path / name).is_file()
    assert recorded(summary["environment"], ["auto"]) and "CPU class" in res.out


def test_generate_subset_of_methods_and_sizes(cli, tmp_path):
    res = cli("bench", "generate", "--n", "16", "--batch", "2", "--steps", "16", "--repeats", "1", "--layers", "1",
              "--width", "16", "--heads", "2", "--vocab", "32", "--methods", "aogpt,gpt", "--threads", "1",
              "--out", tmp_path, "--json", "--no-progress")
    assert res.code == 0, res.err
    s = res.json
    assert s["size"] == {"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 32}
    assert set(s["seconds"]) == {"aogpt", "gpt"} and s["ratios"]["n"]["aogpt/gpt"] > 0


def test_density_and_train_quick_json(cli, tmp_path):
    res = cli("bench", "density", "--quick", "--threads", "1", "--out", tmp_path, "--json", "--no-progress")
    assert res.code == 0, res.err
    assert res.json["forwards_per_sequence"]["encoder-mdm"] == 32 and (tmp_path / "density.md").is_file()
    assert recorded(res.json["environment"], ["fp32"])
    res = cli("bench", "train", "--quick", "--threads", "1", "--variants", "gpt,aogpt", "--out", tmp_path, "--json",
              "--no-progress")
    assert res.code == 0, res.err
    assert res.json["variants"] == ["gpt", "aogpt"] and (tmp_path / "train.md").is_file()
    assert recorded(res.json["environment"], ["auto"])


def test_eval_quick_json(cli, tmp_path):
    res = cli("bench", "eval", "--quick", "--threads", "1", "--members", "3", "--out", tmp_path, "--json",
              "--no-progress")
    assert res.code == 0, res.err
    s = res.json
    assert s["command"] == "bench eval" and s["n"] == 32 and s["batch"] == 4 and s["members"] == 3
    contenders = {"train", "eval-l2r", "eval-random", "ensemble-base", "ensemble"}
    assert set(s["seconds"]) == set(s["cpu_seconds"]) == set(s["contenders"]) == contenders
    assert s["environment"]["threads"] == 1 and recorded(s["environment"], ["fp32"])
    for by, sec in (("ratios", s["seconds"]), ("cpu_ratios", s["cpu_seconds"])):
        assert s[by]["train/eval-l2r"] == pytest.approx(sec["train"] / sec["eval-l2r"])
        assert s[by]["train/eval-random"] == pytest.approx(sec["train"] / sec["eval-random"])
        assert s[by]["member/ensemble-base"] == pytest.approx(
            (sec["ensemble"] - sec["ensemble-base"]) / 2 / sec["ensemble-base"])
    assert s["targets"][0]["value"] == s["ratios"]["train/eval-l2r"]
    assert "| evaluation, left to right (exact NLL) |" in res.out and "Target:" in res.out
    assert (tmp_path / "eval.md").is_file() and (tmp_path / "eval.json").is_file()


def test_prepare_local_corpus_json(cli, tmp_path, make_corpus):
    corpus = make_corpus(tmp_path / "corpus", docs=3, words=40)
    res = cli("bench", "prepare", "--corpus", corpus, "--tokenizer", "bytes", "--repeats", "2", "--out",
              tmp_path / "out", "--json", "--no-progress")
    assert res.code == 0, res.err
    s = res.json
    assert s["command"] == "bench prepare" and s["benchmark"] == "prepare" and s["repeats"] == 2
    assert s["corpus"] == str(corpus) and s["tokenizer"] == "bytes" and s["documents"] == 3
    assert set(s["seconds"]) == set(s["cpu_seconds"]) == {"prepare"} and len(s["cpu_runs"]["prepare"]) == 2
    assert s["tokens_per_second"] == pytest.approx(s["tokens"] / s["seconds"]["prepare"])
    assert s["targets"][0]["value"] == pytest.approx(s["seconds"]["prepare"] / 10)
    assert recorded(s["environment"], None) and (tmp_path / "out" / "prepare.md").is_file()


def test_prepare_workers_bench_json(cli, tmp_path):
    res = cli("bench", "prepare", "--workers-bench", "--quick", "--tokenizer", "bytes", "--synthetic-mb", "0.02",
              "--out", tmp_path, "--json", "--no-progress")
    assert res.code == 0, res.err
    s = res.json
    assert s["benchmark"] == "prepare-workers" and s["workers"] == 2 and s["repeats"] == 1
    assert s["ratios"]["threads/workers"] == pytest.approx(s["seconds"]["threads"] / s["seconds"]["workers"])
    assert "2 worker processes" in res.out and (tmp_path / "prepare-workers.json").is_file()


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
    (["train", "--quick", "--steps", "0"], "argument --steps: must be in [1, 1000], got 0"),
    (["generate", "--n", "abc"], "must be an integer"),
    (["eval", "--quick", "--repeats", "0"], "argument --repeats"),
    (["eval", "--quick", "--members", "1"], "argument --members: must be in [2, 1024]"),
    (["eval", "--quick", "--n", "2"], "n must be at least 3"),
    (["eval", "--quick", "--batch", "0"], "batch"),
    (["eval", "--quick", "--width", "30", "--heads", "4"], "width divisible"),
    (["eval", "--quick", "--threads", "0"], "--threads"),
    (["eval", "--quick", "--checkpoint", "aogpt=x"], "unrecognized arguments"),
    (["prepare", "--repeats", "0"], "argument --repeats"),
    (["prepare", "--quick", "--corpus", "nosuchcorpus"], "unknown corpus"),
    (["prepare", "--quick", "--tokenizer", "gpt-2"], "unknown tokenizer spec"),
    (["prepare", "--quick", "--max-docs", "0"], "--max-docs"),
    (["prepare", "--quick", "--threads", "0"], "--threads"),
    (["prepare", "--quick", "--workers", "3"], "only for --workers-bench"),
    (["prepare", "--workers-bench", "--workers", "1"], "--workers must be at least 2"),
    (["prepare", "--workers-bench", "--synthetic-mb", "0"], "--synthetic-mb"),
    (["prepare", "--workers-bench", "--corpus", "shakespeare"], "not used by --workers-bench"),
    (["prepare", "--device", "cpu"], "unrecognized arguments"),
])
def test_bad_input_exits_2(cli, tmp_path, monkeypatch, args, message):
    monkeypatch.setattr("os.getloadavg", lambda: (0.0, 0.0, 0.0))  # no busy-machine note: the error alone
    res = cli("bench", *args, "--out", tmp_path, "--no-progress")
    assert res.code == 2
    # on a machine busier than its CPUs the thread note comes first: the error is still one line
    lines = [line for line in res.err.strip().splitlines() if not line.startswith("the machine is busy")]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in res.err
    assert "Traceback" not in res.err


def test_adaptive_quick_json(cli, tmp_path):
    res = cli("bench", "adaptive", "--quick", "--no-text", "--threads", "1", "--puzzles", "2", "--seeds", "1",
              "--train-steps", "2",
              "--orders", "random,margin", "--out", tmp_path, "--work", tmp_path / "work", "--json", "--no-progress")
    assert res.code == 0, res.err
    s = res.json
    assert s["command"] == "bench adaptive" and s["task"] == "walk" and s["text_run"] is None
    assert [(r["model"], r["order"]) for r in s["solve"]] == [("aogpt", "random"), ("aogpt", "margin"),
                                                             ("encoder-mdm", "random"), ("encoder-mdm", "margin")]
    assert "| model | order | solved | 95% CI |" in res.out
    for name in ("adaptive.md", "adaptive.json", "adaptive.png"):
        assert (tmp_path / name).is_file()
    bad = cli("bench", "adaptive", "--quick", "--orders", "sideways", "--out", tmp_path, "--threads", "1")
    assert bad.code == 2 and bad.err.startswith("error: unknown order(s) sideways")


def test_recipe_quick_json(cli, tmp_path):
    res = cli("bench", "recipe", "--quick", "--data-root", tmp_path / "data", "--out", tmp_path, "--json",
              "--no-progress")
    assert res.code == 0, res.err
    row = res.json["rows"][0]
    assert res.json["command"] == "bench recipe" and row["name"] == "quick" and row["steps"] == 3
    assert row["l2r_ema"]["bpb"] > 0 and (tmp_path / "recipe.md").is_file() and (tmp_path / "recipe.json").is_file()
    assert "bpb l2r EMA" in res.out
    assert torch.get_num_threads() == 1  # one thread unless told: CPU time per step is what it compares


@pytest.mark.parametrize("args, fragment", [
    (("--candidates", "nope", "--steps", "2"), "unknown candidate"),
    (("--candidates", "old-cpu-small"), "no budget per candidate"),
    (("--candidate", "x:lr=0.01", "--steps", "0"), "--steps: must be in [1,"),
    (("--candidates", "old-cpu-small", "--calibrate", "1"), "--calibrate: must be in [2,"),
])
def test_recipe_bad_input(cli, tmp_path, args, fragment):
    res = cli("bench", "recipe", "--data-root", tmp_path, *args)
    assert res.code == 2 and res.err.startswith("error: ") and fragment in res.err, res.err


@pytest.mark.parametrize("args", [
    ["generate", "--quick", "--steps", "4", "--methods", "aogpt,gpt"],
    ["speculative", "--quick", "--checkpoint", "aogpt={run}", "--n", "16", "--batch", "2", "--k", "2"],
    ["density", "--quick"],
    ["train", "--quick", "--variants", "gpt"],
    ["eval", "--quick", "--members", "2", "--repeats", "1"],
    ["attention", "--quick"],
    ["prepare", "--workers-bench", "--quick", "--tokenizer", "bytes", "--synthetic-mb", "0.01"],
], ids=lambda a: a[0])
def test_every_bench_completes_on_a_busy_machine_with_its_output_to_a_file(cli, tmp_path, monkeypatch, tiny_run,
                                                                          args):
    """A busy machine (load above the cores) is said once on stderr, through the heartbeat when stderr
    is not a terminal (as here: captured), and the benchmark completes (prepare chooses its own
    threads per mode, so it has no note to give)."""
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    monkeypatch.setenv("AOGPT_HEARTBEAT_SECONDS", "0")
    res = cli("bench", *[a.format(run=tiny_run) for a in args], "--out", tmp_path)
    assert res.code == 0, res.err
    assert res.err.count("the machine is busy (load 64.0") == (args[0] != "prepare") and "Traceback" not in res.err


def test_a_precision_this_cpu_cannot_compute_in_is_skipped_with_a_note(cli, tmp_path, as_cpu):
    """The sibling of the two-precision benchmark tests on a CPU without bf16 (AVX2): bf16 is skipped in
    one line, fp32 is timed; bf16 alone is refused in one line."""
    from aogpt import capability

    if capability.cpu().arch != "x86":
        pytest.skip("the avx2 class is an x86 class")
    as_cpu("avx2")
    res = cli("bench", "generate", "--quick", "--threads", "1", "--steps", "4", "--methods", "aogpt,gpt",
              "--dtype", "fp32,bfloat16", "--out", tmp_path, "--json", "--no-progress")
    assert res.code == 0, res.err
    assert "note: bf16 skipped: this CPU (avx2) has no bf16 units" in res.err and res.json["precision"] == "fp32"
    for cmd in (["generate", "--quick", "--steps", "4"], ["train", "--quick", "--variants", "gpt"]):
        res = cli("bench", *cmd, "--dtype", "bf16", "--out", tmp_path, "--threads", "1")
        assert res.code == 2 and res.err.startswith("error: bf16 skipped: this CPU (avx2) has no bf16 units")
        assert len(res.err.strip().splitlines()) == 1
