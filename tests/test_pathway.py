"""A gated pathway (`aogpt.pathway`): its parts, the exact KV cache with the gate, and generation on a
gated model against the project's oracles (cache = recomputation, chi-square laws against the
enumerated exact law with a power check, batch invariance, the source's own left-to-right samples)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from aogpt.adaptation.ours import BACKBONE_FIELDS
from aogpt.adaptation.source import Source
from aogpt.adaptation.target import build
from aogpt.config import model_config
from aogpt.generation.generate import generate, infill
from aogpt.model import Transformer
from aogpt.orders import gates, identity_run, make_order_sampler, step_gates
from aogpt.pathway import DeltaLinear, RowSplit
from tests.generation.test_generate import chi2_pvalue, exact_joint


def tiny_gated(variant: str = "aogpt", rank: int = 0, vocab: int = 11, block: int = 12, seed: int = 0,
               scale: float = 0.5, dtype: torch.dtype = torch.float64, n_embd: int = 16) -> Transformer:
    """A gated model with every weight random (the pathway far from zero, so gates matter)."""
    torch.manual_seed(seed)
    extra = {"target_dim": 8} if variant == "aogpt" else {}
    model = Transformer(model_config(variant, n_layer=2, n_head=2, n_embd=n_embd, block_size=block, vocab_size=vocab,
                                     pathway="gated", pathway_rank=rank, **extra))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, scale)
    return model.to(dtype).eval()


def source_and_gated(rank: int = 2, vocab: int = 11, block: int = 10, seed: int = 0,
                     dtype: torch.dtype = torch.float64) -> tuple[Transformer, Transformer]:
    """A random GPT, and the AO-GPT adapted from it with a gated pathway perturbed away from zero."""
    torch.manual_seed(seed)
    gpt = Transformer(model_config("gpt", n_layer=2, n_head=2, n_embd=16, block_size=block, vocab_size=vocab))
    with torch.no_grad():
        for p in gpt.parameters():
            p.normal_(0.0, 0.5)
    cfg = gpt.config
    state = {k: v for k, v in gpt.state_dict().items() if k != "lm_head.weight"}
    src = Source("gpt run", {k: getattr(cfg, k) for k in BACKBONE_FIELDS}, state, None, "")
    gated = build(src, "aogpt", target_dim=8, pathway="gated", rank=rank, seed=seed)
    with torch.no_grad():
        for p in gated.parameters():
            if p.requires_grad:
                p.normal_(0.0, 0.5)
    return gpt.to(dtype).eval(), gated.to(dtype).eval()


# ------------------------------------------------------------------------------------------- the parts
def test_a_delta_linear_is_the_source_or_the_source_plus_its_delta():
    for rank in (0, 3):
        layer = DeltaLinear(6, 5, True, rank).double()
        with torch.no_grad():
            for p in layer.deltas():
                p.normal_()
        x = torch.randn(4, 6, dtype=torch.float64)
        torch.testing.assert_close(layer(x), x @ layer.weight.T + layer.bias)
        delta = layer.delta_up @ layer.delta_down if rank else layer.delta
        torch.testing.assert_close(layer(x, True), x @ (layer.weight + delta).T + layer.bias)
        with torch.no_grad():
            kept = layer(x, True)
            layer.deltas()[0].add_(1.0)  # a change of a weight is seen, not the kept W + dW
            assert not torch.allclose(layer(x, True), kept)


def test_a_new_delta_is_zero_and_trains():
    layer = DeltaLinear(6, 5, False, 2)
    assert torch.equal(layer.delta_weight(), torch.zeros(5, 6)) and layer.delta_down.abs().sum() > 0
    x = torch.randn(3, 6)
    layer(x, True).sum().backward()
    assert layer.delta_up.grad.abs().sum() > 0


def test_row_split_puts_rows_back_where_they_were():
    x = torch.randn(2, 5, 3)
    gate = torch.tensor([[0, 1, 1, 0, 1], [1, 1, 1, 1, 0]], dtype=torch.bool)
    split = RowSplit(gate)
    a, b = split.split(x)
    assert a.shape == (3, 3) and b.shape == (7, 3)
    assert torch.equal(split.join(a, b), x)
    for pure in (torch.zeros(2, 5, dtype=torch.bool), torch.ones(2, 5, dtype=torch.bool)):
        s = RowSplit(pure)
        parts = s.split(x)
        rows = next(p for p in parts if p is not None)
        assert rows.shape == (10, 3) and rows.data_ptr() == x.data_ptr()  # a view: nothing gathered or copied
        assert torch.equal(s.join(*parts), x)


def test_gates_are_the_leading_identity_run():
    order = torch.tensor([[0, 1, 2, 3], [0, 2, 1, 3], [1, 0, 2, 3], [0, 1, 3, 2]])
    assert identity_run(order).tolist() == [4, 1, 0, 2]
    assert gates(order).long().tolist() == [[0, 0, 0, 0], [0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]]


# --------------------------------------------------------------------------------- the KV cache
@pytest.mark.parametrize("variant", ["aogpt", "sigma"])
def test_kv_cache_equals_recomputation_with_the_gate(variant):
    """Slot by slot through the cache, each slot's gate from `step_gates`, against one forward over the
    orders' slots (rows with identity runs of 0, some, all)."""
    model = tiny_gated(variant, rank=3)
    n = 12
    x = torch.randint(0, 11, (4, n), generator=torch.Generator().manual_seed(2))
    order = make_order_sampler("infill:5").sample(4, n, "cpu", torch.Generator().manual_seed(3))
    order[0], order[1] = torch.arange(n), torch.randperm(n, generator=torch.Generator().manual_seed(4))
    tokens, pos, target = model.slots_for_order(x, order)
    run = identity_run(order)
    assert {0, n} <= set(run.tolist()) and run[2:].min() > 0
    with torch.no_grad():
        full = model.forward_slots(tokens, pos, target)
        cache = model.setup_cache(4)
        rows = torch.arange(4)[:, None]
        stepped = torch.cat([model.forward_slots(
            tokens[:, t:t + 1], pos[:, t:t + 1], target[:, t:t + 1], cache=cache, cache_pos=t,
            gate=step_gates(run, rows, torch.full((4, 1), t), pos[:, t:t + 1], target[:, t:t + 1]))
            for t in range(n)], dim=1)
    torch.testing.assert_close(stepped, full, atol=1e-10, rtol=0)
    with pytest.raises(Exception, match="gate"):
        model.forward_slots(tokens[:, :1], pos[:, :1], target[:, :1], cache=model.setup_cache(4), cache_pos=0)


# ----------------------------------------------------------------------------------- generation
def test_generation_follows_the_exact_law_one_token_per_step():
    V, n, N = 3, 3, 24000
    model = tiny_gated("aogpt", rank=2, vocab=V, block=n, scale=0.8, seed=5)
    res = generate(model, num_samples=N, length=n, steps=n, policy="count", seed=11, batch_size=N)
    exact = exact_joint(model, n, V, [(1.0, [1, 1, 1])])
    assert abs(exact.sum() - 1) < 1e-12
    assert chi2_pvalue(res.tokens, V, exact) > 1e-3
    l2r = np.zeros(V ** n)  # power: the left-to-right joint (the source's) is firmly rejected
    for xi, x in enumerate(itertools.product(range(V), repeat=n)):
        l2r[xi] = math.exp(-model(torch.tensor([x]))[1].double().sum().item())
    assert chi2_pvalue(res.tokens, V, l2r) < 1e-6


def test_parallel_bernoulli_steps_follow_their_exact_law():
    V, n, N = 3, 3, 24000
    model = tiny_gated("sigma", rank=0, vocab=V, block=n, scale=0.8, seed=6)
    res = generate(model, num_samples=N, length=n, steps=2, policy="bernoulli", seed=12, batch_size=N)
    plans = [(math.comb(3, k) / 8, [k, 3 - k]) for k in range(4)]
    assert chi2_pvalue(res.tokens, V, exact_joint(model, n, V, plans)) > 1e-3
    assert chi2_pvalue(res.tokens, V, exact_joint(model, n, V, [(1.0, [1, 1, 1])])) < 1e-6


def test_left_to_right_generation_is_the_sources():
    """Read left to right, a gated model samples what its source samples, token for token and logit for
    logit (prompted too), whatever its pathway holds."""
    gpt, gated = source_and_gated()
    for kw in (dict(num_samples=6, length=10), dict(num_samples=4, length=10, prompt=[3, 1, 4])):
        a = generate(gpt, seed=3, order="l2r", policy="count", record_logits=True, **kw)
        b = generate(gated, seed=3, order="l2r", policy="count", record_logits=True, **kw)
        assert torch.equal(a.tokens, b.tokens)
        torch.testing.assert_close(a.logits, b.logits, atol=1e-12, rtol=0, equal_nan=True)
    c = generate(gated, seed=3, num_samples=6, length=10)  # in a random order: the pathway's
    assert not torch.equal(c.tokens, generate(gpt, seed=3, num_samples=6, length=10, order="l2r").tokens)


def test_the_recompute_baseline_and_the_cache_agree():
    model = tiny_gated("aogpt", rank=0)
    for kw in (dict(steps=5), dict(steps=12, prompt=[1, 2]), dict(steps=4, order="window:3")):
        a = generate(model, num_samples=5, length=12, seed=4, record_logits=True, **kw)
        b = generate(model, num_samples=5, length=12, seed=4, record_logits=True, use_cache=False, **kw)
        assert torch.equal(a.tokens, b.tokens)
        torch.testing.assert_close(a.logits, b.logits, atol=1e-10, rtol=0, equal_nan=True)


def test_batch_of_one_and_of_eight_sample_the_same():
    model = tiny_gated("aogpt", rank=2)
    for kw in (dict(steps=6), dict(prompt=[1, 2, 3]), dict(order="l2r"), dict(speculative=3),
               dict(order="confidence", steps=6)):
        many = generate(model, num_samples=8, length=12, seed=9, batch_size=8, **kw)
        one = [generate(model, num_samples=8, length=12, seed=9, batch_size=1, **kw)]
        assert torch.equal(many.tokens, one[0].tokens), kw


def test_speculative_and_adaptive_decoding_and_infilling_run_on_a_gated_model():
    from aogpt.sampling import SamplingConfig
    from tests.generation.test_speculative import chi2, exact_law

    V, n, N = 4, 4, 20000
    model = tiny_gated("aogpt", rank=2, vocab=V, block=n, scale=0.5, seed=3)
    res = generate(model, num_samples=N, length=n, seed=7, batch_size=N, speculative=3)
    cfg = SamplingConfig().validate()
    assert chi2(res.tokens, V, exact_law(model, n, V, cfg, None)) > 1e-3
    assert chi2(res.tokens, V, exact_law(model, n, V, cfg, None, parallel=True)) < 1e-6
    filled = infill(model, [2, None, None, 1], num_samples=4, seed=1, order="confidence")
    assert (filled.tokens[:, 0] == 2).all() and (filled.tokens[:, 3] == 1).all()
    a = generate(model, num_samples=6, length=n, seed=2, order="entropy")
    b = generate(model, num_samples=6, length=n, seed=2, order="entropy", use_cache=False)
    assert torch.equal(a.tokens, b.tokens)


def test_served_requests_are_offline_generation_bit_for_bit():
    from aogpt.serve import Engine, EngineLimits, Job
    from aogpt.serve.engine import job_size

    model = tiny_gated("aogpt", rank=4, vocab=64, block=24, scale=0.3, dtype=torch.float32, n_embd=32)
    requests = [{"length": 24, "seed": 1, "record_logits": True},
                {"length": 20, "seed": 2, "order": "l2r", "prompt": [5, 9], "record_logits": True},
                {"length": 24, "seed": 3, "steps": 6, "record_logits": True},
                {"length": 16, "seed": 4, "order": "l2r", "record_logits": True},
                {"length": 24, "seed": 5, "prompt": [1, 2, 3, 4], "steps": 8, "record_logits": True}]
    offline = [generate(model, **kw) for kw in requests]
    with Engine(model, EngineLimits(max_sequences=16)) as engine:
        jobs = [Job(kw, *job_size(kw, engine.model.config)) for kw in requests]
        for job in jobs:
            engine.submit(job)
        for job in jobs:
            assert job.finished.wait(120) and job.error is None, job.error
        row_invariant = engine.row_invariant
    for i, (job, want) in enumerate(zip(jobs, offline, strict=True)):
        assert torch.equal(job.result.tokens, want.tokens), f"request {i}"
        if row_invariant:
            got = job.result.logits
            assert torch.equal(got.nan_to_num(), want.logits.nan_to_num()), f"request {i}"
