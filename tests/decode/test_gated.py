"""`aogpt.decode.gated`: the fast decode path of a gated model computes its `forward_slots` (the source's
kernels on left-to-right rows, W + dW on the others) on every layout, and its kernels are row-invariant."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aogpt.decode.gated import GatedStepModel
from aogpt.inference import for_inference
from aogpt.kv_cache import ragged_rows
from aogpt.orders import identity_run, make_order_sampler, step_gates
from tests.test_pathway import tiny_gated


@pytest.mark.parametrize("variant", ["aogpt", "sigma"])
def test_a_fast_step_is_the_models_step_for_mixed_pure_and_packed_rows(variant):
    model = tiny_gated(variant, rank=3, dtype=torch.float64, vocab=13)
    runner = for_inference(model)
    assert isinstance(runner, GatedStepModel) and runner.row_invariant() in (True, False)
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
        # a packed ragged step: sequence b's rows at its own columns
        sizes, first = np.array([2, 0, 3, 1]), np.array([1, 0, 4, 7])
        b, col, where = ragged_rows(sizes, first, first + sizes, torch.float64, torch.device("cpu"))
        bt, ct = torch.from_numpy(b), torch.from_numpy(col)
        tok, p, tg = tokens[bt, ct][None], pos[bt, ct][None], target[bt, ct][None]
        gate = step_gates(run, bt[None], ct[None], p, tg)
        want, got = (m.forward_slots(tok, p, tg, cache=c, cache_pos=where, gate=gate) for m, c in
                     zip((model, runner), (model.setup_cache(B), runner.setup_cache(B, attention="sdpa")), strict=True))
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


def test_a_left_to_right_step_is_the_source_fast_paths_bit_for_bit():
    from tests.test_pathway import source_and_gated

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
