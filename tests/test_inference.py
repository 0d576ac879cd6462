"""`aogpt.inference.for_inference`: the fast decode path (the model with the measured kernels swapped
in) is reused while the weights are unchanged and rebuilt when any weight changes (in place or by
dtype); the reference path is the model itself."""

from __future__ import annotations

import copy

import pytest
import torch

from aogpt import capability
from aogpt.decode.runner import decode_linears
from aogpt.generation.generate import generate
from aogpt.inference import for_inference, packing_available
from tests.generation.test_generate import tiny_model
from tests.helpers import needs_bf16_packing

pytestmark = pytest.mark.skipif(not packing_available(tiny_model("aogpt", vocab=8, block=4, dtype=torch.float32)),
                                reason="no oneDNN packing on this machine")


def test_the_fast_path_is_reused_until_a_weight_changes():
    model = tiny_model("aogpt", vocab=16, block=8, dtype=torch.float32)
    assert for_inference(model, path="reference") is model
    fast = for_inference(model)
    assert fast is not model and for_inference(model) is fast
    with torch.no_grad():
        model.lm_head.weight.mul_(2)  # in place: the version moves
    again = for_inference(model)
    assert again is not fast and again.lm_head.weight is model.lm_head.weight
    x = torch.randn(3, 16)
    with torch.inference_mode():
        torch.testing.assert_close(again.lm_head(x), model.lm_head(x), atol=1e-5, rtol=1e-5)


@needs_bf16_packing
def test_a_bf16_model_is_packed_in_bf16():
    model = tiny_model("aogpt", vocab=16, block=8, dtype=torch.float32)
    fp32 = for_inference(model)
    model.to(torch.bfloat16)
    packed = for_inference(model)
    assert packed is not fp32 and packed.lm_head.prepared.dtype == torch.bfloat16


def test_a_bf16_model_is_left_unpacked_without_bf16(as_cpu):
    """The sibling on a CPU without bf16 (the capability module says so): plain linear layers, no
    packing call that such a CPU's oneDNN would refuse."""
    if capability.cpu().arch != "x86":
        pytest.skip("the avx2 class is an x86 class")
    as_cpu("avx2")
    model = tiny_model("aogpt", vocab=16, block=8, dtype=torch.float32).to(torch.bfloat16)
    assert not packing_available(model) and for_inference(model, path="reference") is model
    fast = for_inference(model)  # the fast path chooses among the kernels this CPU class runs: no oneDNN
    assert all(not k.onednn for k in decode_linears(fast).values())


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
