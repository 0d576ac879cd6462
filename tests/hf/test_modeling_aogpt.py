"""`AOGPTForCausalLM` against our model: next-token logits, losses, orders, padding, saving and
loading (registered and through ``trust_remote_code``), and Hugging Face's ``generate()``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import aogpt
from aogpt.config import model_config
from aogpt.data.tokenizer import ByteTokenizer
from aogpt.errors import AOGPTError
from aogpt.evaluation.evaluate import conditional_logprobs, evaluate
from aogpt.hf import AOGPTConfig, AOGPTForCausalLM, to_hf, to_hf_tokenizer
from aogpt.model import Transformer
from tests.helpers import prefix_conditional, random_model

DECODERS = ("gpt", "sigma", "aogpt")
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def batch(n: int = 6, vocab: int = 11, rows: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (rows, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("variant", DECODERS)
def test_left_to_right_logits_and_loss_are_ours(variant: str) -> None:
    model = random_model(variant, n=8)
    hf = to_hf(model)
    x = batch()
    out = hf(x, labels=x)
    n = x.shape[1]
    for b in range(x.shape[0]):
        for i in range(n - 1):  # logits[:, i] predicts position i + 1 from positions 0..i
            want = torch.log_softmax(out.logits[b, i], -1)[x[b, i + 1]]
            assert float(-want) == pytest.approx(prefix_conditional(model, x[b:b + 1], list(range(n)), i + 1),
                                                 abs=1e-10)
    # the last row predicts the continuation (position n), as our conditional_logprobs does
    extended = torch.cat([x, torch.zeros_like(x[:, :1])], 1)
    cont = conditional_logprobs(model, extended, torch.arange(n).expand(3, n), torch.full((3, 1), n))[:, 0]
    torch.testing.assert_close(torch.log_softmax(out.logits[:, -1], -1), cont, atol=1e-10, rtol=0)
    # the loss scores every position, the first one from the start slot: the exact NLL per token
    assert float(out.loss) == pytest.approx(evaluate(model, x).nll, abs=1e-10)
    first_skipped = x.clone()
    first_skipped[:, 0] = -100  # Hugging Face GPT-2's convention
    by_hand = -torch.log_softmax(out.logits[:, :-1], -1).gather(2, x[:, 1:, None]).mean()
    assert float(hf(x, labels=first_skipped).loss) == pytest.approx(float(by_hand), abs=1e-10)
    assert aogpt.family_of(hf).name == variant and evaluate(hf, x).nll == evaluate(model, x).nll  # unwraps


@pytest.mark.parametrize("variant", ("sigma", "aogpt"))
def test_any_order_reading(variant: str) -> None:
    model = random_model(variant, n=8)
    hf = to_hf(model)
    x = batch()
    order = torch.stack([torch.randperm(6, generator=torch.Generator().manual_seed(s)) for s in range(3)])
    out = hf(x, labels=x, order=order)
    assert float(out.loss) == pytest.approx(evaluate(model, x, order=order).nll, abs=1e-10)
    for b in range(3):
        sigma = order[b].tolist()
        for i in range(5):  # logits[:, i] predicts position order[i + 1] after reading order[:i + 1]
            got = -torch.log_softmax(out.logits[b, i], -1)[x[b, sigma[i + 1]]]
            assert float(got) == pytest.approx(prefix_conditional(model, x[b:b + 1], sigma, i + 1), abs=1e-10)
    one_order = hf(x, order=order[0]).logits  # (n,): the same order for every row
    torch.testing.assert_close(one_order, hf(x, order=order[0].expand(3, 6)).logits, atol=0, rtol=0)


def test_refusals() -> None:
    gpt = to_hf(random_model("gpt", n=8))
    x = batch()
    with pytest.raises(AOGPTError, match="left to right only"):
        gpt(x, order=torch.tensor([1, 0, 2, 3, 4, 5]))
    with pytest.raises(AOGPTError, match="not a permutation"):
        to_hf(random_model("aogpt", n=8))(x, order=torch.tensor([0, 0, 2, 3, 4, 5]))
    with pytest.raises(AOGPTError, match="exceed the model's context"):
        gpt(batch(n=9))
    mask = torch.ones_like(x)
    mask[0, 0] = 0
    with pytest.raises(AOGPTError, match="padding works with left-to-right"):
        to_hf(random_model("aogpt", n=8))(x, attention_mask=mask, order=torch.arange(6))
    encoder = model_config("encoder-mdm", n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11)
    with pytest.raises(AOGPTError, match="not a causal language model"):
        AOGPTForCausalLM(AOGPTConfig.from_model_config(encoder))
    with pytest.raises(AOGPTError, match="not a causal language model"):
        to_hf(Transformer(encoder))


@pytest.mark.parametrize("variant", ("gpt", "aogpt"))
def test_padding_left_and_right_gives_each_row_its_own_result(variant: str) -> None:
    hf = to_hf(random_model(variant, n=8))
    rows = [[3, 1, 4, 1, 5, 9], [2, 6], [5, 3, 5, 8]]
    for side in ("left", "right"):
        ids = torch.zeros(3, 6, dtype=torch.long)
        mask = torch.zeros(3, 6, dtype=torch.long)
        for r, row in enumerate(rows):
            cols = slice(6 - len(row), 6) if side == "left" else slice(0, len(row))
            ids[r, cols], mask[r, cols] = torch.tensor(row), 1
        out = hf(ids, attention_mask=mask, labels=ids)
        total = 0.0
        for r, row in enumerate(rows):
            alone = hf(torch.tensor([row]), labels=torch.tensor([row]))
            cols = mask[r].bool()
            torch.testing.assert_close(out.logits[r, cols], alone.logits[0], atol=1e-10, rtol=0)
            total += float(alone.loss) * len(row)
        assert float(out.loss) == pytest.approx(total / sum(map(len, rows)), abs=1e-10)


@pytest.mark.parametrize("variant", DECODERS)
def test_save_and_from_pretrained_round_trip_bit_exactly(tmp_path: Path, variant: str) -> None:
    hf = to_hf(random_model(variant, n=8).float())
    hf.save_pretrained(tmp_path)
    assert {"config.json", "model.safetensors", "modeling_aogpt.py", "configuration_aogpt.py"} <= {
        p.name for p in tmp_path.iterdir()}
    assert AutoConfig.from_pretrained(tmp_path).auto_map == {
        "AutoConfig": "configuration_aogpt.AOGPTConfig", "AutoModelForCausalLM": "modeling_aogpt.AOGPTForCausalLM"}
    again = AutoModelForCausalLM.from_pretrained(tmp_path)  # registered by importing aogpt.hf
    assert type(again) is AOGPTForCausalLM and again.config.to_model_config() == hf.config.to_model_config()
    ours, theirs = hf.state_dict(), again.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    if variant != "aogpt":  # a tied head stays tied
        assert again.model.lm_head.weight is again.model.transformer.wte.weight
    x = batch()
    assert torch.equal(again(x).logits, hf(x).logits)


@pytest.mark.slow  # a fresh interpreter imports transformers (seconds)
def test_trust_remote_code_loads_without_aogpt_imported(tmp_path: Path) -> None:
    hf = to_hf(random_model("aogpt", n=8).float())
    hf.save_pretrained(tmp_path / "model")
    to_hf_tokenizer(ByteTokenizer()).save_pretrained(tmp_path / "model")
    x = batch()
    torch.save(x, tmp_path / "x.pt")
    script = f"""
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
m = AutoModelForCausalLM.from_pretrained({str(tmp_path / "model")!r}, trust_remote_code=True)
assert type(m).__module__.startswith("transformers_modules"), type(m).__module__
tok = AutoTokenizer.from_pretrained({str(tmp_path / "model")!r}, trust_remote_code=True)
assert tok("héllo")["input_ids"] == list("héllo".encode()), tok("héllo")
assert "aogpt.hf" not in sys.modules
torch.save(m(torch.load({str(tmp_path / "x.pt")!r})).logits, {str(tmp_path / "logits.pt")!r})
"""
    env = {**os.environ, "PYTHONPATH": str(SRC), "HF_MODULES_CACHE": str(tmp_path / "modules"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), hf(x).logits)  # float32 precision


@pytest.mark.parametrize("variant", DECODERS)
def test_hf_generate_continues_like_our_generator(variant: str) -> None:
    model = random_model(variant, n=12, vocab=11).float()
    hf = to_hf(model)
    prompts = [[3, 1, 4, 1], [5, 9], [2, 6, 5]]
    ours = [aogpt.generate(model, prompt=p, length=len(p) + 5, greedy=True, order="l2r", policy="count",
                           steps=5, seed=0).tokens[0].tolist() for p in prompts]
    for p, want in zip(prompts, ours, strict=True):
        got = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                          max_new_tokens=5, do_sample=False, pad_token_id=0)
        assert got[0].tolist() == want
    ids = torch.zeros(3, 4, dtype=torch.long)  # a left-padded batch
    mask = torch.zeros(3, 4, dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, 4 - len(p):], mask[r, 4 - len(p):] = torch.tensor(p), 1
    got = hf.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    for r, (p, want) in enumerate(zip(prompts, ours, strict=True)):
        assert got[r, 4:].tolist() == want[len(p):]


def test_any_order_generation_and_infilling_are_reachable_from_the_wrapper() -> None:
    model = random_model("aogpt", n=12, vocab=11).float()
    hf = to_hf(model)
    got = hf.aogpt_generate(length=10, num_samples=2, seed=3, order="random")
    assert torch.equal(got.tokens, aogpt.generate(model, length=10, num_samples=2, seed=3, order="random").tokens)
    filled = hf.aogpt_infill([1, None, None, 4, None], seed=0)
    assert filled.tokens[0, [0, 3]].tolist() == [1, 4]
