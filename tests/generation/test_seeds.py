"""One sample per seed: the execution path never changes which tokens a seed draws.

Sequence i of `generate(seed=s)` draws from its own streams (`aogpt.generation.streams`), so the
KV cache or full recomputation, the packed or padded layout of a step, the static shapes of a
captured step (run eagerly here), the batch size, the attention kernel and the decode path must all
give the same tokens, orders and step counts (float64 models:
the paths' logits differ by rounding only, far below the gap a uniform would have to fall into to
draw another token). Every policy and every kind of order is covered, for AO-GPT, sigma-GPT, our GPT
and the encoder-only MDM.
"""

from __future__ import annotations

import pytest
import torch

from aogpt.generation.generate import generate
from tests.generation.test_generate import tiny_model

N, n = 5, 10

FIXED = {  # fixed orders: every execution option applies
    "random, bernoulli": dict(policy="bernoulli", steps=4),
    "random, bernoulli, one per step": dict(policy="bernoulli", steps=n),
    "random, count": dict(policy="count", steps=3),
    "l2r, bernoulli": dict(policy="bernoulli", steps=5, order="l2r"),
    "blockwise, count, cosine": dict(policy="count", steps=4, order="blockwise:3", schedule="cosine"),
    "mallows, bernoulli, top-p": dict(policy="bernoulli", steps=6, order="mallows:0.5", top_p=0.8),
    "given order, prompt": dict(policy="bernoulli", steps=3, prompt=[1, 2],
                                order=torch.randperm(n, generator=torch.Generator().manual_seed(1))),
}
ADAPTIVE = {
    "confidence": dict(order="confidence"),
    "margin, 3 candidates, bernoulli": dict(order="margin", candidates=3, policy="bernoulli", steps=5),
    "entropy, threshold": dict(order="entropy", threshold=0.5, steps=4),
}
SPECULATIVE = {"speculative 3": dict(speculative=3), "speculative auto": dict(speculative="auto")}


def paths(kw: dict) -> list[dict]:
    """The execution options that must not change a sample (the first is the reference)."""
    out = [dict(batch_size=N), dict(batch_size=2), dict(batch_size=1), dict(batch_size=N, attention="explicit"),
           dict(batch_size=3, decode_path="reference"), dict(batch_size=N, decode_path="reference", attention="sdpa")]
    if "speculative" not in kw:
        out += [dict(batch_size=N, use_cache=False), dict(batch_size=2, use_cache=False)]
    out += [dict(batch_size=N, graphs="eager"), dict(batch_size=2, graphs="eager")]  # a GPU's static-shape steps
    return out


def same_sample(model: torch.nn.Module, kw: dict) -> None:
    results = [generate(model, num_samples=N, length=n, seed=9, **kw, **path) for path in paths(kw)]
    first = results[0]
    for path, res in zip(paths(kw), results, strict=True):
        assert torch.equal(res.tokens, first.tokens), f"tokens differ with {path}"
        assert torch.equal(res.orders, first.orders), f"orders differ with {path}"
        assert torch.equal(res.step_counts[:, :first.step_counts.shape[1]], first.step_counts), path


@pytest.mark.parametrize("variant", ["aogpt", "sigma"])
@pytest.mark.parametrize("case", list(FIXED) + list(ADAPTIVE) + list(SPECULATIVE))
def test_a_seed_draws_the_same_sample_on_every_path(variant, case):
    kw = {**FIXED, **ADAPTIVE, **SPECULATIVE}[case]
    same_sample(tiny_model(variant, vocab=11, block=n), kw)


def test_the_left_to_right_gpt_and_the_encoder_too():
    same_sample(tiny_model("gpt", vocab=11, block=n), dict(order="l2r", policy="count"))
    encoder = tiny_model("encoder-mdm", vocab=11, block=n)
    for kw in (dict(policy="bernoulli", steps=4), dict(order="confidence")):
        results = [generate(encoder, num_samples=N, length=n, seed=9, batch_size=b, **kw) for b in (N, 2, 1)]
        assert all(torch.equal(r.tokens, results[0].tokens) for r in results[1:])


def test_the_reported_case_cache_or_recompute():
    """Four samples of 24 tokens in 6 steps, the same seed with and without the KV cache."""
    for variant in ("aogpt", "sigma"):
        model = tiny_model(variant, vocab=11, block=24)
        cached = generate(model, num_samples=4, length=24, steps=6, seed=9)
        recomputed = generate(model, num_samples=4, length=24, steps=6, seed=9, use_cache=False)
        assert torch.equal(cached.tokens, recomputed.tokens)


def test_sequence_i_of_a_call_is_sequence_i_of_a_larger_call():
    """Batch-size invariance across calls: the first samples of a larger call are the smaller call's."""
    model = tiny_model("aogpt", vocab=11, block=n)
    small = generate(model, num_samples=3, length=n, steps=4, seed=9, batch_size=3)
    large = generate(model, num_samples=7, length=n, steps=4, seed=9, batch_size=4)
    assert torch.equal(large.tokens[:3], small.tokens) and torch.equal(large.orders[:3], small.orders)


def test_different_seeds_still_differ():
    model = tiny_model("aogpt", vocab=11, block=n)
    a, b = (generate(model, num_samples=N, length=n, seed=s).tokens for s in (1, 2))
    assert not torch.equal(a, b)


@pytest.mark.parametrize("case", ["random, bernoulli", "given order, prompt", "margin, 3 candidates, bernoulli",
                                  "speculative 3"])
def test_one_seed_per_sample_draws_what_each_seed_draws_alone(case):
    """`generate(seed=[s0, s1, ...])`: independent requests decoded as one batch (split across
    batches too), each sample what ``generate(seed=s_i)`` gives for its only sample."""
    kw = {**FIXED, **ADAPTIVE, **SPECULATIVE}[case]
    model = tiny_model("aogpt", vocab=11, block=n)
    seeds = [3, 41, 3, 1 << 40, 7]
    together = generate(model, num_samples=N, length=n, seed=seeds, batch_size=3, **kw)
    for i, s in enumerate(seeds):
        alone = generate(model, num_samples=1, length=n, seed=s, **kw)
        assert torch.equal(together.tokens[i], alone.tokens[0]) and torch.equal(together.orders[i], alone.orders[0])
    assert together.settings["seed"] == seeds
    assert not torch.equal(together.tokens[0], together.tokens[1])


def test_a_seed_list_of_the_wrong_length_is_refused():
    from aogpt.errors import AOGPTError

    with pytest.raises(AOGPTError, match="one seed per sample"):
        generate(tiny_model("aogpt", vocab=11, block=n), num_samples=3, length=n, seed=[1, 2])
