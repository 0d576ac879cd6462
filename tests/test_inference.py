"""`aogpt.inference.for_inference`: the decode runner (fast path, or the reference path's packed copy)
is reused while the weights are unchanged and rebuilt when any weight changes (in place, by dtype,
or, for the reference path, by a new row hint)."""

from __future__ import annotations

import copy

import pytest
import torch

from aogpt import capability
from aogpt.generation.generate import generate
from aogpt.inference import for_inference, packing_available
from tests.generation.test_generate import tiny_model
from tests.helpers import needs_bf16_packing

pytestmark = pytest.mark.skipif(not packing_available(tiny_model("aogpt", vocab=8, block=4, dtype=torch.float32)),
                                reason="no oneDNN packing on this machine")


def test_packed_copy_is_reused_until_a_weight_changes():
    model = tiny_model("aogpt", vocab=16, block=8, dtype=torch.float32)
    first = for_inference(model, path="reference")
    assert for_inference(model, path="reference") is first
    fast = for_inference(model)
    assert fast is not first and for_inference(model) is fast and for_inference(model, rows_hint=4) is fast
    with torch.no_grad():
        model.lm_head.weight.mul_(2)  # in place: the version moves
    second = for_inference(model, path="reference")
    assert second is not first and torch.equal(second.lm_head.weight, model.lm_head.weight)
    assert for_inference(model, rows_hint=4, path="reference") is not second
    x = torch.randn(3, 16)
    with torch.inference_mode():
        assert for_inference(model) is not fast and torch.allclose(for_inference(model).head(x), model.lm_head(x),
                                                                     atol=1e-5)


@needs_bf16_packing
def test_a_bf16_model_is_packed_in_bf16():
    model = tiny_model("aogpt", vocab=16, block=8, dtype=torch.float32)
    fp32 = for_inference(model, path="reference")
    model.to(torch.bfloat16)
    packed = for_inference(model, path="reference")
    assert packed is not fp32 and packed.lm_head.packed.dtype == torch.bfloat16


def test_a_bf16_model_is_left_unpacked_without_bf16(as_cpu):
    """The sibling on a CPU without bf16 (the capability module says so): plain linear layers, no
    packing call that such a CPU's oneDNN would refuse."""
    if capability.cpu().arch != "x86":
        pytest.skip("the avx2 class is an x86 class")
    as_cpu("avx2")
    model = tiny_model("aogpt", vocab=16, block=8, dtype=torch.float32).to(torch.bfloat16)
    assert not packing_available(model) and for_inference(model, path="reference") is model
    fast = for_inference(model)  # the fast path chooses among the kernels this CPU class runs: no oneDNN
    assert all(not k.onednn for k in fast.decode_linears().values())


def test_generation_after_a_weight_change_uses_the_new_weights():
    model = tiny_model("aogpt", vocab=16, block=8, dtype=torch.float32)
    kw = dict(num_samples=4, length=8, steps=4, seed=1, record_logits=True)
    generate(model, **kw)  # packs and keeps the copy
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    fresh = copy.deepcopy(model)  # never packed before
    a, b = generate(model, **kw), generate(fresh, **kw)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logits, b.logits)
