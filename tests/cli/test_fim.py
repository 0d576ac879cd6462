"""A fill-in-the-middle GPT from the command line: `aogpt train --fim-rate`, `aogpt eval --infill` with it
(as --compare and as --checkpoint; the JSON row equals the library's exact value on the same cuts),
`aogpt sample --infill`, and one-line errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from aogpt.checkpoint import load
from aogpt.cli import main
from aogpt.data.fim import FIMTokenizer


@pytest.fixture(scope="module")
def fim_run(tmp_path_factory: pytest.TempPathFactory, bytes_data: Path) -> Path:
    out = tmp_path_factory.mktemp("fim") / "gpt-fim"
    assert main(["train", "--preset", "tiny", "--variant", "gpt", "--fim-rate", "0.5", "--data", str(bytes_data),
                 "--out", str(out), "--max-steps", "4", "--no-progress"]) == 0
    return out


def test_train_records_the_sentinels_and_load_knows_them(fim_run: Path, capsys: pytest.CaptureFixture) -> None:
    loaded = load(fim_run)
    assert loaded.config.fim_tokens == [257, 258, 259, 260] and loaded.train_config["fim_rate"] == 0.5
    assert isinstance(loaded.tokenizer, FIMTokenizer) and loaded.tokenizer.text_vocab_size == 257
    filled = loaded.infill("To be,[MASK:4] to be", seed=0, num_samples=2)  # the Python API fills the middle too
    assert filled.settings["infill_method"] == "fim" and all(t.startswith("To be,") for t in filled.texts)
    rc = main(["train", "--preset", "tiny", "--variant", "aogpt", "--fim-rate", "0.5", "--data", str(fim_run),
               "--out", str(fim_run.parent / "no")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: --fim-rate trains a left-to-right model") and len(err.splitlines()) == 1


def test_eval_infill_scores_the_fim_gpt_on_the_same_cuts(fim_run: Path, tiny_run: Path, bytes_data: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    from aogpt.data import PreparedData
    from aogpt.evaluation.infill import fim_span_nll, make_cuts

    args = ["eval", "--data", str(bytes_data), "--infill", "--span-lengths", "4", "--cuts", "6",
            "--infill-context", "6", "--json"]
    assert main([*args, "--checkpoint", str(tiny_run), "--compare", str(fim_run)]) == 0
    out = capsys.readouterr().out
    assert "gap: gpt-fim both sides (fill in the middle) - aogpt both sides (own order)" in out
    s = json.loads(out.strip().splitlines()[-1])
    row = next(r for r in s["infill"] if r["model"] == "gpt-fim" and r["row"] == "fim/psm")
    ids = np.concatenate([np.asarray(x, dtype=np.int64) for x in PreparedData(bytes_data).shards("val")])
    cuts = make_cuts(ids, 4, num_cuts=6, context=6, seed=s["seed"], eot_id=256)
    span, end = fim_span_nll(load(fim_run).model, cuts.windows, 6, 4)
    assert row["bpb"] == pytest.approx(float(((span + end) / 4 / math.log(2)).mean()), abs=1e-5)
    assert row["end_bpb"] == pytest.approx(float((end / 4 / math.log(2)).mean()), abs=1e-5)
    assert main([*args, "--checkpoint", str(fim_run)]) == 0  # a FIM model may be the one given both sides
    assert {r["row"] for r in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["infill"]} == \
        {"prefix/l2r", "fim/psm"}
    rc = main(["eval", "--data", str(bytes_data), "--infill", "--span-lengths", "8", "--infill-context", "12",
               "--checkpoint", str(tiny_run), "--compare", str(fim_run)])
    err = capsys.readouterr().err
    assert rc == 2 and "36 tokens (12 + span + 12 + 4 fill-in-the-middle sentinels)" in err


def test_sample_infill_fills_gaps_between_their_sides(fim_run: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["sample", "--checkpoint", str(fim_run), "--infill", "To be,[MASK:5] to be[MASK:2]", "-n", "3",
                 "--seed", "1", "--no-progress", "--json"]) == 0
    captured = capsys.readouterr()
    s = json.loads(captured.out.strip().splitlines()[-1])
    assert "fill in the middle" in captured.err and s["settings"]["infill_method"] == "fim"
    for tokens in s["tokens"]:
        assert bytes(tokens[:6]) == b"To be," and bytes(tokens[11:17]) == b" to be" and max(tokens) < 257
    assert main(["sample", "--checkpoint", str(fim_run), "--infill", "To be,[[ or not]] to be", "--seed", "1",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "original:\nTo be, or not to be" in out and "bits/byte (exact, each gap and its end given" in out
    rc = main(["sample", "--checkpoint", str(fim_run), "--infill", "To be,[MASK:5]", "--infill-method", "l2r"])
    err = capsys.readouterr().err
    assert rc == 2 and "fill-in-the-middle model fills each gap" in err and len(err.splitlines()) == 1
