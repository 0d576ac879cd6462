"""Generator correctness, each against an independent computation.

The reference for every logit the generator produces is `reference_logits` (`aogpt.generation.laws`,
which the GPU check also uses): a plain causal forward over the chain (start token, then the tokens
decided before the step, in order) whose last slot is the pending token with the queried target. No
cache, no custom mask, no padding.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from aogpt.config import model_config
from aogpt.errors import AOGPTError
from aogpt.generation import laws
from aogpt.generation.generate import generate, infill
from aogpt.generation.laws import reference_logits
from aogpt.generation.streams import SequenceStreams
from aogpt.model import Transformer
from aogpt.sampling import SamplingConfig, sample_tokens
from aogpt.schedules import count_schedule
from tests.helpers import reference_aogpt, reference_expected


def tiny_model(variant: str = "aogpt", vocab: int = 11, block: int = 12, n_embd: int = 16, n_layer: int = 2,
               scale: float = 0.5, seed: int = 0, dtype: torch.dtype = torch.float64) -> Transformer:
    """A random model whose conditionals are far from uniform (large weights) and order dependent."""
    torch.manual_seed(seed)
    extra = {"target_dim": 8} if variant == "aogpt" else {}
    model = Transformer(model_config(variant, n_layer=n_layer, n_head=2, n_embd=n_embd, block_size=block,
                                     vocab_size=vocab, **extra))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, scale)
    return model.to(dtype).eval()


def boundaries(known: int, counts: torch.Tensor) -> list[int]:
    """Context size for every chain position: known tokens, then the steps' cumulative counts."""
    ctx = [None] * known
    g = known
    for k in counts.tolist():
        ctx += [g] * k
        g += k
    return ctx


def check_against_reference(model: Transformer, res, atol: float) -> None:
    for b in range(res.tokens.shape[0]):
        chain = res.orders[b]
        y = res.tokens[b, chain]
        ctx = boundaries(int(res.known.sum()), res.step_counts[b])
        for i, g in enumerate(ctx):
            if g is None:
                assert torch.isnan(res.logits[b, i]).all()
        for g in sorted({g for g in ctx if g is not None}):
            targets = [i for i, c in enumerate(ctx) if c == g]
            # one forward per target (rows of a batch): context chain + the pending slot aimed at it
            rows = torch.stack([torch.cat([chain[:g], chain[i:i + 1]]) for i in targets])
            tokens = torch.cat([torch.tensor([-1]), y[:g]]).expand(len(targets), g + 1)
            pos = torch.cat([torch.tensor([0]), chain[:g] + 1]).expand(len(targets), g + 1)
            with torch.no_grad():
                ref = model.forward_slots(tokens, pos, rows)[:, -1]
            torch.testing.assert_close(res.logits[b, targets], ref, atol=atol, rtol=0)
            if b == 0 and g == ctx[-1]:  # the batched reference equals the single-target helper
                torch.testing.assert_close(ref[0], reference_logits(model, chain, y, g, targets[0]), atol=1e-12, rtol=0)


# ----------------------------------------------------------------------------- cache vs recompute
@pytest.mark.parametrize("variant", ["aogpt", "sigma", "gpt"])
def test_cache_matches_recompute_any_order_any_steps(variant):
    model = tiny_model(variant)
    n, N = 12, 4
    x = torch.randint(0, 11, (N, n), generator=torch.Generator().manual_seed(1))
    if variant == "gpt":
        settings = [dict(policy="count", steps=n, order="l2r"), dict(policy="count", steps=n, prompt=[3, 1, 4])]
    else:
        settings = [dict(policy="count", steps=n), dict(policy="count", steps=5), dict(policy="count", steps=1),
                    dict(policy="count", steps=7, schedule="cosine"), dict(policy="bernoulli", steps=4),
                    dict(policy="bernoulli", steps=12, order="l2r"), dict(policy="bernoulli", steps=3, prompt=[5, 6]),
                    dict(policy="count", steps=4, order=torch.randperm(n, generator=torch.Generator().manual_seed(3)))]
    for kw in settings:
        for use_cache in (True, False):
            prompt = kw.get("prompt")
            xs = x.clone()
            if prompt:
                xs[:, :len(prompt)] = torch.tensor(prompt)
            res = generate(model, num_samples=N, length=n, teacher_tokens=xs, record_logits=True, seed=2,
                           use_cache=use_cache, batch_size=3, **kw)
            assert torch.equal(res.tokens, xs)
            check_against_reference(model, res, atol=1e-10)


def test_cache_matches_recompute_with_infill_blanks():
    model = tiny_model("aogpt")
    template = [4, None, None, 7, None, 1, None, None, None, 2, None, None]
    x = torch.randint(0, 11, (5, 12), generator=torch.Generator().manual_seed(4))
    for p, t in enumerate(template):
        if t is not None:
            x[:, p] = t
    for kw in (dict(policy="bernoulli", steps=3), dict(policy="count", steps=2)):
        res = infill(model, template, num_samples=5, teacher_tokens=x, record_logits=True, seed=0, **kw)
        # known positions come first in every chain, ascending
        assert torch.equal(res.orders[:, :4], torch.tensor([0, 3, 5, 9]).expand(5, 4))
        check_against_reference(model, res, atol=1e-10)


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_reference_generator_fixture(dtype, atol):
    exp = reference_expected()
    assert count_schedule(32, 5) == exp["gen_step_sizes"].tolist()
    model = reference_aogpt(dtype)
    idx, orders = torch.from_numpy(exp["idx"]), torch.from_numpy(exp["orders"])
    res = generate(model, num_samples=2, length=32, steps=5, policy="count", order=orders, teacher_tokens=idx,
                   record_logits=True, seed=0)
    assert torch.equal(res.orders, orders)
    assert res.timing["forwards"] == 5
    want = torch.from_numpy(exp["gen_logits_f32" if dtype == torch.float32 else "gen_logits_f64"])
    torch.testing.assert_close(res.logits, want, atol=atol, rtol=0)


# ----------------------------------------------------------------------------- exact sampling
def exact_joint(model: Transformer, n: int, V: int, plans: list[tuple[float, list[int]]]) -> np.ndarray:
    """p(x) for every x in V^n: mean over all n! orders, sum over step plans, of the product of the
    conditionals each step samples from (the enumeration `aogpt bench gpu` checks a device's sampler with)."""
    return laws.exact_joint(model, plans, n=n, V=V)


def chi2_pvalue(tokens: torch.Tensor, V: int, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Pearson's chi-square of the sample's joint counts against `probs`, cells expected fewer than
    `min_expected` times pooled, a draw of probability 0 failing outright (`aogpt.generation.laws`)."""
    return laws.chi2_pvalue(tokens, probs, V=V, min_expected=min_expected)


def tiny_model_in(dtype: torch.dtype, variant: str, **kw) -> Transformer:
    """`tiny_model` with its weights in `dtype`: bfloat16 is the precision `dtype auto` generates in on
    hardware with bf16 units; the exact law is then that of the bf16 model's logits."""
    return tiny_model(variant, dtype=torch.float64, **kw).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_exact_sampling_one_token_per_step_matches_joint(dtype):
    V, n, N = 3, 3, 24000
    model = tiny_model_in(dtype, "aogpt", vocab=V, block=n, scale=0.8, seed=5)
    res = generate(model, num_samples=N, length=n, steps=n, policy="count", seed=11, batch_size=N)
    exact = exact_joint(model, n, V, [(1.0, [1, 1, 1])])
    assert abs(exact.sum() - 1) < 1e-12
    assert chi2_pvalue(res.tokens, V, exact) > 1e-3
    # the test has power: a single-order (left-to-right) joint is firmly rejected
    l2r = np.zeros(V ** n)
    for xi, x in enumerate(itertools.product(range(V), repeat=n)):
        _, losses = model(torch.tensor([x]))
        l2r[xi] = math.exp(-losses.double().sum().item())
    assert chi2_pvalue(res.tokens, V, l2r) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_exact_sampling_parallel_bernoulli_steps(dtype):
    """Two Bernoulli steps over 3 positions: per-sequence counts differ (padded batches), queries of a
    step see only the earlier context. Exact law: orders x Binomial(3, 1/2) plans."""
    V, n, N = 3, 3, 24000
    model = tiny_model_in(dtype, "sigma", vocab=V, block=n, scale=0.8, seed=6)
    res = generate(model, num_samples=N, length=n, steps=2, policy="bernoulli", seed=12, batch_size=N)
    plans = [(math.comb(3, k) / 8, [k, 3 - k]) for k in range(4)]
    exact = exact_joint(model, n, V, plans)
    assert chi2_pvalue(res.tokens, V, exact) > 1e-3
    one_per_step = exact_joint(model, n, V, [(1.0, [1, 1, 1])])
    assert chi2_pvalue(res.tokens, V, one_per_step) < 1e-6


# ----------------------------------------------------------------------------- Lemma 4.1
@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_bernoulli_counts_follow_lemma_4_1(schedule):
    from aogpt.schedules import time_grid

    n, T, N = 16, 4, 3000
    model = tiny_model("aogpt", vocab=5, block=n, n_embd=8, n_layer=1, dtype=torch.float32)
    res = generate(model, num_samples=N, length=n, steps=T, policy="bernoulli", schedule=schedule, seed=3,
                   batch_size=N)
    counts = res.step_counts.numpy()
    assert (counts.sum(1) == n).all()
    grid = time_grid(T, schedule)
    masked = n - np.concatenate([np.zeros((N, 1), int), counts.cumsum(1)[:, :-1]], axis=1)
    for i in range(T - 1):  # the last step reveals everything left (s = 0)
        p = (grid[i] - grid[i + 1]) / grid[i]
        ks = np.arange(n + 1)
        expected = stats.binom.pmf(ks[None], masked[:, i:i + 1], p).sum(0)
        observed = np.bincount(counts[:, i], minlength=n + 1)
        keep = expected >= 5  # cells with expected count < 5 pooled into one
        obs, exp = observed[keep], expected[keep]
        if expected[~keep].sum() > 0:
            obs, exp = np.append(obs, observed[~keep].sum()), np.append(exp, expected[~keep].sum())
        assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3
    assert (counts[:, -1] == masked[:, -1]).all()


# ----------------------------------------------------------------------------- conditioning
class ToyTokenizer:
    """Characters 'a'..'j' as ids 0..9 (the model pads its vocabulary to 16)."""

    vocab_size = 10

    def encode(self, text):
        return [ord(c) - ord("a") for c in text]

    def decode(self, ids):
        return "".join(chr(ord("a") + int(i)) for i in ids if 0 <= int(i) < 10)


def test_infill_never_alters_given_tokens_and_never_samples_padding():
    model = tiny_model("aogpt", vocab=16, block=24, scale=1.0)
    tok = ToyTokenizer()
    res = infill(model, "abc[MASK:3]dd[MASK]j", tokenizer=tok, length=14, num_samples=64, steps=4, seed=0,
                 temperature=2.0)
    for text in res.texts:
        assert text.startswith("abc") and text[6:8] == "dd" and text[9] == "j" and len(text) == 14
    assert res.tokens.max() < 10  # ids 10..15 are vocabulary padding
    assert res.step_counts.sum(1).eq(14 - 6).all()
    mapping = {0: 3, 5: 9, 11: 2}
    res = infill(model, mapping, length=12, num_samples=32, policy="count", steps=9, order="l2r", seed=1)
    for p, t in mapping.items():
        assert (res.tokens[:, p] == t).all()
    assert res.settings["known_tokens"] == 3


def naive_ar(model: Transformer, prompt: list[int], n: int, N: int, seed: int, cfg: SamplingConfig) -> torch.Tensor:
    """Plain left-to-right sampling: a full forward over everything so far, every step."""
    streams = SequenceStreams(seed, 0, N)  # sequence b's tokens from its own stream, in order
    x = torch.tensor(prompt, dtype=torch.long).expand(N, len(prompt))
    for i in range(len(prompt), n):
        tokens = torch.cat([torch.full((N, 1), -1), x], 1)
        pos = torch.arange(i + 1).expand(N, i + 1)
        tgt = torch.arange(i + 1).expand(N, i + 1)
        with torch.no_grad():
            logits = model.forward_slots(tokens, pos, tgt)[:, -1]
        u = streams.token_uniforms(np.arange(N), cfg.dtype, "cpu")
        x = torch.cat([x, sample_tokens(logits, cfg, uniforms=u)[:, None]], 1)
    return x


@pytest.mark.parametrize("variant", ["gpt", "aogpt"])
def test_left_to_right_with_n_steps_equals_ar_decode(variant):
    model = tiny_model(variant, vocab=11, block=12)
    cfg = SamplingConfig(temperature=0.9, top_p=0.8, top_k=7).validate()
    for prompt in ([], [2, 7, 1]):
        want = naive_ar(model, prompt, 12, 6, seed=21, cfg=cfg)
        got = generate(model, num_samples=6, length=12, prompt=prompt or None, order="l2r", policy="count",
                       steps=12 - len(prompt), seed=21, temperature=0.9, top_p=0.8, top_k=7).tokens
        assert torch.equal(got, want)


def test_seeds_reproduce_and_differ():
    model = tiny_model("aogpt")
    a = generate(model, num_samples=4, length=12, seed=5)
    b = generate(model, num_samples=4, length=12, seed=5)
    c = generate(model, num_samples=4, length=12, seed=6)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.orders, b.orders)
    assert not torch.equal(a.tokens, c.tokens)
    assert a.settings["seed"] == 5 and a.timing["forwards"] <= 12


def test_work_is_linear_one_slot_per_step():
    model = tiny_model("aogpt", block=12)
    res = generate(model, num_samples=3, length=12, steps=12, policy="count", seed=0)
    assert res.timing["forwards"] == 12 and res.timing["slot_evaluations"] == 3 * 12
    res = generate(model, num_samples=3, length=12, steps=4, policy="count", seed=0)
    assert res.timing["slot_evaluations"] == 3 * (12 + 12 - 3 - 3)  # queries + catch-ups (last step's never)
    # Bernoulli steps: per sequence, its queries, the prompt once, then k - 1 catch-ups after each
    # step that revealed k > 0 (except the last such step); padding rows are counted apart
    res = generate(model, num_samples=5, length=12, prompt=[1, 2], steps=5, policy="bernoulli", seed=0)
    want = 0
    for counts in res.step_counts.tolist():
        active = [k for k in counts if k > 0]
        want += 10 + 2 + sum(k - 1 for k in active[:-1])
    assert res.timing["slot_evaluations"] == want


# ----------------------------------------------------------------------------- refusals
def test_gpt_refuses_parallel_or_any_order():
    model = tiny_model("gpt")
    for kw in (dict(steps=4), dict(order="random"), dict(policy="bernoulli"),
               dict(order=torch.randperm(12, generator=torch.Generator().manual_seed(0)))):
        with pytest.raises(AOGPTError):
            generate(model, num_samples=1, length=12, **kw)
    with pytest.raises(AOGPTError, match="prefix"):
        infill(model, [1, None, 2], num_samples=1)


@pytest.mark.parametrize("kw,match", [
    (dict(steps=0), "steps"), (dict(steps=13), "steps"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(temperature=0.0), "temperature"), (dict(temperature=-1.0), "temperature"), (dict(length=13), "context"),
    (dict(prompt=[1] * 12), "prompt"), (dict(policy="greedy"), "policy"), (dict(order="r2l"), "order"),
    (dict(order=[0, 0, 1]), "shape"), (dict(prompt=[99]), "vocabulary"), (dict(schedule="exp"), "schedule"),
    (dict(batch_size=0), "batch_size"), (dict(num_samples=0), "num_samples"), (dict(top_k=-1), "top_k"),
    (dict(order=[0, 0] + list(range(2, 12))), "permutation"),
])
def test_bad_generation_input(kw, match):
    model = tiny_model("aogpt")
    args = dict(num_samples=1, length=12) | kw
    with pytest.raises(AOGPTError, match=match):
        generate(model, **args)


def test_bad_templates_and_variants():
    model = tiny_model("aogpt", vocab=16)
    tok = ToyTokenizer()
    for template, match in (("abc", "no blank"), ("a[MASK:30]", "context"), ("a[MASK:x]", "bad blank"),
                            ([1, 2, 3], "no blank")):
        with pytest.raises(AOGPTError, match=match):
            infill(model, template, tokenizer=tok)
    with pytest.raises(AOGPTError, match="tokenizer"):
        infill(model, "a[MASK]")
    with pytest.raises(AOGPTError, match="length"):
        infill(model, {0: 1})
    with pytest.raises(AOGPTError, match="Transformer"):
        generate(torch.nn.Linear(2, 2), num_samples=1)


# ----------------------------------------------------------------------------- execution paths
@pytest.mark.parametrize("policy", ["bernoulli", "count"])
def test_prepacked_and_flex_steps_give_the_same_tokens(policy):
    """The ways of running a decode step (oneDNN pre-packed weights on the CPU, FlexAttention) sample
    what the reference path (SDPA, plain weights) samples."""
    model = tiny_model("aogpt", vocab=32, block=12, dtype=torch.float32)
    kw = dict(num_samples=5, length=12, steps=5, policy=policy, seed=11, batch_size=5, record_logits=True)
    ref = generate(model, prepack=False, attention="sdpa", **kw)
    for variant in (dict(prepack=True), dict(prepack=False, attention="flex")):
        got = generate(model, **variant, **kw)
        assert torch.equal(got.tokens, ref.tokens), variant
        torch.testing.assert_close(got.logits, ref.logits, atol=2e-5, rtol=0, equal_nan=True)


def test_compiled_steps_give_the_same_tokens():
    """A torch.compile'd decode step (the graph captured by dynamo and run by its "eager" backend,
    which generates no code, so the test stays fast) samples what the eager step samples."""
    model = tiny_model("aogpt", vocab=32, block=6, dtype=torch.float32)
    kw = dict(num_samples=3, length=6, steps=3, policy="bernoulli", seed=4, batch_size=3, prepack=False)
    assert torch.equal(generate(model, compile="eager", **kw).tokens, generate(model, **kw).tokens)
    # uniform steps compiled with fixed shapes (columns as tensors, masks over the whole cache)
    kw.update(policy="count", length=3, steps=3, num_samples=2, batch_size=2, record_logits=True)
    got, ref = generate(model, compile="eager", **kw), generate(model, **kw)
    assert torch.equal(got.tokens, ref.tokens)
    torch.testing.assert_close(got.logits, ref.logits, atol=1e-5, rtol=0, equal_nan=True)


def test_packed_steps_do_only_the_real_work():
    """Lemma 4.1's ragged steps: every real slot is evaluated once, padding exists only in attention:
    per sequence n queries plus one catch-up for every token revealed after the first of its step,
    except in the last step (nothing follows it)."""
    model = tiny_model("aogpt", vocab=11, block=12)
    res = generate(model, num_samples=6, length=12, steps=12, policy="bernoulli", seed=2, batch_size=6)
    counts = res.step_counts
    revealing = (counts > 0).sum(1)
    last = counts.gather(1, (torch.arange(12) * (counts > 0)).argmax(1, keepdim=True))[:, 0]
    assert res.timing["slot_evaluations"] == int((12 + (12 - revealing) - (last - 1)).sum())
    count = generate(model, num_samples=6, length=12, steps=12, policy="count", seed=2, batch_size=6)
    assert count.timing["slot_evaluations"] == 6 * 12 and count.timing["padded_slots"] == 0


def test_bfloat16_generation_runs_with_every_policy():
    """The GPU setting of the paper's speed study (bf16 weights) has its code path tested on the CPU."""
    model = tiny_model("aogpt", vocab=32, block=12, dtype=torch.float32).to(torch.bfloat16)
    for kw in (dict(policy="bernoulli", steps=4), dict(policy="count"), dict(speculative=3)):
        res = generate(model, num_samples=3, length=12, seed=1, **kw)
        assert res.tokens.shape == (3, 12) and int(res.tokens.max()) < 32
