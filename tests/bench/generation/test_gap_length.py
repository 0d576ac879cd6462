"""`aogpt bench gap-length` on a tiny model: its choices are `choose_length`'s, its bits per byte the
exact left-to-right numbers, its report's figure markers name the values it wrote."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import aogpt
from aogpt.bench.generation.gap_length import bench_gap_length, draw_spans, to_markdown, word_starts
from aogpt.data import PreparedData
from aogpt.evaluation.evaluate import conditional_logprobs
from aogpt.figures import check
from aogpt.generation.generate import generate
from aogpt.generation.length import choose_length, ids_layout
from aogpt.seeds import draw_seed

SHAPE = {"context": 8, "target": 3, "longest": 5, "max_gap": 6}


def test_choices_and_bits_are_the_library_s_and_the_report_is_marked(tiny_run, bytes_data, tmp_path):
    m = aogpt.load(tiny_run)
    data = PreparedData(bytes_data)
    val, train = np.asarray(data.split("val")), np.asarray(data.split("train"))
    r = bench_gap_length(m.model, m.tokenizer, val, train, spans=3, seeds=1, seed=4, draws=(1, 2), out=tmp_path,
                         **SHAPE)
    assert r["spans"] == 3 and {row["id"] for row in r["rows"]} == {"estimate-d1", "estimate-d2", "fixed-guess",
                                                                    "true-length", "true-span"}
    spans = draw_spans(val, word_starts(m.tokenizer), m.tokenizer.eot_id, 3, draw_seed(4, "gap-length-spans"),
                       context=8, target=3, longest=5)
    byte_len = np.asarray(m.tokenizer.byte_lengths())
    for (s, e), record in zip(spans, r["per_span"], strict=True):
        assert (record["start"], record["true"]) == (s, e - s)
        before, after = val[s - 8:s].tolist(), val[e:e + 8].tolist()
        layout = ids_layout(before, after, m.config)
        span_seed = draw_seed(4, "gap-length", s)
        for d in (1, 2):  # what the server's estimate with d draws returns for this span
            assert record["picks"][f"estimate, D={d}"] == choose_length(m.model, layout, seed=span_seed, draws=d,
                                                                        max_gap=6).length
        k = record["picks"]["true length"]
        filled = generate(m.model, condition=layout(k), seed=draw_seed(span_seed, "fill"), order="l2r",
                          policy="count", tokenizer=m.tokenizer).tokens[0]
        ids = filled.tolist()
        bits = -sum(conditional_logprobs(m.model, filled, torch.arange(i), torch.tensor([i]))[0, ids[i]].item()
                    for i in range(8, len(ids))) / math.log(2)
        assert record["bits_per_byte"]["true length"] == pytest.approx(bits / byte_len[ids[8:]].sum(), rel=1e-5)
    quality = r["model"]["held_out_bits_per_byte"]
    assert quality["windows"] == 2 and quality["l2r"] < quality["random"]  # the scale: exact, then the bound
    true_row = next(row for row in r["rows"] if row["id"] == "true-length")
    assert true_row["exact"]["value"] == 1.0 and true_row["mean_abs_error"]["value"] == 0.0
    stored = json.loads((tmp_path / "gap-length.json").read_text())
    assert stored["rows"] == json.loads(json.dumps(r["rows"]))
    doc = tmp_path / "doc.md"
    doc.write_text(to_markdown(stored, source="gap-length.json"), encoding="utf-8")
    figures, problems = check(tmp_path, [doc])
    assert not problems and len(figures) >= 40, problems


def test_the_command_refuses_what_cannot_choose_a_length(cli, bytes_data, tmp_path):
    from tests.helpers import random_checkpoint

    gpt = random_checkpoint(tmp_path, "gpt", block_size=48, scale=0.3)
    res = cli("bench", "gap-length", "--checkpoint", gpt, "--data", bytes_data, "--quick", "--out", tmp_path)
    assert res.code == 2 and res.err.strip().splitlines()[-1].startswith("error: ")
    assert "cannot choose a gap's length" in res.err and "Traceback" not in res.err
