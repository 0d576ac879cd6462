"""Exact log-probabilities of the tokens of filled sequences, each read along a chain order.

A decoder reads a sequence in an order and one causal pass gives every conditional of that order
(`aogpt.model`): the slot of chain step i holds the token read at step i - 1 (the start slot for
i = 0) and targets position ``chain[i]``, so its logits are p(x[chain[i]] | x[chain[:i]]). This
module makes that pass through ``model.forward_slots`` alone (no KV cache, causal attention), so
it runs on anything with that method: a `Transformer`, or the serving engine's stand-in for one
(`aogpt.serve.engine.SharedModel`), whose forward is batched with the other requests' steps.

Two readings are used:

- *left to right* (``chain = 0, 1, ..., n-1``): the exact log p(x_i | x_<i) of every token, what
  ``aogpt harness`` and lm-evaluation-harness score (`aogpt.hf.scoring`);
- *the order a sample was drawn in* (`GenerationResult.orders`: the given positions first, left to
  right, then the generated ones in the order they were revealed): every generated token's
  log-probability given the given tokens and the tokens revealed before it. For decoding one token
  per step this is the distribution the token was drawn from (before temperature, top-p, top-k); the
  sum over a sample is its exact log-likelihood under that order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ChainScores:
    """Per chain step (B, n): `logprobs` of the token read there (float64); with ``top`` > 0, the
    `top` most likely tokens of that step, `top_ids` (B, n, top) and their `top_logprobs` (float64),
    from the same log-softmax as `logprobs` (a greedy token's value equals its top-1 value exactly)."""

    logprobs: torch.Tensor
    top_ids: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None


def chain_slots(tokens: torch.Tensor, chain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The decoder's (tokens, pos, target) slots (B, n) for reading `tokens` (B, n) along `chain`
    (the layout of `Transformer.slots_for_order`, without the target-less last slot)."""
    read = tokens.gather(1, chain)
    start = torch.full_like(read[:, :1], -1)
    slot_tokens = torch.cat([start, read[:, :-1]], dim=1)
    pos = torch.cat([torch.zeros_like(chain[:, :1]), chain[:, :-1] + 1], dim=1)
    return slot_tokens, pos, chain


@torch.inference_mode()
def chain_logprobs(model: torch.nn.Module, tokens: torch.Tensor, chain: torch.Tensor, top: int = 0) -> ChainScores:
    """log p(x[chain[i]] | x[chain[:i]]) for every row of `tokens` (B, n) and chain step i, in one
    causal pass of ``model.forward_slots`` (a decoder: the caller checks the family). `top`: also the
    `top` most likely tokens of every step."""
    device = next(model.parameters()).device
    tokens = torch.as_tensor(tokens, dtype=torch.long).to(device)
    chain = torch.as_tensor(chain, dtype=torch.long).to(device).expand_as(tokens)
    logits = model.forward_slots(*chain_slots(tokens, chain))
    logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    read = tokens.gather(1, chain)
    out = logp.gather(-1, read.unsqueeze(-1))[..., 0].double().cpu()
    if top <= 0:
        return ChainScores(out)
    values, ids = logp.topk(min(top, logp.shape[-1]), dim=-1)
    return ChainScores(out, ids.cpu(), values.double().cpu())


__all__ = ["ChainScores", "chain_logprobs", "chain_slots"]
