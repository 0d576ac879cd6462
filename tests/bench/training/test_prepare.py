"""`aogpt.bench.training.prepare`: timing `prepare` of a small local corpus, workers against in-process encoding,
and a module light enough for spawned tokenizer workers."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aogpt.bench.training.prepare import bench_prepare, bench_workers, gpt2_threads, synthetic_corpus
from aogpt.data import tokenizer as tk
from aogpt.errors import AOGPTError

SRC = Path(__file__).resolve().parents[3] / "src"


def test_prepare_times_cold_runs_of_a_local_corpus(tmp_path, make_corpus):
    corpus = make_corpus(tmp_path / "corpus", docs=4, words=80)
    text = "".join(p.read_text() for p in sorted(corpus.iterdir()))
    res = bench_prepare(corpus=str(corpus), tokenizer="bytes", repeats=2, out=tmp_path / "out")
    assert res["tokens"] == len(text.encode()) + 4  # one EOT per document
    assert res["documents"] == 4 and res["tokenizer"] == "bytes"
    assert len(res["runs"]["prepare"]) == len(res["cpu_runs"]["prepare"]) == 2
    assert math.isclose(res["tokens_per_second"], res["tokens"] / res["seconds"]["prepare"])
    assert set(res["stages_seconds"]) == {"read_and_clean", "tokenizer", "encode"}
    target = res["targets"][0]
    assert math.isclose(target["value"], res["seconds"]["prepare"] / 10.0) and "shakespeare with gpt2" in target["note"]
    assert res["environment"]["threads"] == 1  # bytes encode in one thread
    assert json.loads((tmp_path / "out" / "prepare.json").read_text())["tokens"] == res["tokens"]
    assert "| wall |" in (tmp_path / "out" / "prepare.md").read_text()


def test_workers_against_in_process(tmp_path):
    res = bench_workers(tokenizer="bytes", workers=2, synthetic_mb=0.02, repeats=1, out=tmp_path)
    assert list(res["modes"]) == ["threads", "workers"] and res["baseline"] == "threads"  # one-thread: gpt2 only
    s = res["seconds"]
    assert res["ratios"] == {"threads/threads": 1.0, "threads/workers": s["threads"] / s["workers"]}
    assert res["tokens"] > res["chars"] >= 20_000  # bytes: at least a token per character, plus EOTs
    assert res["cpu_seconds"]["workers"] > 0 and (tmp_path / "prepare-workers.md").is_file()


def test_synthetic_corpus_and_thread_setting(tmp_path):
    chars = synthetic_corpus(tmp_path / "s.jsonl", 0.01, seed=3)
    rows = [json.loads(line)["text"] for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert chars == sum(map(len, rows)) >= 10_000
    assert synthetic_corpus(tmp_path / "t.jsonl", 0.01, seed=3) == chars  # deterministic
    with gpt2_threads(1):
        assert tk.GPT2Tokenizer.threads == 1
    assert "threads" not in vars(tk.GPT2Tokenizer) and tk.GPT2Tokenizer.threads is None


@pytest.mark.parametrize("call, message", [
    (lambda: bench_prepare(repeats=0), "--repeats"),
    (lambda: bench_prepare(threads=0), "--threads"),
    (lambda: bench_workers(workers=1), "--workers must be at least 2"),
    (lambda: bench_workers(synthetic_mb=0), "--synthetic-mb"),
    (lambda: bench_workers(tokenizer="gpt-2"), "unknown tokenizer"),
])
def test_bad_inputs(call, message):
    with pytest.raises(AOGPTError, match=message):
        call()


def test_module_is_light_for_spawned_workers():
    code = ("import sys, aogpt.bench.training.prepare; "
            "sys.exit('torch' in sys.modules or 'aogpt.data.prepared' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0
