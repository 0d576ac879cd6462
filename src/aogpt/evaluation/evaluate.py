"""Likelihood evaluation: exact per-order NLL, the any-order (masked-diffusion) bound with error bars,
and context-order ensembling (paper Eq. 4).

* Any single order sigma gives the exact NLL of a sequence by the chain rule: one causal forward
  (`Transformer.forward`) yields all n conditionals. ``l2r`` is the AR likelihood.
* The any-order bound E_sigma[-log p_sigma(x)] (the masked-diffusion ELBO, docs/design.md) is
  estimated by K independent draws: draw k gives every sequence its own uniform order; its
  dataset-level mean NLL/token is m_k. We report mean(m_k), the standard error sd(m_k)/sqrt(K)
  (Monte-Carlo error of the bound *on this data*, not sampling error of the data) and a 95% Student-t
  interval. Fixed seeds make it reproducible.
* Context-order ensembling (paper Eq. 4) and its subset-of-positions estimator: `aogpt.evaluation.ensemble`.
* Bits per byte (`aogpt.measures`): given the bytes behind each token id (``byte_lengths``, from
  `aogpt.data.Tokenizer.byte_lengths`), the result also holds the UTF-8 bytes of the scored tokens
  and the NLL in bits per byte, which compares across tokenizers.
* Explicit orders (a permutation for every sequence, or one per sequence) are scored exactly, and
  ``per_sequence=True`` keeps every sequence's NLL and the orders drawn (`EvalResult`).
* `conditional_logprobs`: log p(x_t | a context read in a given order) for any targets t.

`aogpt.evaluate` and `aogpt.conditional_logprobs` are the functions of the same name here.

How a model is scored (the exact NLL under an order, the any-order bound, whether ensembles are
defined) comes from its family (`aogpt.families`): decoders score an order in one causal pass, the
encoder-only MDM in n passes, with its own one-forward Monte-Carlo bound.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import scipy.stats
import torch
from torch import nn

from aogpt.errors import AOGPTError
from aogpt.evaluation.ensemble import draw_steps, ensemble_losses, ensemble_sequence_nll
from aogpt.families import ModelFamily, family_of, unwrap
from aogpt.measures import bits_per_byte
from aogpt.orders import OrderSampler, check_permutation, is_left_to_right, make_order_sampler
from aogpt.seeds import draw_seed


# ---------------------------------------------------------------------------------------- statistics
@dataclass
class EvalResult:
    """Mean NLL per token (nats) and what goes with it; `order_means` are the K draws' means.

    With ``per_sequence=True``: `sequence_nlls` (K lists of one NLL per sequence, nats) and `orders`
    (K lists of each sequence's order; None where the family's bound draws masks, not orders)."""

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
    sequence_nlls: list[list[float]] | None = None
    orders: list[list[list[int]] | None] | None = None
    bytes: int | None = None  # UTF-8 bytes of the scored tokens, when their byte lengths were given
    bpb: float | None = None  # the NLL in bits per byte
    bpb_ci95: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def add_bytes(self, num_bytes: int) -> None:
        """Record the scored text's bytes and express the NLL (and its interval) in bits per byte."""
        self.bytes = int(num_bytes)
        self.bpb = bits_per_byte(self.nll, self.tokens, self.bytes)
        if self.ci95 is not None:
            lo, hi = self.ci95
            self.bpb_ci95 = (bits_per_byte(lo, self.tokens, self.bytes), bits_per_byte(hi, self.tokens, self.bytes))


def summarize(sums: np.ndarray, tokens: int, sequences: int, order: str, ensemble: int = 1,
              positions: int | None = None, seconds: float = 0.0) -> EvalResult:
    """Turn per-draw NLL sums into mean, standard error across draws and a 95% t interval."""
    means = sums / max(tokens, 1)
    nll = float(means.mean())
    se = ci = ppl_ci = None
    if len(means) > 1:
        se = float(means.std(ddof=1) / math.sqrt(len(means)))
        half = float(scipy.stats.t.ppf(0.975, len(means) - 1)) * se
        ci = (nll - half, nll + half)
        ppl_ci = (math.exp(ci[0]), math.exp(ci[1]))
    return EvalResult(nll=nll, ppl=math.exp(nll), tokens=tokens, sequences=sequences, order=order,
                      num_orders=len(means), ensemble=ensemble, ensemble_positions=positions,
                      order_means=[float(m) for m in means], se=se, ci95=ci, ppl_ci95=ppl_ci, seconds=seconds)


# ---------------------------------------------------------------------------------------- evaluation
OrderArg = str | OrderSampler | torch.Tensor | list


def resolve_order(order: OrderArg) -> OrderSampler | torch.Tensor:
    """An eval order: an `aogpt.orders` spec (``random``/``uniform``: the any-order bound; ``l2r``,
    ``mixture[:P]``, ``fixed-random[:SEED]``, ``blockwise[:K]``, ``mallows:THETA``, ``window:W``...), a
    sampler, or explicit orders (n,) / (N, n) (returned as a tensor; checked against the data's length
    when it is seen)."""
    if isinstance(order, (str, OrderSampler)):
        return make_order_sampler(order)
    try:
        return torch.as_tensor(order, dtype=torch.long).cpu()
    except (TypeError, ValueError, RuntimeError):
        raise AOGPTError(f"cannot read order {order!r}", "pass an order spec or a permutation of positions") from None


def _batches(data: torch.Tensor | Iterable[torch.Tensor], batch_size: int) -> Iterator[torch.Tensor]:
    if isinstance(data, torch.Tensor):
        if data.dim() != 2:
            raise AOGPTError(f"evaluation data must be (sequences, length), got shape {tuple(data.shape)}",
                             "pass a 2-D tensor of token ids")
        yield from data.split(batch_size)
    else:
        yield from data


def _explicit_rows(orders: torch.Tensor, start: int, B: int, n: int) -> torch.Tensor:
    """Rows start .. start + B - 1 of explicit orders (one for all, or one per sequence)."""
    orders = check_permutation(orders, n)
    if orders.dim() == 1:
        return orders.expand(B, n)
    if orders.shape[0] < start + B:
        raise AOGPTError(f"{orders.shape[0]} explicit orders given, but the data has more sequences",
                         "pass one order per sequence, or one order (n,) for all")
    return orders[start:start + B]


def sequence_nll(model: nn.Module, idx: torch.Tensor, order: OrderSampler | torch.Tensor,
                 generator: torch.Generator, ensemble: int = 1, positions: int | None = None,
                 member_generator: torch.Generator | None = None, token_budget: int | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-sequence NLL (B,) of one draw under `order` (uniform: the any-order bound; a tensor:
    these orders (B, n)), optionally ensembled; and the orders used (None: the family's bound drew
    masks, not orders)."""
    fam = family_of(model)
    B, n = idx.shape
    if isinstance(order, torch.Tensor):
        sigma = order.to(idx.device)
    elif order.spec == "uniform" and ensemble == 1:
        return fam.mc_bound(model, idx, generator)
    else:
        sigma = order.sample(B, n, "cpu", generator).to(idx.device)
    if ensemble == 1:
        return fam.order_nll(model, idx, None if is_left_to_right(order) else sigma).double().sum(1), sigma
    steps = draw_steps(B, n, positions, member_generator) if positions and positions < n - 2 else None
    losses = ensemble_losses(model, idx, sigma, ensemble, generator=member_generator, steps=steps,
                             token_budget=token_budget)
    return ensemble_sequence_nll(losses, steps), sigma


def check_request(model: nn.Module, order: OrderArg, num_orders: int, ensemble: int,
                  positions: int | None = None) -> ModelFamily:
    """Refuse impossible requests with a user error before any work is done."""
    if num_orders < 1:
        raise AOGPTError(f"the number of orders must be at least 1, got {num_orders}", "pass --num-orders K >= 1")
    if ensemble < 1:
        raise AOGPTError(f"the ensemble size must be at least 1, got {ensemble}", "pass --ensemble M >= 1")
    fam = family_of(model)
    resolved = resolve_order(order)  # an unknown spec is refused here
    fam.check_order(order if isinstance(order, str) else resolved, " asked")
    if positions is not None and positions < 1:
        raise AOGPTError(f"--ensemble-positions must be at least 1, got {positions}", "pass a positive number")
    if ensemble > 1 and not fam.ensemble:
        raise AOGPTError(f"variant {fam.name} does not support context-order ensembling", "use --ensemble 1")
    return fam


def _check_batch(idx: torch.Tensor, config: Any) -> None:
    if idx.shape[1] > config.block_size:
        raise AOGPTError(f"sequences of {idx.shape[1]} tokens exceed the model's context of {config.block_size}",
                         f"use blocks of at most {config.block_size} tokens (--block-len)")
    if int(idx.min()) < 0 or int(idx.max()) >= config.vocab_size:
        raise AOGPTError(f"token ids outside the model's vocabulary of {config.vocab_size}",
                         "the data was made with another tokenizer: prepare it with the model's")


@torch.inference_mode()
def evaluate(model: nn.Module, data: torch.Tensor | Iterable[torch.Tensor], *, order: OrderArg = "l2r",
             num_orders: int = 1, ensemble: int = 1, ensemble_positions: int | None = None, batch_size: int = 8,
             max_batches: int | None = None, seed: int = 0, token_budget: int | None = None,
             progress: Any = None, per_sequence: bool = False,
             byte_lengths: torch.Tensor | np.ndarray | None = None) -> EvalResult:
    """Mean NLL per token of `data` ((N, n) token ids, or an iterable of (B, n) batches).

    order: see `resolve_order`; fixed and explicit orders are deterministic, so K collapses to 1.
    ensemble: M members per conditional (1 = none); ensemble_positions: ensemble only that many
    random steps per sequence (unbiased estimator, `aogpt.evaluation.ensemble`). progress: an object with
    ``update(n)`` (e.g. a tqdm bar), advanced by one per batch. per_sequence: keep every sequence's
    NLL and the orders drawn in the result. byte_lengths: the UTF-8 bytes behind each token id
    (`aogpt.data.Tokenizer.byte_lengths`); the result then also gives bits per byte.
    """
    model = unwrap(model)  # accept aogpt.load()'s Loaded
    check_request(model, order, num_orders, ensemble, ensemble_positions)
    sampler = resolve_order(order)
    explicit = isinstance(sampler, torch.Tensor)
    K = 1 if (explicit or sampler.is_fixed) and ensemble == 1 else num_orders
    if batch_size < 1:
        raise AOGPTError(f"the batch size must be at least 1, got {batch_size}", "pass --batch-size >= 1")
    device = next(model.parameters()).device
    gens = [torch.Generator().manual_seed(draw_seed(seed, "order", k)) for k in range(K)]
    mgens = [torch.Generator().manual_seed(draw_seed(seed, "members", k)) for k in range(K)]
    sums = np.zeros(K)
    per_seq: list[list[torch.Tensor]] = [[] for _ in range(K)]
    drawn: list[list[torch.Tensor | None]] = [[] for _ in range(K)]
    tokens = sequences = num_bytes = 0
    lengths = None if byte_lengths is None else torch.tensor(np.asarray(byte_lengths), dtype=torch.long)
    start = time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        for b, batch in enumerate(_batches(data, batch_size)):
            if max_batches is not None and b >= max_batches:
                break
            idx = batch.to(device=device, dtype=torch.long)
            _check_batch(idx, model.config)
            how = _explicit_rows(sampler, sequences, *idx.shape) if explicit else sampler
            for k in range(K):
                nll, used = sequence_nll(model, idx, how, gens[k], ensemble, ensemble_positions, mgens[k],
                                         token_budget)
                sums[k] += float(nll.sum())
                if per_sequence:
                    per_seq[k].append(nll.cpu())
                    drawn[k].append(None if used is None else used.cpu())
            tokens += idx.numel()
            sequences += idx.shape[0]
            if lengths is not None:
                num_bytes += int(lengths[batch.to(dtype=torch.long).cpu()].sum())
            if progress is not None:
                progress.update(1)
    finally:
        model.train(was_training)
    if tokens == 0:
        raise AOGPTError("no evaluation data", "give more text, a smaller --block-len or more --max-batches")
    label = "given" if explicit else order if isinstance(order, str) else sampler.spec
    res = summarize(sums, tokens, sequences, label, ensemble, ensemble_positions, time.perf_counter() - start)
    if per_sequence:
        res.sequence_nlls = [torch.cat(rows).tolist() for rows in per_seq]
        res.orders = [None if any(o is None for o in rows) else torch.cat(rows).tolist() for rows in drawn]
    if lengths is not None:
        res.add_bytes(num_bytes)
    return res


@torch.inference_mode()
def conditional_logprobs(model: nn.Module, tokens: torch.Tensor | list[int], context: torch.Tensor | list[int],
                         targets: torch.Tensor | list[int]) -> torch.Tensor:
    """log p(x_t = v | the context tokens, read in the given order) for every target t: (T, V) for one
    sequence or (B, T, V) for a batch, in at least float32.

    tokens: the sequence (n,) or (B, n) (only context positions are read); context: positions (m,) or
    (B, m), in the order the model reads them (any order for an any-order model, increasing for
    GPT); targets: positions (T,) or (B, T), each predicted from the same context (not from each
    other). For a decoder this is one forward: the context slots, causally, then one query per
    target (docs/design.md); for the encoder, one bidirectional pass with the rest masked.
    """
    core = unwrap(model)
    fam = family_of(core)
    device = next(core.parameters()).device
    idx = torch.as_tensor(tokens, dtype=torch.long, device=device)
    single = idx.dim() == 1
    ctx = torch.as_tensor(context, dtype=torch.long, device=device)
    tgt = torch.as_tensor(targets, dtype=torch.long, device=device)
    if single:
        idx, ctx, tgt = idx[None], ctx[None], tgt[None]
    n = idx.shape[1]
    _check_batch(idx, core.config)
    for what, pos in (("context", ctx), ("target", tgt)):
        if pos.numel() and (int(pos.min()) < 0 or int(pos.max()) >= n):
            raise AOGPTError(f"{what} positions must lie in 0..{n - 1}", "pass positions of the sequence")
    fam.check_order(ctx)  # left to right only, for a left-to-right model
    was_training = core.training
    core.eval()
    try:
        logits = fam.conditional_logits(core, idx, ctx, tgt)
    finally:
        core.train(was_training)
    out = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    return out[0] if single else out

