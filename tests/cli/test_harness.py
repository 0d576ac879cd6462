"""`aogpt harness` end to end through `aogpt.cli.main` (conftest `cli`) on the local harness tasks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import aogpt
from aogpt.hf.harness import split_pair
from aogpt.hf.scoring import score_continuations

TASKS = Path(__file__).resolve().parents[1] / "fixtures" / "harness"


def test_prints_the_harness_table(cli, tiny_run: Path) -> None:
    res = cli("harness", "--checkpoint", tiny_run, "--tasks", "aogpt_last_word,aogpt_documents",
              "--include-path", TASKS, "--bootstrap-iters", "0", "--json")
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("|") and line.split("|")[1].strip() == "Tasks")
    table = [line for line in lines[head:] if line.startswith("|")]  # lm-eval's table (other output may precede it)
    assert "Metric" in table[0], res.out
    metrics = {line.split("|")[5].strip() for line in table[2:]}
    assert {"acc", "perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte"} == metrics
    assert {"aogpt_last_word", "aogpt_documents"} <= {line.split("|")[1].strip() for line in table}
    assert "exact left-to-right likelihoods" in res.out
    summary = res.json
    assert summary["command"] == "harness" and summary["bound"] is None
    ppl = summary["results"]["aogpt_last_word"]["perplexity,none"]
    loaded = aogpt.load(tiny_run)
    texts = [json.loads(line)["text"] for line in (TASKS / "last_word.jsonl").read_text().splitlines()]
    pairs = [split_pair(loaded.tokenizer.encode, t.rsplit(" ", 1)[0], " " + t.rsplit(" ", 1)[1]) for t in texts]
    scores = score_continuations(loaded.model, pairs)
    assert ppl == pytest.approx(math.exp(-sum(s.logprob for s in scores) / len(scores)), rel=1e-9)


def test_any_order_bound_reports_its_standard_error(cli, tiny_run: Path) -> None:
    res = cli("harness", "--checkpoint", tiny_run, "--tasks", "aogpt_last_word", "--include-path", TASKS,
              "--order", "random", "-K", "3", "--bootstrap-iters", "0", "--json")
    assert res.code == 0, res.err
    bound = res.json["bound"]
    assert bound["K"] == 3 and bound["requests"] == 6 and bound["logprob_sum_se"] > 0
    assert "any-order bound with K = 3 random orders" in res.out


def test_errors_are_one_line(cli, tiny_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import lm_eval.tasks

    class LocalOnly(lm_eval.tasks.TaskManager):  # indexing the 14,000 built-in tasks takes many seconds
        def __init__(self, *args, include_defaults: bool = True, **kwargs) -> None:
            super().__init__(*args, include_defaults=False, **kwargs)

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", LocalOnly)
    for args, what in [
        (("--tasks", "no_such_task_anywhere", "--include-path", TASKS), "unknown harness task"),
        (("--tasks", "aogpt_last_word", "--include-path", tmp_path / "missing"), "does not exist"),
        (("--tasks", "aogpt_last_word", "--include-path", TASKS, "--order", "random", "-K", "1"), "K >= 2"),
        (("--tasks", " , ",), "no task names"),
    ]:
        res = cli("harness", "--checkpoint", tiny_run, *args)
        assert res.code == 2 and res.err.strip().splitlines()[-1].startswith("error: ") and what in res.err, res.err
