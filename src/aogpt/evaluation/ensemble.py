"""Context-order ensembling (paper Eq. 4): average a conditional over orderings of its context.

For step i of order sigma, average the model's *probabilities* over M orderings of the context set
sigma_<i (member 0 = the base order; the others uniform random permutations of sigma_<i, each token
keeping its original position), NLL = -log p_ens. Member j at step i is one causal pass over slots
[start, x_perm(sigma_<i)] read at slot i; rows for many steps are batched, each truncated to the
longest step in its chunk, with only slot i sent through the head. Steps 0 and 1 have at most one
context token, so every member equals the base order there and is not recomputed.

Ensembling a subset of positions (``positions=s``): per sequence, s steps S are drawn uniformly
without replacement from {2, ..., n-1} (the steps where members can differ) and the sequence NLL is
estimated by  sum_i base_i + (n-2)/s * sum_{i in S} (ens_i - base_i),  an unbiased estimate of the
full ensemble NLL (given the members) that uses the exact base-order NLL as a control variate.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from aogpt.errors import AOGPTError
from aogpt.families import family_of
from aogpt.functional import token_nll


def _chunks(steps: np.ndarray, budget: int) -> Iterator[tuple[int, int]]:
    """Split rows sorted by step into [start, end) chunks with rows * (max step + 1) <= budget."""
    start, total = 0, len(steps)
    while start < total:
        count = np.arange(1, total - start + 1) * (steps[start:] + 1)
        over = np.nonzero(count > budget)[0]
        end = start + max(1, int(over[0]) if len(over) else total - start)
        yield start, end
        start = end


def _check_member_orders(member_orders: torch.Tensor, order: torch.Tensor) -> None:
    B, n = order.shape
    if member_orders.dim() != 4 or member_orders.shape[0] != B or member_orders.shape[1] != n \
            or member_orders.shape[3] != n:
        raise AOGPTError(f"member orders must have shape (B, n, M-1, n) = ({B}, {n}, M-1, {n}), "
                         f"got {tuple(member_orders.shape)}", "pass one order per step and member")
    mo = member_orders.to(order.device)
    base = order[:, None, None, :].expand_as(mo)
    i = torch.arange(n, device=order.device)[None, :, None, None]
    t = torch.arange(n, device=order.device)[None, None, None, :]
    # context t < i: the same set as the base order's (compare sorted), from t >= i: unchanged
    ctx_key = torch.where(t < i, mo, n)
    same_set = torch.equal(ctx_key.sort(-1).values, torch.where(t < i, base, n).sort(-1).values)
    if not same_set or not torch.equal(torch.where(t >= i, mo, 0), torch.where(t >= i, base, 0)):
        raise AOGPTError("a member order is not a permutation of its step's context set",
                         "member j at step i must permute only the first i entries of the base order")


@torch.inference_mode()
def ensemble_losses(model: nn.Module, idx: torch.Tensor, order: torch.Tensor, members: int, *,
                    member_orders: torch.Tensor | None = None, generator: torch.Generator | None = None,
                    steps: torch.Tensor | None = None, token_budget: int | None = None) -> torch.Tensor:
    """Per-member losses (B, n, M) of the context-order ensemble; member 0 is the base `order`.

    member_orders: optional (B, n, M-1, n); [b, i, j-1] is member j's full order at step i (only its
    first i entries may differ from `order`). Otherwise members are uniform random permutations of
    the context drawn from `generator` (CPU). steps: optional (B, s) steps to compute members for;
    the other entries of members >= 1 are NaN (see `ensemble_sequence_nll`).
    """
    fam = family_of(model)
    if not fam.ensemble:
        raise AOGPTError(f"variant {fam.name} does not support context-order ensembling", "use --ensemble 1")
    if members < 1:
        raise AOGPTError(f"the ensemble size must be at least 1, got {members}", "pass --ensemble M >= 1")
    B, n = idx.shape
    device = idx.device
    order = order.to(device)
    base = fam.order_nll(model, idx, order).double()
    out = base[:, :, None].repeat(1, 1, members)
    if members == 1 or n < 3:
        return out
    if member_orders is not None:
        if member_orders.shape[2] != members - 1:
            raise AOGPTError(f"{member_orders.shape[2]} member orders given for an ensemble of {members}",
                             "pass M-1 orders per step")
        _check_member_orders(member_orders, order)
    if steps is not None:
        out[:, 2:, 1:] = float("nan")
    budget = token_budget or (1 << 17 if device.type == "cuda" else 1 << 14)
    for b in range(B):
        step_list = torch.arange(2, n) if steps is None else steps[b].cpu().unique()
        step_list = step_list[step_list >= 2]
        if len(step_list) == 0:
            continue
        row_step = step_list.repeat_interleave(members - 1)  # sorted by step
        row_member = torch.arange(1, members).repeat(len(step_list))
        for start, end in _chunks(row_step.numpy(), budget):
            s, j = row_step[start:end], row_member[start:end]
            L = int(s[-1]) + 1
            if member_orders is not None:
                member = member_orders[b, s, j - 1, :L].to(device)
            else:
                t = torch.arange(L)
                keys = torch.rand(len(s), L, generator=generator)
                keys = torch.where(t[None, :] < s[:, None], keys, 2.0 + t[None, :].double())
                member = order[b, :L].cpu()[keys.argsort(dim=1)].to(device)
            tokens, pos, target = model.slots_for_order(idx[b:b + 1].expand(len(s), n), member)
            sel = s.to(device)[:, None]
            logits = model.forward_slots(tokens[:, :L], pos[:, :L], target[:, :L], select=sel)[:, 0]
            goal = idx[b, order[b, s.to(device)]]
            out[b, s.to(device), j.to(device)] = token_nll(logits, goal).double()
    return out


def ensemble_nll(losses: torch.Tensor) -> torch.Tensor:
    """-log of the mean member probability, per step: (B, n, M) -> (B, n)."""
    M = losses.shape[-1]
    return -(torch.logsumexp(-losses, dim=-1) - math.log(M))


def ensemble_sequence_nll(losses: torch.Tensor, steps: torch.Tensor | None = None) -> torch.Tensor:
    """Per-sequence ensemble NLL (B,): exact over all steps, or the subset estimator (module doc)."""
    ens = ensemble_nll(losses)
    if steps is None:
        return ens.sum(1)
    base = losses[..., 0]
    n = losses.shape[1]
    steps = steps.to(losses.device)
    diff = (ens - base).gather(1, steps)
    return base.sum(1) + (n - 2) / steps.shape[1] * diff.sum(1)


def draw_steps(batch: int, n: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """`count` distinct steps per sequence, uniform from {2, ..., n-1}, sorted (B, count)."""
    pool = n - 2
    if count < 1 or count > pool:
        raise AOGPTError(f"cannot ensemble {count} positions of {pool} eligible (n = {n})",
                         f"pass --ensemble-positions between 1 and {pool}")
    return (torch.rand(batch, pool, generator=generator).argsort(1)[:, :count] + 2).sort(1).values
