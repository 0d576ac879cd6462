"""Chain log-probabilities against independent computations: one forward per conditional."""

from __future__ import annotations

import torch

from aogpt.generation.likelihood import chain_logprobs
from aogpt.hf.scoring import score_continuations
from tests.helpers import prefix_conditional, random_model


def test_every_step_is_its_own_conditional_along_any_chain() -> None:
    model = random_model("aogpt", n=8, vocab=11, seed=3)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 11, (3, 8), generator=gen)
    chains = torch.stack([torch.arange(8), torch.randperm(8, generator=gen), torch.tensor([2, 5, 0, 1, 3, 4, 6, 7])])
    got = chain_logprobs(model, tokens, chains, top=3)
    for b in range(3):
        for i in range(8):
            want = -prefix_conditional(model, tokens[b:b + 1], chains[b].tolist(), i)
            assert abs(float(got.logprobs[b, i]) - want) < 1e-9
    assert got.top_ids.shape == (3, 8, 3)
    assert torch.equal(got.top_logprobs[..., 0], got.top_logprobs.max(-1).values)
    greedy = got.top_ids[..., 0] == tokens.gather(1, chains)
    assert torch.equal(got.logprobs[greedy], got.top_logprobs[..., 0][greedy])  # bit for bit where greedy


def test_left_to_right_is_the_harness_number() -> None:
    model = random_model("gpt", n=8, vocab=11, seed=1)
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    got = chain_logprobs(model, torch.tensor([ids]), torch.arange(8)[None]).logprobs[0]
    want = score_continuations(model, [(ids[:3], ids[3:])])[0].logprob
    assert abs(float(got[3:].sum()) - want) < 1e-9
