"""`aogpt eval` end to end on tiny checkpoints: JSON summaries checked against direct forwards,
tables, suites from local files, prepared data, generation perplexity, and one-line user errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from aogpt.checkpoint import load
from aogpt.cli import main
from aogpt.evaluation.genppl import CheckpointEvaluator, score_samples
from tests.helpers import random_checkpoint

FIX = Path(__file__).parents[1] / "fixtures" / "zeroshot"
TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 6


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpts")
    text = root / "play.txt"
    text.write_text(TEXT, encoding="utf-8")
    return {"aogpt": random_checkpoint(root, "aogpt", block_size=16, scale=0.2),
            "gpt": random_checkpoint(root, "gpt", block_size=16, scale=0.2), "text": text}


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(["eval", "--device", "cpu", *argv])
    except SystemExit as exc:  # the parser's own errors (a number out of its range)
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def summary(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def byte_blocks(text: str, n: int) -> torch.Tensor:
    stream = [*text.encode("utf-8"), 256]
    return torch.tensor(stream[: len(stream) // n * n]).view(-1, n)


def test_l2r_json_summary_matches_a_direct_forward(ckpts: dict, capsys: pytest.CaptureFixture) -> None:
    rc, out, _ = run(capsys, "--checkpoint", str(ckpts["aogpt"]), "--data", str(ckpts["text"]), "--json")
    assert rc == 0
    s = summary(out)
    blocks = byte_blocks(TEXT, 16)  # default block length: min(1024, context 16)
    model = load(ckpts["aogpt"]).model
    with torch.no_grad():
        want = float(model(blocks)[1].double().mean())
    assert s["tokens"] == blocks.numel() and s["step"] == 10 and s["weights"] == "ema"
    assert s["nll"] == pytest.approx(want, abs=1e-5) and s["ppl"] == pytest.approx(math.exp(s["nll"]))
    assert s["se"] is None and s["results"][0]["order"] == "l2r"
    text_bytes = len(bytes(blocks[blocks != 256].tolist()))  # the scored text's bytes; EOT stands for none
    assert s["bytes"] == text_bytes
    assert s["bpb"] == pytest.approx(want * blocks.numel() / text_bytes / math.log(2), abs=1e-5)
    assert f"bits/byte {s['bpb']:.4f}" in out


def test_orders_and_table(ckpts: dict, capsys: pytest.CaptureFixture) -> None:
    rc, out, _ = run(capsys, "--checkpoint", str(ckpts["aogpt"]), "--data", str(ckpts["text"]), "--order",
                     "l2r,random", "-K", "3", "--seed", "4", "--json")
    assert rc == 0
    s = summary(out)
    l2r, rnd = s["results"]
    assert rnd["order"] == "random" and rnd["num_orders"] == 3 and len(rnd["order_means"]) == 3
    assert rnd["ci95"][0] < rnd["nll"] < rnd["ci95"][1] and rnd["se"] > 0
    assert "| Model | play.txt |" in out.replace(str(ckpts["text"]), "play.txt")
    assert "(random)" in out and "(l2r)" in out
    rc, out2, _ = run(capsys, "--checkpoint", str(ckpts["aogpt"]), "--data", str(ckpts["text"]), "--order",
                      "random", "-K", "3", "--seed", "4", "--json")
    assert summary(out2)["nll"] == rnd["nll"]  # reproducible from the seed


def test_suites_from_local_files(ckpts: dict, capsys: pytest.CaptureFixture) -> None:
    rc, out, _ = run(capsys, "--checkpoint", str(ckpts["aogpt"]), "--suite", "ptb,lm1b", "--data-dir", str(FIX),
                     "--block-len", "8", "--json")
    assert rc == 0
    s = summary(out)
    assert [r["dataset"] for r in s["results"]] == ["ptb", "lm1b"]
    assert "| Model | PTB | 1BW |" in out
    texts = ["the company's shares weren't traded 1 1 1 days", "he paid $1 for the ? / item", "the investors' money"]
    stream = [b for t in texts for b in (*t.encode(), 256)]
    blocks = torch.tensor(stream[: len(stream) // 8 * 8]).view(-1, 8)
    with torch.no_grad():
        want = float(load(ckpts["aogpt"]).model(blocks)[1].double().mean())
    assert s["results"][0]["nll"] == pytest.approx(want, abs=1e-5)


def test_ensemble_flags(ckpts: dict, capsys: pytest.CaptureFixture) -> None:
    rc, out, _ = run(capsys, "--checkpoint", str(ckpts["aogpt"]), "--data", str(ckpts["text"]), "-M", "2",
                     "--ensemble-positions", "3", "-K", "2", "--max-batches", "1", "--batch-size", "2", "--json")
    assert rc == 0
    r = summary(out)["results"][0]
    assert r["ensemble"] == 2 and r["ensemble_positions"] == 3 and r["tokens"] == 32 and r["num_orders"] == 2


def test_prepared_data(ckpts: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from aogpt.data import PreparedData, prepare

    prepare(str(ckpts["text"]), "bytes", tmp_path / "bytes", progress=False, txt_docs="blank-lines",
            val_fraction=0.5)
    rc, out, _ = run(capsys, "--checkpoint", str(ckpts["gpt"]), "--data", str(tmp_path / "bytes"), "--json")
    assert rc == 0
    val = torch.cat(list(PreparedData(tmp_path / "bytes").iter_eval_batches("val", 8, 16)))
    with torch.no_grad():
        want = float(load(ckpts["gpt"]).model(val)[1].double().mean())
    s = summary(out)
    assert s["tokens"] == val.numel() and s["nll"] == pytest.approx(want, abs=1e-5)
    prepare(str(ckpts["text"]), "gpt2", tmp_path / "gpt2", progress=False)
    rc, _, err = run(capsys, "--checkpoint", str(ckpts["gpt"]), "--data", str(tmp_path / "gpt2"))
    assert rc == 2 and err.startswith("error: ") and "tokenizer gpt2" in err and "Traceback" not in err


def test_generation_perplexity(ckpts: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"text": "to be or not"}\n{"text": "the question<|endoftext|>junk"}\n')
    rc, out, _ = run(capsys, "--genppl", str(samples), "--evaluator", str(ckpts["gpt"]), "--json")
    assert rc == 0
    g = summary(out)["genppl"]
    direct = score_samples(CheckpointEvaluator(load(ckpts["gpt"])), ["to be or not", "the question<|endoftext|>x"])
    assert g["tokens"] == 12 + 13 and g["genppl"] == pytest.approx(direct.genppl, rel=1e-5)
    assert "generation perplexity" in out and "unigram entropy" in out
    rc, out, _ = run(capsys, "--checkpoint", str(ckpts["aogpt"]), "--genppl-samples", "2", "--gen-steps", "4",
                     "--evaluator", str(ckpts["gpt"]), "--json")
    assert rc == 0
    g = summary(out)["genppl"]
    assert g["samples"] == 2 and math.isfinite(g["genppl"]) and g["source"].startswith("generated")


@pytest.mark.parametrize("extra, what", [
    (["-K", "0", "--order", "random"], "argument --num-orders/-K: must be in [1, 10000], got 0"),
    (["-M", "0"], "argument --ensemble/-M"),
    (["--block-len", "17"], "exceeds the model's context of 16"),
    (["--data", "no-such-set"], "unknown data"),
    (["--suite", "imdb"], "unknown evaluation set"),
    (["--suite", "wikitext2", "--data-dir", "/nonexistent"], "no wikitext2 file"),
    (["--genppl", "x.jsonl"], "needs an evaluator"),
    (["--order", "random", "--variant-gpt"], "left to right only"),
])
def test_bad_input_is_a_one_line_error(ckpts: dict, capsys: pytest.CaptureFixture, extra: list, what: str) -> None:
    variant = "gpt" if "--variant-gpt" in extra else "aogpt"
    extra = [e for e in extra if e != "--variant-gpt"]
    base = ["--checkpoint", str(ckpts[variant])]
    if not any(e in ("--data", "--suite", "--genppl") for e in extra):
        base += ["--data", str(ckpts["text"])]
    rc, out, err = run(capsys, *base, *extra)
    assert rc == 2 and err.startswith("error: ") and what in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_nothing_to_do_and_help(capsys: pytest.CaptureFixture) -> None:
    rc, _, err = run(capsys)
    assert rc == 2 and "nothing to evaluate" in err
    with pytest.raises(SystemExit) as exc:
        main(["eval", "--help"])
    assert exc.value.code == 0 and "--num-orders" in capsys.readouterr().out


def test_infill_json_matches_the_library_on_the_same_cuts(ckpts: dict, capsys: pytest.CaptureFixture) -> None:
    from aogpt.evaluation.infill import make_cuts, span_nll

    rc, out, _ = run(capsys, "--checkpoint", str(ckpts["aogpt"]), "--data", str(ckpts["text"]), "--infill",
                     "--span-lengths", "2,4", "--cuts", "5", "--infill-context", "3", "-K", "2",
                     "--compare", str(ckpts["gpt"]), "--json")
    assert rc == 0 and "span of 4 tokens" in out and "gap: gpt prefix only" in out
    s = summary(out)
    assert {(r["model"], r["length"]) for r in s["infill"]} == {(m, n) for m in ("aogpt", "gpt") for n in (2, 4)}
    ids = [*TEXT.encode("utf-8"), 256]  # the file is one example: its bytes, then the end of text
    cuts = make_cuts(ids, 4, num_cuts=5, context=3, seed=s["seed"], eot_id=256)
    gpt = load(ckpts["gpt"]).model
    want = span_nll(gpt, cuts.windows, 3, 4, sides="prefix") / 4 / math.log(2)  # ASCII: one byte per token
    got = next(r for r in s["infill"] if r["model"] == "gpt" and r["length"] == 4)
    assert got["bpb"] == pytest.approx(float(want.mean()), abs=1e-5) and got["spans"] == 5


@pytest.mark.parametrize("extra, what", [
    (["--span-lengths", "0"], "argument --span-lengths"),
    (["--span-lengths", "12", "--infill-context", "4"], "exceed the context"),
    (["--cuts", "100000", "--span-lengths", "2", "--infill-context", "3"], "inside one document"),
    (["--variant-gpt", "--span-lengths", "2", "--infill-context", "3"], "cannot read a suffix"),
    (["--data", "lambada", "--span-lengths", "2", "--infill-context", "3"], "prepared data directory or a text"),
    (["--infill-order", "best"], "argument --infill-order"),
])
def test_bad_infill_requests_are_one_line_errors(ckpts: dict, capsys: pytest.CaptureFixture, extra: list,
                                                 what: str) -> None:
    variant = "gpt" if "--variant-gpt" in extra else "aogpt"
    extra = [e for e in extra if e != "--variant-gpt"]
    data = [] if "--data" in extra else ["--data", str(ckpts["text"])]
    rc, out, err = run(capsys, "--checkpoint", str(ckpts[variant]), "--infill", *data, *extra)
    assert rc == 2 and err.startswith("error: ") and what in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    rc, _, err = run(capsys, "--checkpoint", str(ckpts["aogpt"]), "--data", str(ckpts["text"]), "--compare", "x")
    assert rc == 2 and "--compare is for infilling" in err


def test_infill_help_states_the_library_defaults(capsys: pytest.CaptureFixture) -> None:
    from aogpt.evaluation.infill import CONTEXT, NUM_CUTS, SPAN_LENGTHS

    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"(default {','.join(map(str, SPAN_LENGTHS))})" in text and f"(default {NUM_CUTS})" in text
    assert f"each span (default {CONTEXT})" in text
