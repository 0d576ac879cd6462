"""Likelihood evaluation: exact per-order NLL, the any-order (masked-diffusion) bound with error bars,
and context-order ensembling (paper Eq. 4).

* Any single order sigma gives the exact NLL of a sequence by the chain rule: one causal forward
  (`Transformer.forward`) yields all n conditionals. ``l2r`` is the AR likelihood.
* The any-order bound E_sigma[-log p_sigma(x)] (the masked-diffusion ELBO, docs/design.md) is
  estimated by K independent draws: draw k gives every sequence its own uniform order; its
  dataset-level mean NLL/token is m_k. We report mean(m_k), the standard error sd(m_k)/sqrt(K)
  (Monte-Carlo error of the bound *on this data*, not sampling error of the data) and a 95% Student-t
  interval. Fixed seeds make it reproducible.
* Context-order ensembling: for step i of order sigma, average the model's *probabilities* over M
  orderings of the context set sigma_<i (member 0 = the base order; the others uniform random
  permutations of sigma_<i, each token keeping its original position), NLL = -log p_ens. Member j
  at step i is one causal pass over slots [start, x_perm(sigma_<i)] read at slot i; rows for many
  steps are batched, each truncated to the longest step in its chunk, with only slot i sent through
  the head. Steps 0 and 1 have at most one context token, so every member equals the base order
  there and is not recomputed.
* Ensembling a subset of positions (``positions=s``): per sequence, s steps S are drawn uniformly
  without replacement from {2, ..., n-1} (the steps where members can differ) and the sequence NLL
  is estimated by  sum_i base_i + (n-2)/s * sum_{i in S} (ens_i - base_i),  an unbiased estimate of
  the full ensemble NLL (given the members) that uses the exact base-order NLL as a control variate.

How a model is scored (the exact NLL under an order, the any-order bound, whether ensembles are
defined) comes from its family (`aogpt.families`): decoders score an order in one causal pass, the
encoder-only MDM in n passes, with its own one-forward Monte-Carlo bound.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from aogpt.errors import AOGPTError
from aogpt.families import ModelFamily, family_of, unwrap
from aogpt.orders import OrderSampler, is_left_to_right, make_order_sampler


# ---------------------------------------------------------------------------------------- ensembles
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
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
            goal = idx[b, order[b, s.to(device)]]
            out[b, s.to(device), j.to(device)] = F.cross_entropy(logits, goal, reduction="none").double()
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


# ---------------------------------------------------------------------------------------- statistics
def t_quantile(p: float, df: int) -> float:
    """Student-t quantile (bisection on a Simpson-integrated CDF; scipy is not a runtime dependency)."""
    if df < 1 or not 0.5 < p < 1:
        raise ValueError("need df >= 1 and 0.5 < p < 1")
    logc = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x: float) -> float:
        u = np.linspace(0.0, x, 4001)
        f = np.exp(logc - (df + 1) / 2 * np.log1p(u * u / df))
        h = x / 4000
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, hi * 2
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


@dataclass
class EvalResult:
    """Mean NLL per token (nats) and what goes with it; `order_means` are the K draws' means."""

    nll: float
    ppl: float
    tokens: int
    sequences: int
    order: str
    num_orders: int
    ensemble: int = 1
    ensemble_positions: int | None = None
    order_means: list[float] = field(default_factory=list)
    se: float | None = None
    ci95: tuple[float, float] | None = None
    ppl_ci95: tuple[float, float] | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(sums: np.ndarray, tokens: int, sequences: int, order: str, ensemble: int = 1,
              positions: int | None = None, seconds: float = 0.0) -> EvalResult:
    """Turn per-draw NLL sums into mean, standard error across draws and a 95% t interval."""
    means = sums / max(tokens, 1)
    nll = float(means.mean())
    se = ci = ppl_ci = None
    if len(means) > 1:
        se = float(means.std(ddof=1) / math.sqrt(len(means)))
        half = t_quantile(0.975, len(means) - 1) * se
        ci = (nll - half, nll + half)
        ppl_ci = (math.exp(ci[0]), math.exp(ci[1]))
    return EvalResult(nll=nll, ppl=math.exp(nll), tokens=tokens, sequences=sequences, order=order,
                      num_orders=len(means), ensemble=ensemble, ensemble_positions=positions,
                      order_means=[float(m) for m in means], se=se, ci95=ci, ppl_ci95=ppl_ci, seconds=seconds)


# ---------------------------------------------------------------------------------------- evaluation
def resolve_order(spec: str | OrderSampler) -> OrderSampler:
    """An eval order: an `aogpt.orders` spec (``random``/``uniform``: the any-order bound; ``l2r``,
    ``mixture[:P]``, ``fixed-random[:SEED]``, ``blockwise[:K]``...) or a sampler."""
    return make_order_sampler(spec)


def draw_seed(seed: int, *labels: Any) -> int:
    """A stable 63-bit seed for (seed, labels): independent streams per draw, whatever else runs."""
    digest = hashlib.blake2b(repr((seed, *labels)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _batches(data: torch.Tensor | Iterable[torch.Tensor], batch_size: int) -> Iterator[torch.Tensor]:
    if isinstance(data, torch.Tensor):
        if data.dim() != 2:
            raise AOGPTError(f"evaluation data must be (sequences, length), got shape {tuple(data.shape)}",
                             "pass a 2-D tensor of token ids")
        yield from data.split(batch_size)
    else:
        yield from data


def sequence_nll(model: nn.Module, idx: torch.Tensor, order: OrderSampler, generator: torch.Generator,
                 ensemble: int = 1, positions: int | None = None, member_generator: torch.Generator | None = None,
                 token_budget: int | None = None) -> torch.Tensor:
    """Per-sequence NLL (B,) of one draw under `order` (uniform: the any-order bound), optionally ensembled."""
    fam = family_of(model)
    B, n = idx.shape
    if order.spec == "uniform" and ensemble == 1:
        return fam.mc_bound(model, idx, generator).double()
    sigma = order.sample(B, n, "cpu", generator).to(idx.device)
    if ensemble == 1:
        return fam.order_nll(model, idx, None if is_left_to_right(order) else sigma).double().sum(1)
    steps = draw_steps(B, n, positions, member_generator) if positions and positions < n - 2 else None
    losses = ensemble_losses(model, idx, sigma, ensemble, generator=member_generator, steps=steps,
                             token_budget=token_budget)
    return ensemble_sequence_nll(losses, steps)


def check_request(model: nn.Module, order: str, num_orders: int, ensemble: int,
                  positions: int | None = None) -> ModelFamily:
    """Refuse impossible requests with a user error before any work is done."""
    if num_orders < 1:
        raise AOGPTError(f"the number of orders must be at least 1, got {num_orders}", "pass --num-orders K >= 1")
    if ensemble < 1:
        raise AOGPTError(f"the ensemble size must be at least 1, got {ensemble}", "pass --ensemble M >= 1")
    fam = family_of(model)
    resolve_order(order)  # an unknown spec is refused here
    fam.check_order(order, " asked")
    if positions is not None and positions < 1:
        raise AOGPTError(f"--ensemble-positions must be at least 1, got {positions}", "pass a positive number")
    if ensemble > 1 and not fam.ensemble:
        raise AOGPTError(f"variant {fam.name} does not support context-order ensembling", "use --ensemble 1")
    return fam


@torch.inference_mode()
def evaluate(model: nn.Module, data: torch.Tensor | Iterable[torch.Tensor], *, order: str = "l2r",
             num_orders: int = 1, ensemble: int = 1, ensemble_positions: int | None = None, batch_size: int = 8,
             max_batches: int | None = None, seed: int = 0, token_budget: int | None = None,
             progress: Any = None) -> EvalResult:
    """Mean NLL per token of `data` ((N, n) token ids, or an iterable of (B, n) batches).

    order: see `resolve_order`; fixed orders (l2r, ...) are deterministic, so K collapses to 1.
    ensemble: M members per conditional (1 = none); ensemble_positions: ensemble only that many
    random steps per sequence (unbiased estimator, module doc). progress: an object with
    ``update(n)`` (e.g. a tqdm bar), advanced by one per batch.
    """
    model = unwrap(model)  # accept aogpt.load()'s Loaded
    check_request(model, order, num_orders, ensemble, ensemble_positions)
    sampler = resolve_order(order)
    K = 1 if sampler.is_fixed and ensemble == 1 else num_orders
    if batch_size < 1:
        raise AOGPTError(f"the batch size must be at least 1, got {batch_size}", "pass --batch-size >= 1")
    device = next(model.parameters()).device
    block = model.config.block_size
    gens = [torch.Generator().manual_seed(draw_seed(seed, "order", k)) for k in range(K)]
    mgens = [torch.Generator().manual_seed(draw_seed(seed, "members", k)) for k in range(K)]
    sums = np.zeros(K)
    tokens = sequences = 0
    start = time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        for b, batch in enumerate(_batches(data, batch_size)):
            if max_batches is not None and b >= max_batches:
                break
            if batch.shape[1] > block:
                raise AOGPTError(f"sequences of {batch.shape[1]} tokens exceed the model's context of {block}",
                                 f"use blocks of at most {block} tokens (--block-len)")
            idx = batch.to(device=device, dtype=torch.long)
            if int(idx.min()) < 0 or int(idx.max()) >= model.config.vocab_size:
                raise AOGPTError(f"token ids outside the model's vocabulary of {model.config.vocab_size}",
                                 "the data was made with another tokenizer: prepare it with the model's")
            for k in range(K):
                sums[k] += float(sequence_nll(model, idx, sampler, gens[k], ensemble, ensemble_positions,
                                              mgens[k], token_budget).sum())
            tokens += idx.numel()
            sequences += idx.shape[0]
            if progress is not None:
                progress.update(1)
    finally:
        model.train(was_training)
    if tokens == 0:
        raise AOGPTError("no evaluation data", "give more text, a smaller --block-len or more --max-batches")
    return summarize(sums, tokens, sequences, order, ensemble, ensemble_positions, time.perf_counter() - start)
