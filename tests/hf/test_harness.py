"""lm-evaluation-harness end to end on the local tasks in tests/fixtures/harness (offline), the
harness's numbers checked against our own likelihoods of the same text."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import lm_eval
import pytest
import torch
from lm_eval.tasks import TaskManager

import aogpt
from aogpt.data.tokenizer import EOT_TEXT
from aogpt.errors import AOGPTError
from aogpt.evaluation.evaluate import conditional_logprobs, evaluate
from aogpt.hf.harness import AOGPTLM, split_pair
from aogpt.hf.scoring import score_continuations

TASKS = Path(__file__).resolve().parents[1] / "fixtures" / "harness"


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (TASKS / name).read_text(encoding="utf-8").splitlines() if line.strip()]


def l2r_nll(model: torch.nn.Module, ids: list[int]) -> float:
    return evaluate(model, torch.tensor([ids]), per_sequence=True).sequence_nlls[0][0] if ids else 0.0


def conditional(model: torch.nn.Module, context: list[int], continuation: list[int]) -> float:
    """log p(continuation | context) by the chain rule: two exact left-to-right likelihoods."""
    return l2r_nll(model, context) - l2r_nll(model, context + continuation)


def greedy(model: torch.nn.Module, context: list[int], continuation: list[int]) -> bool:
    seq = torch.tensor(context + continuation)
    return all(int(conditional_logprobs(model, seq, torch.arange(t), torch.tensor([t]))[0].argmax()) == int(seq[t])
               for t in range(len(context), len(seq)))


def evaluate_tasks(lm: AOGPTLM, tasks: list[str], **kwargs) -> dict:
    manager = TaskManager(include_path=str(TASKS), include_defaults=False)
    return lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, bootstrap_iters=0, **kwargs)


def test_split_pair_follows_the_harness() -> None:
    encode = lambda s: list(s.encode())  # noqa: E731
    assert split_pair(encode, "The king ", "rode") == (list(b"The king"), list(b" rode"))
    assert split_pair(encode, "", "rode") == ([], list(b"rode"))


def test_local_tasks_match_our_likelihoods(tiny_run: Path) -> None:
    loaded = aogpt.load(tiny_run)
    model, tok, window = loaded.model, loaded.tokenizer, loaded.config.block_size
    lm = AOGPTLM(model=loaded, show_progress=False)
    res = evaluate_tasks(lm, ["aogpt_last_word", "aogpt_documents", "aogpt_continuations"], log_samples=True)

    logps, hits = [], []
    for row in rows("last_word.jsonl"):
        words = row["text"].split(" ")
        ctx, cont = tok.encode(" ".join(words[:-1])), tok.encode(" " + words[-1])
        keep = (ctx + cont)[-window:]  # the context is cut on the left to fit the window
        m = len(keep) - len(cont)
        logps.append(conditional(model, keep[:m], cont))
        hits.append(greedy(model, keep[:m], cont))
    got = res["results"]["aogpt_last_word"]
    assert got["perplexity,none"] == pytest.approx(math.exp(-sum(logps) / len(logps)), rel=1e-6)
    assert got["acc,none"] == pytest.approx(sum(hits) / len(hits))

    total = words = size = 0
    for row in rows("documents.jsonl"):
        ids = tok.encode(row["text"])
        total += -l2r_nll(model, ids[:window])  # the first window, from the start of the text
        for first in range(window, len(ids), window - 1):  # then windows of `window` tokens, each token once
            end = min(len(ids), first + window - 1)
            total += conditional(model, ids[end - window:first], ids[first:end])
        words += len(re.split(r"\s+", row["text"]))
        size += len(row["text"].encode())
    assert len(tok.encode(rows("documents.jsonl")[2]["text"])) > 2 * window  # several windows are exercised
    got = res["results"]["aogpt_documents"]
    assert got["word_perplexity,none"] == pytest.approx(math.exp(-total / words), rel=1e-6)
    assert got["byte_perplexity,none"] == pytest.approx(math.exp(-total / size), rel=1e-6)
    assert got["bits_per_byte,none"] == pytest.approx(-total / size / math.log(2), rel=1e-6)

    samples = {s["doc"]["context"]: s["resps"][0][0] for s in res["samples"]["aogpt_continuations"]}
    for row in rows("continuations.jsonl"):
        prompt = tok.encode(row["context"])
        out = aogpt.generate(model, prompt=prompt or None, length=len(prompt) + 8, greedy=True, order="l2r",
                             policy="count", steps=8, seed=0)
        text = tok.decode(out.tokens[0, len(prompt):])
        want = re.split(r"\.|\n|" + re.escape(EOT_TEXT), text)[0]
        assert samples[row["context"]] == want
    assert any(samples.values())  # not all cut to nothing: the comparison has text to compare
    assert res["results"]["aogpt_continuations"]["exact_match,none"] == pytest.approx(
        sum(samples[r["context"]] == r["target"] for r in rows("continuations.jsonl")) / 3)
    assert lm.bound_report() is None  # exact likelihoods: no bound to report


def test_any_order_bound_through_the_registered_name(tiny_run: Path) -> None:
    manager = TaskManager(include_path=str(TASKS), include_defaults=False)
    res = lm_eval.simple_evaluate(model="aogpt", model_args=f"pretrained={tiny_run},order=random,K=4,seed=5",
                                  tasks=["aogpt_last_word"], task_manager=manager, bootstrap_iters=0)
    loaded = aogpt.load(tiny_run)
    pairs = []
    for row in rows("last_word.jsonl"):
        words = row["text"].split(" ")
        pairs.append(split_pair(loaded.tokenizer.encode, " ".join(words[:-1]), " " + words[-1]))
    scores = score_continuations(loaded.model, pairs, order="random", num_orders=4, seed=5)
    assert all(s.se is not None and s.se > 0 for s in scores)
    mean = sum(s.logprob for s in scores) / len(scores)
    assert res["results"]["aogpt_last_word"]["perplexity,none"] == pytest.approx(math.exp(-mean), rel=1e-6)


def test_model_arguments_are_checked(tiny_run: Path) -> None:
    with pytest.raises(AOGPTError, match="unknown model argument"):
        AOGPTLM(str(tiny_run), temprature=1.0)
    with pytest.raises(AOGPTError, match="exactly one of"):
        AOGPTLM()
    with pytest.raises(AOGPTError, match="K >= 2"):
        AOGPTLM(str(tiny_run), order="random", K=1)
    lm = AOGPTLM(str(tiny_run), show_progress=False)
    with pytest.raises(AOGPTError, match="not supported by aogpt"):
        lm.continue_text("The king", {"until": ["."], "num_beams": 4})
    assert lm.max_length == 32 and lm.tokenizer_name == "bytes"


def test_infill_requests_are_exact_span_likelihoods_given_both_sides(tiny_run: Path) -> None:
    """loglikelihood_infill: log p(span | prefix, suffix), checked against a token-by-token chain of
    separately computed conditionals (prefix, suffix read first; the span left to right)."""
    from types import SimpleNamespace

    from tests.helpers import prefix_conditional

    lm = AOGPTLM(str(tiny_run), show_progress=False)
    got = lm.loglikelihood_infill([SimpleNamespace(args=("To be, or ", "not to", " be"))])
    enc = lm.tokenizer.encode
    pre, span, suf = enc("To be, or "), enc("not to"), enc(" be")
    x = torch.tensor([pre + span + suf])
    P, L = len(pre), len(span)
    order = [*range(P), *range(P + L, x.shape[1]), *range(P, P + L)]
    want = -sum(prefix_conditional(lm.model.double(), x, order, i) for i in range(P + len(suf), x.shape[1]))
    assert got[0] == pytest.approx(want, abs=1e-4)
