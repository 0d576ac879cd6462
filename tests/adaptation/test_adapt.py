"""`aogpt.adapt`: the adapted model equals its source left to right at step 0, for every source family
and both variants, and its KV cache equals recomputation."""

from __future__ import annotations

import pytest
import torch

from aogpt.adaptation import adapt
from aogpt.errors import AOGPTError
from tests.adaptation.conftest import make_hf

TOL = 1e-5


def _source_logits(folder, x: torch.Tensor, start: torch.Tensor | None) -> torch.Tensor:
    """The source's own logits for x[:, 0..n-1]: fed its beginning-of-text token (or the start vector)
    first, then x[:, :n-1]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    bos = model.config.bos_token_id
    with torch.no_grad():
        if bos is not None:
            ids = torch.cat([torch.full((x.shape[0], 1), bos), x[:, :-1]], dim=1)
            return model(input_ids=ids).logits
        embeds = model.get_input_embeddings()(x[:, :-1])
        return model(inputs_embeds=torch.cat([start.expand(x.shape[0], 1, -1), embeds], dim=1)).logits


@pytest.mark.parametrize("variant", ["aogpt", "sigma"])
@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_left_to_right_logits_equal_the_source(hf_models, arch, variant):
    adapted = adapt(hf_models[arch], variant)
    model = adapted.model
    x = torch.randint(0, 250, (3, model.config.block_size), generator=torch.Generator().manual_seed(1))
    ours = model(x)[0]
    theirs = _source_logits(hf_models[arch], x, model.transformer.wnonee.weight.detach())
    assert theirs.std() > 0.5  # far from uniform: the comparison means something
    torch.testing.assert_close(ours, theirs, atol=TOL, rtol=0)


def test_the_start_slot_is_the_beginning_of_text_token(hf_models):
    from transformers import AutoModelForCausalLM

    src = AutoModelForCausalLM.from_pretrained(hf_models["gpt2"])
    gpt2 = adapt(hf_models["gpt2"], "aogpt")
    assert torch.equal(gpt2.model.transformer.wnonee.weight[0], src.transformer.wte.weight[50256])
    assert gpt2.meta["adapted_from"]["start"] == \
        "the source's beginning-of-text token '<|endoftext|>' (id 50256, its tokenizer's bos_token)"
    llama = adapt(hf_models["llama"], "aogpt")
    assert llama.meta["adapted_from"]["start"] == \
        "the source's beginning-of-text token '<|endoftext|>' (id 256, its tokenizer's bos_token)"
    no_bos = adapt(hf_models["qwen2"], "aogpt")
    assert no_bos.meta["adapted_from"]["start"] == \
        "the mean token embedding (the source has no beginning-of-text token)"
    wte = AutoModelForCausalLM.from_pretrained(hf_models["qwen2"]).get_input_embeddings().weight
    torch.testing.assert_close(no_bos.model.transformer.wnonee.weight[0], wte.mean(0))


def test_a_config_bos_without_a_tokenizer_bos_is_the_start_slot(tmp_path):
    """The same rule when only the model's config names the beginning-of-text token."""
    import json

    from transformers import AutoModelForCausalLM

    src = make_hf(tmp_path, "qwen2", bos=False)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "bos_token_id": 256}))
    adapted = adapt(src, "aogpt")
    assert adapted.meta["adapted_from"]["start"] == \
        "the source's beginning-of-text token '<|endoftext|>' (id 256, its config's bos_token_id)"
    wte = AutoModelForCausalLM.from_pretrained(src).get_input_embeddings().weight
    assert torch.equal(adapted.model.transformer.wnonee.weight[0], wte[256])


def test_a_source_without_tokenizer_files_is_refused_alike_for_every_family(tmp_path):
    """`transformers` builds an empty GPT-2 or Qwen2 tokenizer from no files and fails for Llama: every
    family is refused with the same message instead, before anything is written."""
    messages = set()
    for arch in ("gpt2", "qwen2", "llama"):
        src = make_hf(tmp_path, arch, tokenizer=False)
        with pytest.raises(AOGPTError) as info:
            adapt(src, "aogpt", tmp_path / f"out-{arch}")
        messages.add((info.value.what.replace(str(src), "SRC"), info.value.fix))
        assert not (tmp_path / f"out-{arch}").exists()
    assert messages == {("SRC has no tokenizer files: none of tokenizer.json, vocab.json, tokenizer.model, vocab.txt",
                         "save the model's tokenizer beside it: tokenizer.save_pretrained(FOLDER)")}


def test_architecture_switches_are_the_sources(hf_models):
    gpt2 = adapt(hf_models["gpt2"], "aogpt").config
    assert (gpt2.norm, gpt2.positions, gpt2.mlp, gpt2.tie_head, gpt2.bias, gpt2.qk_norm) == (
        "layernorm", "learned", "gelu-tanh", True, True, False)
    assert adapt(hf_models["gpt2"], "aogpt").tokenizer.spec == "gpt2"
    llama = adapt(hf_models["llama"], "aogpt").config
    assert (llama.norm, llama.positions, llama.mlp, llama.mlp_hidden, llama.kv_heads, llama.rope_theta,
            llama.bias, llama.qkv_bias, llama.tie_head) == ("rmsnorm", "rotary", "swiglu", 40, 2, 500.0, False, False,
                                                            False)
    qwen = adapt(hf_models["qwen2"], "sigma").config
    assert (qwen.qkv_bias, qwen.bias, qwen.tie_head) == (True, False, True)


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model.double().eval()


@pytest.mark.parametrize("variant", ["aogpt", "sigma"])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_kv_cache_equals_recomputation_in_any_order(hf_models, arch, variant):
    """Slot by slot through the static cache, in a random order, against one full forward (the target
    pathway perturbed so that orders matter)."""
    model = _perturbed(adapt(hf_models[arch], variant).model)
    n = 12
    x = torch.randint(0, 250, (2, n), generator=torch.Generator().manual_seed(2))
    order = torch.stack([torch.randperm(n, generator=torch.Generator().manual_seed(s)) for s in (4, 5)])
    tokens, pos, target = model.slots_for_order(x, order)
    with torch.no_grad():
        full = model.forward_slots(tokens, pos, target)
        cache = model.setup_cache(2)
        stepped = torch.cat([model.forward_slots(tokens[:, t:t + 1], pos[:, t:t + 1], target[:, t:t + 1], cache=cache,
                                                 cache_pos=t) for t in range(n)], dim=1)
    torch.testing.assert_close(stepped, full, atol=1e-10, rtol=0)


def test_our_gpt_run_adapts_exactly(tiny_gpt_run):
    import aogpt

    source = aogpt.load(tiny_gpt_run)
    x = torch.randint(0, 256, (2, source.config.block_size), generator=torch.Generator().manual_seed(0))
    for variant in ("aogpt", "sigma"):
        adapted = adapt(tiny_gpt_run, variant)
        torch.testing.assert_close(adapted.model(x)[0], source.model(x)[0], atol=TOL, rtol=0)
        assert adapted.tokenizer.spec == source.tokenizer.spec


@pytest.fixture(scope="module")
def tiny_gpt_run(tmp_path_factory, bytes_data):
    from aogpt.cli import main

    out = tmp_path_factory.mktemp("runs") / "gpt"
    assert main(["train", "--preset", "tiny", "--variant", "gpt", "--data", str(bytes_data), "--out", str(out),
                 "--max-steps", "4", "--no-progress"]) == 0
    return out
