"""Generation perplexity against a by-hand computation (one forward per scored token)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from aogpt.checkpoint import Loaded, save_checkpoint
from aogpt.config import model_config, to_dict
from aogpt.data.tokenizer import ByteTokenizer
from aogpt.errors import AOGPTError
from aogpt.evaluation.genppl import (
    CheckpointEvaluator,
    generate_texts,
    make_evaluator,
    read_samples,
    score_samples,
    unigram_entropy,
)
from aogpt.model import Transformer

EOT = 256


def tiny_loaded(variant: str = "gpt", block: int = 8) -> Loaded:
    torch.manual_seed(0)
    extra = {"target_dim": 8} if variant == "aogpt" else {}
    cfg = model_config(variant, n_layer=2, n_head=2, n_embd=16, block_size=block, vocab_size=320, **extra)
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return Loaded(model=model.double().eval().requires_grad_(False), tokenizer=ByteTokenizer(), config=cfg,
                  path=Path("tiny"))


def by_hand(model: Transformer, ids: list[int], context: int) -> float:
    """Sum of -log p over `ids`, windows of context-1 tokens after an EOT, one forward per token."""
    total = 0.0
    for k in range(0, len(ids), context - 1):
        window = ids[k:k + context - 1]
        for t in range(len(window)):
            prefix = torch.tensor([[EOT] + window[:t]])
            logits = model.forward_slots(*model.slots_for_order(prefix, torch.arange(t + 1)[None], True))[0, -1]
            total -= float(torch.log_softmax(logits, -1)[window[t]])
    return total


def test_generation_perplexity_equals_the_by_hand_sum() -> None:
    loaded = tiny_loaded()
    texts = ["hello", "abc<|endoftext|>ignored after the end", "a sample longer than two windows!", ""]
    ev = CheckpointEvaluator(loaded, "tiny")
    res = score_samples(ev, texts, batch_size=3)
    seqs = [list(b"hello"), list(b"abc") + [EOT], list(b"a sample longer than two windows!"), []]
    total = sum(by_hand(loaded.model, s, 8) for s in seqs)
    tokens = sum(len(s) for s in seqs)
    assert res.tokens == tokens == 5 + 4 + 33 and res.samples == 4 and res.empty_samples == 1
    assert res.nll == pytest.approx(total / tokens, abs=1e-10)
    assert res.genppl == pytest.approx(math.exp(total / tokens), rel=1e-10)
    assert res.per_sample_nll[1] == pytest.approx(by_hand(loaded.model, seqs[1], 8) / 4, abs=1e-10)
    ent = [unigram_entropy(s) for s in (list(b"hello"), list(b"abc"), seqs[2])]  # EOS not counted
    assert res.entropy == pytest.approx(sum(ent) / 3)
    assert score_samples(ev, texts, batch_size=1).nll == pytest.approx(res.nll, abs=1e-12)


def test_unigram_entropy_by_hand() -> None:
    assert unigram_entropy([7, 7, 9]) == pytest.approx(-(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3)))
    assert unigram_entropy([5] * 10) == 0.0 and unigram_entropy([]) == 0.0
    assert unigram_entropy(list(range(16))) == pytest.approx(math.log(16))


def test_read_samples_formats(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "one\\ntwo"}\n\n"three"\n')
    assert read_samples(tmp_path / "a.jsonl") == ["one\ntwo", "three"]
    (tmp_path / "b.json").write_text(json.dumps({"samples": ["x", "y"], "timing": {}}))
    assert read_samples(tmp_path / "b.json") == ["x", "y"]
    (tmp_path / "c.json").write_text(json.dumps(["p"]))
    assert read_samples(tmp_path / "c.json") == ["p"]
    (tmp_path / "d.txt").write_text("first\n\nsecond\n")
    assert read_samples(tmp_path / "d.txt") == ["first", "second"]
    for name, content, what in [("e.json", "{bad", "not valid JSON"), ("f.json", '{"n": 1}', "no list"),
                                ("g.txt", "\n\n", "no samples"), ("h.jsonl", "[1]\n", "holds no text")]:
        (tmp_path / name).write_text(content)
        with pytest.raises(AOGPTError, match=what):
            read_samples(tmp_path / name)
    with pytest.raises(AOGPTError, match="does not exist"):
        read_samples(tmp_path / "missing.jsonl")


def test_evaluators(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = tiny_loaded()
    save_checkpoint(tmp_path / "run" / "ckpt-0000001", loaded.model,
                    config={"model": to_dict(loaded.config), "tokenizer": "bytes"}, tokenizer=loaded.tokenizer,
                    ema={k: v.clone() for k, v in loaded.model.state_dict().items()})
    ev = make_evaluator(str(tmp_path / "run"), dtype=torch.float64)
    assert ev.context == 8 and ev.eos_id == EOT
    direct = score_samples(CheckpointEvaluator(loaded), ["some text here"])
    assert score_samples(ev, ["some text here"]).nll == pytest.approx(direct.nll, abs=1e-12)
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(AOGPTError, match="needs the package transformers"):
        make_evaluator("hf:gpt2-large")
    with pytest.raises(AOGPTError, match="no tokenizer"):
        CheckpointEvaluator(Loaded(model=loaded.model, tokenizer=None, config=loaded.config))


def test_generated_samples_can_be_scored() -> None:
    loaded = tiny_loaded("aogpt", block=8)
    texts = generate_texts(loaded, 3, seed=1, steps=4)
    assert len(texts) == 3 and all(isinstance(t, str) for t in texts)
    assert texts == generate_texts(loaded, 3, seed=1, steps=4)
    res = score_samples(CheckpointEvaluator(tiny_loaded("gpt")), texts)
    assert res.samples == 3 and res.tokens > 0 and math.isfinite(res.genppl)


def hf_by_hand(model, ids: list[int], context: int, eos: int) -> float:
    """The same sum for a Hugging Face causal LM: one forward of [EOS] + prefix per scored token."""
    total = 0.0
    for k in range(0, len(ids), context - 1):
        window = ids[k:k + context - 1]
        for t in range(len(window)):
            logits = model(torch.tensor([[eos] + window[:t]])).logits[0, -1]
            total -= float(torch.log_softmax(logits.double(), -1)[window[t]])
    return total


@torch.no_grad()
def test_hf_evaluator_on_a_local_gpt2_equals_the_by_hand_sum(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from aogpt.data.tokenizer import GPT2Tokenizer
    from aogpt.evaluation.genppl import HFEvaluator
    from aogpt.hf import to_hf_tokenizer

    torch.manual_seed(0)
    tiny = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=12, vocab_size=50257))
    tiny.save_pretrained(tmp_path / "gpt2")
    to_hf_tokenizer(GPT2Tokenizer()).save_pretrained(tmp_path / "gpt2")  # the GPT-2 BPE, offline
    ev = make_evaluator(f"hf:{tmp_path / 'gpt2'}")
    assert isinstance(ev, HFEvaluator) and ev.context == 12 and ev.eos_id == 50256
    texts = ["Hello there, my friend.", "short<|endoftext|>cut here",
             "a text long enough for two windows of tokens, and then some more words at the end!"]
    res = score_samples(ev, texts, batch_size=2)
    tok = GPT2Tokenizer()
    seqs = [tok.encode(texts[0]), tok.encode("short") + [50256], tok.encode(texts[2])]
    assert len(seqs[2]) > 11  # several windows
    model = ev.model.eval()
    total = sum(hf_by_hand(model, s, 12, 50256) for s in seqs)
    assert res.tokens == sum(map(len, seqs))
    assert res.nll == pytest.approx(total / res.tokens, abs=1e-5)
    with pytest.raises(AOGPTError, match="cannot load hf:"):
        make_evaluator(f"hf:{tmp_path / 'nothing-here'}")


@torch.no_grad()
def test_hf_evaluator_on_an_exported_checkpoint_equals_the_checkpoint_evaluator(tmp_path: Path) -> None:
    from aogpt.hf import export_hf

    loaded = tiny_loaded("aogpt")
    loaded.model.float()
    save_checkpoint(tmp_path / "run" / "ckpt-0000001", loaded.model,
                    config={"model": to_dict(loaded.config), "tokenizer": "bytes"}, tokenizer=loaded.tokenizer,
                    ema={k: v.clone() for k, v in loaded.model.state_dict().items()})
    export_hf(tmp_path / "run", tmp_path / "hf")
    texts = ["hello", "a sample longer than two windows!"]
    via_hf = score_samples(make_evaluator(f"hf:{tmp_path / 'hf'}"), texts)
    ours = score_samples(make_evaluator(str(tmp_path / "run")), texts)
    assert via_hf.tokens == ours.tokens and via_hf.nll == pytest.approx(ours.nll, abs=1e-5)
