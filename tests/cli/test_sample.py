"""`aogpt sample` end to end on tiny checkpoints (bytes tokenizer): output checked against the Python
API and the templates, and every bad input is a one-line `error:` with exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import aogpt
from aogpt.precision import name_of
from tests.helpers import random_checkpoint


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sample")
    return {"aogpt": random_checkpoint(root, "aogpt", block_size=48, scale=0.3, ema_scale=0.5),
            "gpt": random_checkpoint(root, "gpt", block_size=48, scale=0.3, ema_scale=0.5)}


def test_help(cli):
    res = cli("sample", "--help")
    assert res.code == 0 and "--infill" in res.out and "--top-p" in res.out and "--steps" in res.out


def test_unconditional_json_matches_the_python_api(cli, runs):
    res = cli("sample", "--checkpoint", runs["aogpt"], "--num-samples", "3", "--length", "20", "--steps", "7",
              "--temperature", "0.9", "--top-p", "0.95", "--seed", "5", "--json", "--device", "cpu")
    assert res.code == 0, res.err
    summary = res.json
    assert summary["settings"]["steps"] == 7 and summary["settings"]["policy"] == "bernoulli"
    assert summary["settings"]["seed"] == 5 and summary["timing"]["seconds"] > 0
    # the CLI's default (`--dtype auto`): the precision its probe timed faster (`aogpt.generation.precision`)
    dtype = {name_of(d): d for d in (torch.float32, torch.bfloat16)}[summary["precision"]]
    assert "auto" in summary["precision_why"]
    want = aogpt.load(runs["aogpt"], dtype=dtype).generate(num_samples=3, length=20, steps=7, temperature=0.9,
                                                           top_p=0.95, seed=5)
    assert summary["tokens"] == want.tokens.tolist()
    assert summary["samples"] == want.texts
    assert all(t in res.out for t in want.texts)
    assert res.out.count("--- sample") == 3 and "settings:" in res.err and "ema weights" in res.err
    assert max(max(row) for row in summary["tokens"]) < 257  # padding ids are never sampled


def test_until_eot_ends_each_text_at_its_first_end_of_text_token_in_position_order(cli, runs):
    base = ("sample", "--checkpoint", runs["aogpt"], "--prompt", "To", "-n", "12", "--length", "40", "--seed", "2",
            "--json", "--dtype", "fp32")
    whole, cut = cli(*base), cli(*base, "--until-eot")
    assert cut.code == 0, cut.err
    assert cut.json["tokens"] == whole.json["tokens"]  # the same samples; only their texts end earlier
    eot, tok = 256, aogpt.load(runs["aogpt"]).tokenizer
    ended = 0
    for row, end, text in zip(cut.json["tokens"], cut.json["text_ends"], cut.json["samples"], strict=True):
        first = row.index(eot, 2) if eot in row[2:] else None
        assert end == first and text == tok.decode(row[:first] if first is not None else row)
        ended += first is not None
    assert 0 < ended < 12, "the seed must give samples with and without an end-of-text token"
    assert f"{ended} of 12 sample(s) ended before --length" in cut.err


def test_raw_weights_differ_and_no_cache_agrees(cli, runs):
    base = ("sample", "--checkpoint", runs["aogpt"], "--num-samples", "2", "--length", "16", "--seed", "3",
            "--json", "--policy", "count", "--steps", "5")
    ema, raw, nocache = cli(*base), cli(*base, "--weights", "raw"), cli(*base, "--no-cache")
    assert ema.json["tokens"] != raw.json["tokens"]
    assert ema.json["tokens"] == nocache.json["tokens"] and nocache.json["settings"]["use_cache"] is False
    previous = cli(*base, "--decode-path", "reference")  # the reference decode path draws the same sample
    assert previous.json["tokens"] == ema.json["tokens"] and previous.json["settings"]["decode_path"] == "reference"
    assert ema.json["settings"]["decode_path"] == "fast" and "the reference decode path" in previous.err


def test_prompt_infill_and_known_tokens_are_kept(cli, runs):
    res = cli("sample", "--checkpoint", runs["aogpt"], "--prompt", "To be", "--length", "16", "-n", "2", "--json")
    assert res.code == 0, res.err
    assert all(s.encode()[:5] == b"To be" for s in res.json["samples"])
    res = cli("sample", "--checkpoint", runs["aogpt"], "--infill", "To be, or [MASK:6] to be", "--steps", "3",
              "-n", "4", "--json", "--order", "l2r")
    assert res.code == 0, res.err
    for row in res.json["tokens"]:
        assert bytes(row[:10]) == b"To be, or " and bytes(row[16:]) == b" to be"
    assert res.json["settings"]["known_tokens"] == 16 and res.json["settings"]["length"] == 22
    res = cli("sample", "--checkpoint", runs["aogpt"], "--known", "0=65,7=66", "--length", "10", "--json")
    assert res.code == 0, res.err
    assert res.json["tokens"][0][0] == 65 and res.json["tokens"][0][7] == 66


def test_adaptive_orders_match_the_python_api(cli, runs):
    res = cli("sample", "--checkpoint", runs["aogpt"], "--infill", "To be, or [MASK:6] to be", "-n", "3",
              "--order", "margin", "--candidates", "4", "--threshold", "0.5", "--seed", "2", "--json")
    assert res.code == 0, res.err
    s = res.json["settings"]
    assert (s["order"], s["candidates"], s["threshold"], s["policy"]) == ("margin", 4, 0.5, "count")
    assert "order margin (4 candidates per step) (threshold 0.5)" in res.err
    want = aogpt.load(runs["aogpt"]).infill("To be, or [MASK:6] to be", num_samples=3, order="margin",
                                            candidates=4, threshold=0.5, seed=2)
    assert res.json["tokens"] == want.tokens.tolist()
    assert all(bytes(row[:10]) == b"To be, or " for row in res.json["tokens"])
    res = cli("sample", "--checkpoint", runs["aogpt"], "--length", "12", "--order", "confidence", "--greedy",
              "--json")
    assert res.code == 0 and res.json["timing"]["slot_evaluations"] == 12 * 13 // 2


def test_gpt_samples_left_to_right_with_the_same_machinery(cli, runs):
    res = cli("sample", "--checkpoint", runs["gpt"], "--prompt", "ab", "--length", "12", "--json", "--seed", "9")
    assert res.code == 0, res.err
    s = res.json["settings"]
    assert s["policy"] == "count" and s["order"] == "l2r" and s["steps"] == 10 and s["use_cache"] is True
    assert res.json["timing"]["forwards"] == 10


@pytest.mark.parametrize("args,match", [
    (("--infill", "no blank here"), "no blank"),
    (("--infill", "x" * 40 + "[MASK:10]"), "context"),
    (("--steps", "0", "--length", "8"), "steps"),
    (("--steps", "9", "--length", "8"), "steps"),
    (("--top-p", "0"), "top-p"),
    (("--top-p", "1.5"), "top-p"),
    (("--temperature", "0"), "temperature"),
    (("--temperature", "-1"), "temperature"),
    (("--length", "49"), "context"),
    (("--order", "backwards"), "order"),
    (("--known", "0=1"), "--length"),
    (("--known", "zero=1", "--length", "4"), "known"),
    (("--device", "tpu"), "device"),
    (("--candidates", "4"), "adaptive order"),
    (("--order", "margin", "--threshold", "0"), "threshold"),
    (("--order", "entropy", "--candidates", "0"), "candidates"),
    (("--infill", "a[MASK]b", "--until-eot"), "--until-eot ends a continuation"),
])
def test_bad_input_is_one_line_exit_2(cli, runs, args, match):
    res = cli("sample", "--checkpoint", runs["aogpt"], *args)
    assert res.code == 2
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], res.err
    assert "Traceback" not in res.err


@pytest.mark.parametrize("args,match", [
    (("--infill", "a[MASK]b"), "prefix"),
    (("--steps", "4", "--length", "12"), "several tokens per step"),
    (("--order", "random"), "left to right"),
    (("--policy", "bernoulli"), "policy count"),
    (("--order", "confidence"), "cannot choose its own unmasking order"),
])
def test_gpt_refuses_what_it_cannot_do(cli, runs, args, match):
    res = cli("sample", "--checkpoint", runs["gpt"], *args)
    assert res.code == 2 and res.err.startswith("error: ") and match in res.err, res.err


def test_missing_checkpoint_and_both_prompt_and_infill(cli, tmp_path):
    res = cli("sample", "--checkpoint", tmp_path / "nothing")
    assert res.code == 2 and res.err.startswith("error: ")
    res = cli("sample", "--checkpoint", tmp_path, "--prompt", "a", "--infill", "[MASK]")
    assert res.code == 2 and res.err.startswith("error: ")


def test_speculative_sampling_reports_its_work(cli, tiny_run):
    res = cli("sample", "--checkpoint", tiny_run, "-n", "2", "--length", "16", "--speculative", "3", "--json",
              "--no-progress")
    assert res.code == 0, res.err
    timing = res.json["timing"]
    assert 1.0 <= timing["tokens_per_forward"] <= 3.0 and "acceptance_by_position" in timing
    assert "speculative decoding" in res.err and res.json["settings"]["speculative"] == 3
    auto = cli("sample", "--checkpoint", tiny_run, "--length", "12", "--speculative", "auto", "--json", "--no-progress")
    assert auto.code == 0 and auto.json["settings"]["speculative"] == "auto"
    for bad in (["--speculative", "0"], ["--speculative", "x"], ["--speculative", "2", "--steps", "4"]):
        out = cli("sample", "--checkpoint", tiny_run, "--length", "12", *bad)
        assert out.code == 2 and out.err.startswith("error:") and "Traceback" not in out.err


def test_word_check_counts_the_samples_words_found_in_the_training_text(cli, runs, bytes_data):
    """--word-check DATA: the share of all samples' 3+-letter words that occur in DATA's training text,
    recomputed here from the samples the command printed in --json."""
    from aogpt.data import PreparedData
    from aogpt.measures import vocabulary, word_share

    res = cli("sample", "--checkpoint", runs["aogpt"], "-n", "4", "--show", "1", "--length", "40", "--seed", "2",
              "--word-check", bytes_data, "--json", "--no-progress")
    assert res.code == 0, res.err
    data = PreparedData(bytes_data)
    want = word_share(res.json["samples"], vocabulary(data.tokenizer.decode(data.split("train").tolist())))
    assert res.json["words"] == want.total and res.json["word_share"] == pytest.approx(want.share, nan_ok=True)
    assert f"words in all 4 samples: {want.describe()}" in res.out
    assert res.out.count("--- sample") == 1 and "--- sample 1 of 4 ---" in res.out


def test_passage_infill_uses_the_default_method_and_checks_the_filled_words(cli, runs, bytes_data):
    """A passage with [[hidden words]]: template, fills, original and the original's exact bits per byte;
    the default method is announced; --word-check counts only the filled words."""
    import math

    from aogpt.data import PreparedData
    from aogpt.generation.infill import DEFAULT_METHOD, fill, fill_nll, filled_words, parse_passage
    from aogpt.measures import vocabulary

    passage = "To be, or [[not to]] be, that is [[the question]]."
    res = cli("sample", "--checkpoint", runs["aogpt"], "--infill", passage, "-n", "2", "--seed", "4",
              "--word-check", bytes_data, "--json", "--no-progress", "--dtype", "float32", "--device", "cpu")
    assert res.code == 0, res.err
    assert "infilling: left to right inside each gap (the default for --infill" in res.err
    assert "template:\nTo be, or [MASK:6] be, that is [MASK:12]." in res.out
    assert "original:\nTo be, or not to be, that is the question." in res.out
    loaded = aogpt.load(runs["aogpt"])
    p = parse_passage(passage, loaded.tokenizer)
    want = fill(loaded.model, p.slots, method=DEFAULT_METHOD, num_samples=2, seed=4, tokenizer=loaded.tokenizer)
    assert res.json["tokens"] == want.tokens.tolist()
    bpb = float(fill_nll(loaded.model, p.tokens[None], ~p.hidden)[0]) / 18 / math.log(2)
    assert res.json["passage"]["original_bpb"] == pytest.approx(bpb, rel=1e-6)
    data = PreparedData(bytes_data)
    vocab = vocabulary(data.tokenizer.decode(data.split("train").tolist()))
    found = [w for row in want.tokens for w in filled_words(loaded.tokenizer, row, want.known)]
    assert res.json["words"] == len(found) and "words in the filled words of all 2 samples" in res.out
    share = sum(w in vocab for w in found) / len(found) if found else math.nan
    assert res.json["word_share"] == pytest.approx(share, nan_ok=True)
    helptext = " ".join(cli("sample", "--help").out.split())
    assert f"{DEFAULT_METHOD} (left to right inside each gap; the default" in helptext
    res = cli("sample", "--checkpoint", runs["aogpt"], "--infill", passage, "-n", "2", "--seed", "4", "--json",
              "--no-progress", "--dtype", "float32", "--device", "cpu", "--infill-method", "best-of:3")
    assert res.code == 0 and "infilling: best of 3 drafts" in res.err and "the default" not in res.err
    assert len(res.json["settings"]["draft_nll"]) == 2
    bad = cli("sample", "--checkpoint", runs["aogpt"], "--infill", "a [[b]] [MASK]", "--no-progress")
    assert bad.code == 2 and "mixes" in bad.err and len(bad.err.strip().splitlines()) == 1
    bad = cli("sample", "--checkpoint", runs["aogpt"], "--infill", "a [MASK]", "--infill-method", "best-of:x")
    assert bad.code == 2 and "unknown infilling method" in bad.err
