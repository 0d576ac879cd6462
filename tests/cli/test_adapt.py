"""`aogpt adapt` end to end: a tiny Llama from `transformers` adapted, its tokenizer used to prepare
data, fine-tuned with the backbone frozen at first, then sampled (random order, infilling,
speculative), evaluated, exported to `transformers` and scored by the harness like any run."""

from __future__ import annotations

from pathlib import Path

import torch

import aogpt
from aogpt.checkpoint import list_checkpoints, read_weights, weights_of
from tests.adaptation.conftest import make_hf

HARNESS = Path(__file__).resolve().parents[1] / "fixtures" / "harness"


def test_adapted_llama_goes_through_every_command(cli, tmp_path, make_corpus):
    src = make_hf(tmp_path, "llama")
    adapted = tmp_path / "adapted"
    res = cli("adapt", "--from", src, "--variant", "aogpt", "--out", adapted, "--json")
    assert res.code == 0, res.err
    assert res.json["kind"] == "LlamaForCausalLM" and "beginning-of-text token" in res.out
    assert aogpt.load(adapted).tokenizer.spec == "hf"

    data = tmp_path / "data"
    res = cli("prepare", "--corpus", make_corpus(tmp_path / "corpus", docs=6, words=200), "--tokenizer", adapted,
              "--out", data, "--no-progress")
    assert res.code == 0, res.err

    run = tmp_path / "run"
    res = cli("train", "--preset", "tiny", "--variant", "aogpt", "--init-from", adapted, "--data", data, "--out", run,
              "--max-steps", "2", "--batch-size", "2", "--set", "train.freeze_backbone_steps=2", "--no-progress")
    assert res.code == 0, res.err
    before = weights_of(read_weights(adapted), "raw")
    after = weights_of(read_weights(list_checkpoints(run)[-1]), "raw")
    pathway = {n for n in before if "wtpe" in n or "adaLN" in n}
    assert all(torch.equal(before[n], after[n]) for n in before if n not in pathway)  # the backbone was frozen
    assert any(not torch.equal(before[n], after[n]) for n in pathway)  # the target pathway learned

    for extra in (["--order", "random"], ["--infill", "king [MASK:4] sea"], ["--speculative", "2"]):
        res = cli("sample", "--checkpoint", run, "--length", "16", "--seed", "1", "--no-progress", *extra)
        assert res.code == 0, (extra, res.err)
    res = cli("eval", "--checkpoint", run, "--data", data, "--order", "random", "--json")
    assert res.code == 0, res.err

    from transformers import AutoModelForCausalLM

    res = cli("export", run, "--format", "hf", "--out", tmp_path / "hf")
    assert res.code == 0, res.err
    ours = aogpt.load(run)
    ids = torch.tensor([ours.tokenizer.encode("the king and the queen")])
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    logits, _ = ours.model(ids, with_last_slot=True)
    torch.testing.assert_close(hf(ids).logits[:, :-1], logits[:, 1:-1], atol=1e-5, rtol=1e-5)
    assert aogpt.load(tmp_path / "hf").tokenizer.encode("the king") == ours.tokenizer.encode("the king")

    res = cli("harness", "--checkpoint", run, "--tasks", "aogpt_last_word", "--include-path", HARNESS)
    assert res.code == 0, res.err


def test_data_of_another_tokenizer_is_refused(cli, tmp_path, bytes_data):
    adapted = tmp_path / "adapted"
    assert cli("adapt", "--from", make_hf(tmp_path, "llama"), "--out", adapted).code == 0
    res = cli("train", "--variant", "aogpt", "--init-from", adapted, "--data", bytes_data, "--out", tmp_path / "r")
    assert res.code == 2 and "was prepared with tokenizer bytes, not hf" in res.err


def test_the_plan_line_names_the_start_slot_and_a_source_without_a_tokenizer_is_one_error(cli, capsys, tmp_path):
    res = cli("adapt", "--from", make_hf(tmp_path, "gpt2"), "--variant", "sigma", "--out", tmp_path / "a", "--json")
    assert res.code == 0, res.err
    start = "the source's beginning-of-text token '<|endoftext|>' (id 50256, its tokenizer's bos_token)"
    assert f"start slot: {start}" in res.out and res.json["start_slot"] == start
    res = cli("adapt", "--from", make_hf(tmp_path, "qwen2", bos=False), "--out", tmp_path / "b")
    assert res.code == 0 and "start slot: the mean token embedding" in res.out
    sources = {arch: make_hf(tmp_path, arch, tokenizer=False) for arch in ("gpt2", "qwen2", "llama")}
    capsys.readouterr()  # transformers' saving bars
    for arch, src in sources.items():
        res = cli("adapt", "--from", src, "--out", tmp_path / f"out-{arch}")
        assert res.code == 2 and res.err.startswith(f"error: {src} has no tokenizer files"), res.err
        assert len(res.err.strip().splitlines()) == 1 and "Traceback" not in res.err
        assert not (tmp_path / f"out-{arch}").exists()


def test_a_gated_pathway_fine_tunes_and_stays_its_source_left_to_right(cli, tmp_path, make_corpus):
    """`--pathway gated`: the checkpoint carries its recipe (adapt-gated) and pathway; `train --init-from`
    trains the pathway alone; read left to right the tuned model gives the source's logits bit for bit;
    it samples (random order, left to right, infilling) and exports."""
    src = make_hf(tmp_path, "gpt2")
    adapted = tmp_path / "gated"
    res = cli("adapt", "--from", src, "--out", adapted, "--pathway", "gated", "--rank", "4", "--json")
    assert res.code == 0, res.err
    assert res.json["pathway"] == "gated" and res.json["rank"] == 4 and res.json["recipe"] == "adapt-gated"
    assert 0 < res.json["trained_parameters"] < res.json["parameters"] and "frozen" in res.out
    data = tmp_path / "data"
    assert cli("prepare", "--corpus", make_corpus(tmp_path / "corpus", docs=6, words=200), "--tokenizer", adapted,
               "--out", data, "--no-progress").code == 0
    run = tmp_path / "run"
    res = cli("train", "--init-from", adapted, "--data", data, "--out", run, "--max-steps", "3", "--batch-size", "2",
              "--set", "train.eval_interval=3", "--set", "train.compile=off", "--no-progress")
    assert res.code == 0, res.err
    assert "recipe: adapt-gated" in res.out
    before = weights_of(read_weights(adapted), "raw")
    after = weights_of(read_weights(list_checkpoints(run)[-1]), "raw")
    from aogpt.pathway import is_pathway

    assert all(torch.equal(before[n], after[n]) for n in before if not is_pathway(n))  # the source: frozen
    assert any(not torch.equal(before[n], after[n]) for n in before if is_pathway(n))  # the pathway learned
    start, tuned = aogpt.load(adapted, weights="raw").model, aogpt.load(run).model
    ids = torch.tensor([aogpt.load(run).tokenizer.encode("the king and the queen at sea")])
    with torch.no_grad():
        assert torch.equal(tuned(ids)[0], start(ids)[0])
    for extra in (["--order", "random"], ["--order", "l2r"], ["--infill", "king [MASK:4] sea"]):
        res = cli("sample", "--checkpoint", run, "--length", "16", "--seed", "1", "--no-progress", *extra)
        assert res.code == 0, (extra, res.err)
    assert cli("export", run, "--format", "hf", "--out", tmp_path / "hf").code == 0
    assert aogpt.load(tmp_path / "hf").config.pathway == "gated"


def test_pathway_flags_are_checked(cli, capsys, tmp_path):
    src = make_hf(tmp_path, "gpt2")
    capsys.readouterr()  # transformers' saving bars
    res = cli("adapt", "--from", src, "--out", tmp_path / "a", "--rank", "4")
    assert res.code == 2 and res.err.startswith("error: --rank is the rank of a gated pathway's deltas"), res.err
    res = cli("adapt", "--from", src, "--out", tmp_path / "b", "--pathway", "gated", "--rank", "0")
    assert res.code == 2 and "at least 1" in res.err
    res = cli("adapt", "--from", src, "--out", tmp_path / "c", "--pathway", "gated", "--rank", "full", "--json")
    assert res.code == 0 and res.json["rank"] == 0
