"""OpenAI's completions fields as clients use them, against offline computations: lm-evaluation-harness's
own `local-completions` client, the `openai` client's insert mode (`suffix`), echo + logprobs, batches
of prompts, gaps of unknown length, a fill-in-the-middle GPT, and the end of text."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import torch

import aogpt
from aogpt.generation.generate import generate
from aogpt.generation.length import choose_length, ids_layout, template_layout
from aogpt.generation.likelihood import chain_logprobs
from aogpt.hf.scoring import score_continuations
from tests.serve.conftest import serve
from tests.serve.test_app import events, post

TASKS = Path(__file__).resolve().parents[1] / "fixtures" / "harness"


def fill_of(result, first: int, end: int, tok) -> str:
    return tok.decode(result.tokens[0, first:end])


# ----------------------------------------------------------------------------- lm-evaluation-harness
@pytest.fixture(scope="module")
def scorer(slow_checkpoint):
    """A server on the context-128 checkpoint (bytes tokenizer): lm-eval's rows fit its window."""
    yield from serve(aogpt.load(slow_checkpoint), name="scorer")


def test_lm_eval_local_completions_gets_the_harness_log_likelihoods(scorer, slow_checkpoint, tmp_path, monkeypatch):
    """lm-eval's own client, offline, with the model's exported tokenizer, against `aogpt serve`: every
    request's log-likelihood and greedy flag as `aogpt harness` computes them on the same checkpoint."""
    import lm_eval
    import lm_eval.models.openai_completions  # noqa: F401  registers local-completions
    from lm_eval.tasks import TaskManager

    from aogpt.hf.harness import AOGPTLM
    from aogpt.hf.tokenization import to_hf_tokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    to_hf_tokenizer(scorer.loaded.tokenizer, model_max_length=128).save_pretrained(tmp_path / "tokenizer")
    manager = TaskManager(include_path=str(TASKS), include_defaults=False)
    args = {"model": scorer.name, "base_url": scorer.url + "/v1/completions", "tokenizer_backend": "huggingface",
            "tokenizer": str(tmp_path / "tokenizer"), "max_length": 128, "batch_size": 2, "max_retries": 1}
    theirs = lm_eval.simple_evaluate(model="local-completions", model_args=args, tasks=["aogpt_last_word"],
                                     task_manager=manager, bootstrap_iters=0, log_samples=True)
    ours = lm_eval.simple_evaluate(model=AOGPTLM(str(slow_checkpoint), show_progress=False), tasks=["aogpt_last_word"],
                                   task_manager=manager, bootstrap_iters=0, log_samples=True)

    def by_doc(res):
        return {s["doc_id"]: s["resps"][0][0] for s in res["samples"]["aogpt_last_word"]}

    got, want = by_doc(theirs), by_doc(ours)
    assert sorted(got) == sorted(want) and len(want) == 6
    for doc, (logprob, greedy) in want.items():
        assert abs(got[doc][0] - logprob) < 1e-4 and got[doc][1] == greedy
    assert scorer.engine.stats["finished"] >= 6  # every request went through the server (in batches of two)


# ----------------------------------------------------------------------------- echo and logprobs
def test_echo_and_logprobs_are_the_exact_left_to_right_numbers_for_a_batch_of_prompts(server):
    model, tok = server.loaded.model, server.loaded.tokenizer
    texts, ids = ["To be, or not", "the king"], [tok.encode("the queen"), tok.encode("Fair is foul")]
    request = {"echo": True, "logprobs": 2, "max_tokens": 1, "temperature": 0, "seed": 4}
    answers = []
    for prompts in (texts, ids):  # a batch of strings, a batch of token-id lists
        r = post(server.url, {"prompt": prompts, **request})
        assert r.status_code == 200, r.text
        assert [c["index"] for c in r.json()["choices"]] == [0, 1]
        answers += r.json()["choices"]
    for prompt, choice in zip(texts + ids, answers, strict=True):
        ids = tok.encode(prompt) if isinstance(prompt, str) else prompt
        lp = choice["logprobs"]
        want = generate(model, prompt=ids, length=len(ids) + 1, greedy=True, seed=4).tokens[0]
        assert choice["aogpt"]["tokens"] == want.tolist()
        assert lp["tokens"] == [tok.decode([t]) for t in want[:len(lp["tokens"])]]
        assert choice["text"] == tok.decode(want[:len(lp["tokens"])])
        exact = chain_logprobs(model, want[None], torch.arange(len(want))[None], top=2)
        assert np.allclose(lp["token_logprobs"], exact.logprobs[0, :len(lp["tokens"])].numpy(), atol=1e-6)
        harness = score_continuations(model, [(ids[:3], ids[3:])])[0]
        assert abs(sum(lp["token_logprobs"][3:len(ids)]) - harness.logprob) < 1e-5
        for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
            assert len(top) <= 3 and top[token] == value  # the two most likely, and the token itself
        assert lp["token_logprobs"][len(ids)] == max(lp["top_logprobs"][len(ids)].values())  # greedy: its own max
        assert lp["text_offset"][:2] == [0, len(tok.decode(want[:1]))]


def test_generated_tokens_have_their_log_probability_in_the_order_they_were_drawn(server):
    model, tok = server.loaded.model, server.loaded.tokenizer
    request = {"prompt": "ab", "max_tokens": 6, "logprobs": 0, "seed": 7, "order": "random", "ignore_eos": True,
               "n": 2}
    body = post(server.url, request).json()
    ids = tok.encode("ab")
    res = generate(model, prompt=ids, length=len(ids) + 6, seed=7, order="random", num_samples=2, tokenizer=tok)
    along = chain_logprobs(model, res.tokens, res.orders).logprobs
    for b, choice in enumerate(body["choices"]):
        assert choice["aogpt"]["tokens"] == res.tokens[b].tolist()
        by_position = torch.empty_like(along[b]).scatter_(0, res.orders[b], along[b])
        assert np.allclose(choice["logprobs"]["token_logprobs"], by_position[len(ids):].numpy(), atol=1e-6)
        assert all(len(top) == 1 for top in choice["logprobs"]["top_logprobs"])  # logprobs 0: the token only


def test_an_echoed_prompt_without_tokens_to_generate_is_scored_only(server):
    tok = server.loaded.tokenizer
    body = post(server.url, {"prompt": "the king", "echo": True, "logprobs": 1, "max_tokens": 0}).json()
    choice = body["choices"][0]
    assert choice["text"] == "the king" and len(choice["logprobs"]["tokens"]) == len(tok.encode("the king"))
    assert body["usage"]["completion_tokens"] == 0


# ----------------------------------------------------------------------------- suffix (insert mode)
def _suffix_want(model, tok, prompt: str, suffix: str, k: int, seed: int, **kw) -> str:
    before, after = tok.encode(prompt), tok.encode(suffix)
    res = generate(model, condition=ids_layout(before, after, model.config)(k), seed=seed, tokenizer=tok, **kw)
    return fill_of(res, len(before), len(before) + k, tok)


def test_the_openai_client_inserts_between_prompt_and_suffix_alone_and_among_sixteen(server):
    import openai

    model, tok = server.loaded.model, server.loaded.tokenizer
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    done = client.completions.create(model=server.name, prompt="To be", suffix=" question", max_tokens=6, seed=3)
    assert done.choices[0].text == _suffix_want(model, tok, "To be", " question", 6, 3)
    assert done.choices[0].finish_reason == "length"

    cases = [(f"p{i} ", f" s{i}", 2 + i % 5, 100 + i, ["random", "l2r", "confidence", "blockwise:2"][i % 4])
             for i in range(16)]
    got: dict[int, str] = {}

    def ask(i: int) -> None:
        prompt, suffix, k, seed, order = cases[i]
        got[i] = client.completions.create(model=server.name, prompt=prompt, suffix=suffix, max_tokens=k, seed=seed,
                                           extra_body={"order": order}).choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, (prompt, suffix, k, seed, order) in enumerate(cases):
        assert got[i] == _suffix_want(model, tok, prompt, suffix, k, seed, order=order), i


def test_the_stream_shows_the_fill(server):
    model, tok = server.loaded.model, server.loaded.tokenizer
    request = {"prompt": "To be", "suffix": " question", "max_tokens": 6, "seed": 8}
    got = events(server.url, request)
    chunks = [e["choices"][0] for e in got[:-1] if e["choices"]]
    assert chunks[0]["aogpt"]["completion_end"] == len(tok.encode("To be")) + 6
    assert "".join(c["text"] for c in chunks) == _suffix_want(model, tok, "To be", " question", 6, 8)


# ----------------------------------------------------------------------------- gaps of unknown length
def test_a_gap_without_a_length_gets_the_one_the_model_chooses(server):
    model, tok = server.loaded.model, server.loaded.tokenizer
    body = post(server.url, {"prompt": "To be, or", "suffix": " to be", "seed": 6}).json()
    choice = body["choices"][0]
    before, after = tok.encode("To be, or"), tok.encode(" to be")
    layout = ids_layout(before, after, model.config)
    chosen = choose_length(model, layout, seed=6)
    gap, offline = choice["aogpt"]["gap"], chosen.to_dict()
    # the same length and candidates; the log-marginals to float rounding: on an AVX2-only CPU a product's
    # kernel rounds a row by its batch's row count, and the server's steps batch rows differently
    exact = ("length", "candidates", "draws")
    assert {k: gap[k] for k in exact} == {k: offline[k] for k in exact}
    for key in ("log_marginals", "posterior"):
        assert gap[key] == pytest.approx(offline[key], rel=1e-5, abs=1e-6), key
    want = generate(model, condition=layout(chosen.length), seed=6, tokenizer=tok)
    assert choice["aogpt"]["tokens"] == want.tokens[0].tolist()
    assert choice["text"] == fill_of(want, len(before), len(before) + chosen.length, tok)

    template = "To be, [MASK:?] to be"
    streamed = events(server.url, {"prompt": template, "seed": 2})
    first = streamed[0]["choices"][0]["aogpt"]
    chosen = choose_length(model, template_layout(template, tok, model.config), seed=2)
    assert first["length"] == template_layout(template, tok, model.config)(chosen.length).length
    assert streamed[-2]["aogpt"]["gap"]["length"] == chosen.length
    whole = post(server.url, {"prompt": template, "seed": 2}).json()["choices"][0]["text"]
    assert "".join(e["choices"][0]["text"] for e in streamed[:-1] if e["choices"]) == whole


# ----------------------------------------------------------------------------- a fill-in-the-middle GPT
@pytest.fixture(scope="module")
def fim_server():
    from aogpt.config import model_config
    from aogpt.data.fim import FIMTokenizer, Sentinels
    from aogpt.data.tokenizer import ByteTokenizer
    from aogpt.model import Transformer

    torch.manual_seed(5)
    cfg = model_config("gpt", n_layer=2, n_head=2, n_embd=32, block_size=48, vocab_size=261,
                       fim_tokens=Sentinels.after(257).to_list())
    model = Transformer(cfg).eval().requires_grad_(False)
    yield from serve(SimpleNamespace(model=model, tokenizer=FIMTokenizer(ByteTokenizer())), name="fim")


def test_a_fill_in_the_middle_gpt_fills_from_its_sentinels(fim_server):
    from aogpt.generation.fim import fim_fill

    model, tok = fim_server.loaded.model, fim_server.loaded.tokenizer
    body = post(fim_server.url, {"prompt": "To be", "suffix": " question", "max_tokens": 5, "seed": 9}).json()
    before = tok.encode("To be")
    want = fim_fill(model, [*before, *([None] * 5), *tok.encode(" question")], seed=9, tokenizer=tok)
    assert body["choices"][0]["text"] == fill_of(want, len(before), len(before) + 5, tok)
    streamed = events(fim_server.url, {"prompt": "To [MASK:4] be", "seed": 1})
    whole = post(fim_server.url, {"prompt": "To [MASK:4] be", "seed": 1}).json()["choices"][0]
    assert "".join(e["choices"][0]["text"] for e in streamed[:-1] if e["choices"]) == whole["text"]
    assert whole["aogpt"]["tokens"] == fim_fill(model, "To [MASK:4] be", seed=1, tokenizer=tok).tokens[0].tolist()
    refused = post(fim_server.url, {"prompt": "To be", "suffix": "x", "max_tokens": 2, "order": "random"})
    assert refused.status_code == 400 and "fill-in-the-middle" in refused.json()["error"]["message"]


# ----------------------------------------------------------------------------- the end of the text
def test_a_continuation_ends_at_its_first_end_of_text_token(server):
    model, tok = server.loaded.model, server.loaded.tokenizer
    ids = tok.encode("the ")
    for seed in range(40):  # a seed whose sample holds an end-of-text token (the tiny model draws them often)
        res = generate(model, prompt=ids, length=len(ids) + 20, seed=seed, order="random", tokenizer=tok)
        drawn = res.tokens[0, len(ids):].tolist()
        if tok.eot_id in drawn[:-1]:
            break
    else:
        pytest.fail("no sample with an end-of-text token before its last position")
    cut = drawn.index(tok.eot_id)
    request = {"prompt": "the ", "max_tokens": 20, "seed": seed, "order": "random", "logprobs": 0}
    choice = post(server.url, request).json()["choices"][0]
    assert choice["text"] == tok.decode(drawn[:cut]) and choice["finish_reason"] == "stop"
    assert choice["logprobs"]["tokens"][-1] == tok.decode([tok.eot_id])  # the end-of-text token is listed last
    assert len(choice["logprobs"]["tokens"]) == cut + 1 and choice["aogpt"]["tokens"] == res.tokens[0].tolist()
    streamed = events(server.url, request | {"logprobs": None})
    assert "".join(e["choices"][0]["text"] for e in streamed[:-1] if e["choices"]) == choice["text"]
    assert streamed[-2]["choices"][0]["finish_reason"] == "stop"
    whole = post(server.url, request | {"ignore_eos": True}).json()["choices"][0]
    assert whole["text"] == tok.decode(drawn) and whole["finish_reason"] == "length"


def test_an_empty_suffix_is_a_continuation(server):
    plain = post(server.url, {"prompt": "the ", "max_tokens": 5, "seed": 3}).json()["choices"][0]
    empty = post(server.url, {"prompt": "the ", "max_tokens": 5, "seed": 3, "suffix": ""}).json()["choices"][0]
    assert empty["aogpt"]["tokens"] == plain["aogpt"]["tokens"] and empty["text"] == plain["text"]


def test_models_lists_the_context(server):
    listed = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert listed["id"] == server.name and listed["context"] == listed["max_model_len"] == 32
    assert json.loads(json.dumps(listed))["object"] == "model"
