"""`aogpt.decode.gated`: the fast decode path of a gated model is its own forward with two kernels per
delta layer (the source's weight, the merged W + dW): it computes the model's `forward_slots` on every
layout, a left-to-right step is the source's fast step bit for bit, and its kernels are checked for
row invariance both ways."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aogpt.decode.gated import PATHWAY, GatedKernel
from aogpt.decode.graphs import mode
from aogpt.decode.layouts import step_rows
from aogpt.decode.runner import decode_linears, row_invariant, weight_bytes
from aogpt.inference import for_inference
from aogpt.orders import identity_run, make_order_sampler, step_gates
from aogpt.pathway import DeltaLinear
from tests.test_pathway import source_and_gated, tiny_gated


def test_the_fast_path_swaps_every_delta_layer_for_its_two_kernels():
    model = tiny_gated("aogpt", rank=3, dtype=torch.float64, vocab=13)
    fast = for_inference(model)
    assert fast is not model and not any(isinstance(m, DeltaLinear) for m in fast.modules())
    gated = [m for m in fast.modules() if isinstance(m, GatedKernel)]
    assert len(gated) == 4 * model.config.n_layer
    layer = model.transformer.h[0].mlp.c_fc
    kernel = fast.transformer.h[0].mlp.c_fc
    x = torch.randn(3, layer.in_features, dtype=torch.float64)
    torch.testing.assert_close(kernel(x), layer(x), atol=1e-12, rtol=0)
    torch.testing.assert_close(kernel.pathway_linear()(x), layer(x, True), atol=1e-12, rtol=0)
    assert not torch.allclose(kernel(x), kernel.pathway_linear()(x))  # the pathway is not zero here
    names = decode_linears(fast)
    assert sum(name.endswith(PATHWAY) for name in names) == len(gated)
    assert row_invariant(fast) in (True, False) and weight_bytes(fast) > 0


@pytest.mark.parametrize("variant", ["aogpt", "sigma"])
def test_a_fast_step_is_the_models_step_for_mixed_pure_and_ragged_rows(variant):
    model = tiny_gated(variant, rank=3, dtype=torch.float64, vocab=13)
    runner = for_inference(model)
    B, n = 4, 12
    x = torch.randint(0, 13, (B, n), generator=torch.Generator().manual_seed(0))
    order = make_order_sampler("infill:4").sample(B, n, "cpu", torch.Generator().manual_seed(1))
    order[0] = torch.arange(n)
    tokens, pos, target = model.slots_for_order(x, order)
    run = identity_run(order)
    rows = torch.arange(B)[:, None]
    caches = (model.setup_cache(B), runner.setup_cache(B, attention="sdpa"))
    with torch.no_grad():
        for t in range(0, n, 3):  # uniform (B, 3) blocks: mixed, pure source (row 0 early), pure pathway
            cols = slice(t, t + 3)
            gate = step_gates(run, rows, torch.arange(t, t + 3).expand(B, 3), pos[:, cols], target[:, cols])
            want, got = (m.forward_slots(tokens[:, cols], pos[:, cols], target[:, cols], cache=c, cache_pos=t,
                                         gate=gate) for m, c in zip((model, runner), caches, strict=True))
            torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
        sizes, first = np.array([2, 0, 3, 1]), np.array([1, 0, 4, 7])
        for layout in ("buckets", "runs", "padded"):  # a ragged step: sequence b's rows at its own columns
            b, col, where, mask = step_rows(layout, sizes, first, first + sizes, torch.float64, torch.device("cpu"))
            bt, ct = torch.from_numpy(b), torch.from_numpy(col)
            tok, p, tg = tokens[bt, ct][None], pos[bt, ct][None], target[bt, ct][None]
            gate = step_gates(run, bt[None], ct[None], p, tg)
            assert gate.any() and not gate.all()  # a mixed step
            want, got = (m.forward_slots(tok, p, tg, cache=c, cache_pos=where, attn_mask=mask, gate=gate) for m, c in
                         zip((model, runner), (model.setup_cache(B), runner.setup_cache(B, attention="sdpa")),
                             strict=True))
            torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


def test_a_left_to_right_step_is_the_source_fast_paths_bit_for_bit():
    gpt, gated = source_and_gated(dtype=torch.float32)
    fast_gpt, fast_gated = for_inference(gpt), for_inference(gated)
    x = torch.randint(0, 11, (3, 10), generator=torch.Generator().manual_seed(2))
    order = torch.arange(10).expand(3, 10)
    tokens, pos, target = gated.slots_for_order(x, order)
    c1, c2 = fast_gpt.setup_cache(3), fast_gated.setup_cache(3)
    with torch.no_grad():
        for t in range(10):
            s = slice(t, t + 1)
            a = fast_gpt.forward_slots(tokens[:, s], pos[:, s], target[:, s], cache=c1, cache_pos=t)
            b = fast_gated.forward_slots(tokens[:, s], pos[:, s], target[:, s], cache=c2, cache_pos=t,
                                         gate=torch.zeros(3, 1, dtype=torch.bool))
            assert torch.equal(a, b)
        bypassed = fast_gated.forward_slots(tokens[:, :1], pos[:, :1], target[:, :1], cache=fast_gated.setup_cache(3),
                                            cache_pos=0, gate=torch.ones(3, 1, dtype=torch.bool))
        first = fast_gpt.forward_slots(tokens[:, :1], pos[:, :1], target[:, :1], cache=fast_gpt.setup_cache(3),
                                       cache_pos=0)
        assert not torch.allclose(first, bypassed)  # the sibling: through the pathway the step is another


def test_a_gated_model_steps_are_never_captured():
    cuda = torch.device("cuda")
    assert mode("auto", cuda, True, False) == "capture"
    assert mode("auto", cuda, True, False, gated=True) is None and mode("eager", cuda, True, False, gated=True) is None
