"""Log-likelihoods of continuations and of whole documents, as evaluation harnesses ask for them.

Pure PyTorch (no harness import): `aogpt.hf.harness` turns the harness's requests into token ids and
calls these.

* `score_continuations`: log p(continuation | context) for (context ids, continuation ids) pairs.
  Left to right (``order="l2r"``) it is exact: one causal pass over context + continuation, the
  continuation's conditionals summed. With ``order="random"`` it is the any-order bound: the context
  is read first (left to right), then the continuation's positions in a uniformly random order;
  each of K draws is an exact log-likelihood under its order, their mean estimates
  E_sigma[log p_sigma(continuation | context)] <= log p(continuation | context) (the masked-diffusion
  bound), with the standard error sd/sqrt(K). Draw k of a pair is seeded by (seed, its tokens, k),
  so a score does not depend on the batch it is computed in. ``is_greedy`` is always the left-to-right
  check: would greedy left-to-right decoding produce the continuation?
* An empty context is the start of a text: the model's start slot predicts the first token (our
  decoders need no start-of-text token). A context that does not fit the model's window is cut on the
  left; a continuation longer than the window is refused.
* `rolling_windows` / `score_documents`: the log-likelihood of whole documents in windows of the
  model's context, as `lm_eval`'s ``loglikelihood_rolling`` expects: the first window scores the
  first `block_size` tokens from the start slot; every later window is a full window of
  `block_size` tokens whose last tokens (at most block_size - 1, at least one token of context)
  are scored. Every token is scored exactly once, with as much context as the window allows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from aogpt.errors import AOGPTError
from aogpt.families import family_of, unwrap
from aogpt.orders import is_left_to_right, make_order_sampler
from aogpt.seeds import draw_seed

Pair = tuple[Sequence[int], Sequence[int]]


@dataclass
class Score:
    """The log-likelihood of one continuation (or document), nats.

    logprob: exact (left to right) or the mean of the K draws (the any-order bound). draws: each
    draw's log-likelihood (one value left to right). exact: left to right. orders: per draw, the
    order in which a continuation's tokens were read (0 = its first token); None when exact and for
    documents (their draws are sums over windows). context_dropped: context tokens cut off on the
    left to fit the window."""

    logprob: float
    is_greedy: bool
    tokens: int
    draws: list[float]
    exact: bool
    orders: list[list[int]] | None = None
    context_dropped: int = 0

    @property
    def se(self) -> float | None:
        """Monte-Carlo standard error of `logprob` (sd of the draws / sqrt(K)); None when exact."""
        k = len(self.draws)
        if self.exact or k < 2:
            return None
        mean = sum(self.draws) / k
        return math.sqrt(sum((d - mean) ** 2 for d in self.draws) / (k - 1) / k)


def reading_mode(model: torch.nn.Module, order: str) -> bool:
    """Check that `model` can be scored in `order` here; True for the any-order bound."""
    fam = family_of(unwrap(model))
    if not (fam.causal and fam.one_pass_nll):
        raise AOGPTError(f"variant {fam.name} has no one-pass likelihood (it is not a causal decoder)",
                         "use a gpt, sigma or aogpt model, or aogpt eval for this one")
    sampler = make_order_sampler(order)  # an unknown spec is refused here
    if is_left_to_right(sampler):
        return False
    if sampler.spec != "uniform":
        raise AOGPTError(f"order {order!r} is not supported here",
                         "use l2r (exact) or random (the any-order bound over uniform orders)")
    fam.check_order(sampler)
    return True


def _fit(context: Sequence[int], continuation: Sequence[int], window: int) -> tuple[list[int], int, int]:
    """(tokens, context length, context tokens dropped) of one pair cut to `window` tokens."""
    if len(continuation) > window:
        raise AOGPTError(f"a continuation of {len(continuation)} tokens does not fit the model's context of {window}",
                         "use shorter continuations (or loglikelihood_rolling for whole documents)")
    tokens = [*context, *continuation]
    dropped = max(0, len(tokens) - window)
    return tokens[dropped:], len(context) - dropped, dropped


@torch.inference_mode()
def score_continuations(model: torch.nn.Module, pairs: Sequence[Pair], *, order: str = "l2r", num_orders: int = 1,
                        seed: int = 0, batch_size: int = 16, progress: Callable[[int], None] | None = None
                        ) -> list[Score]:
    """log p(continuation | context) of every (context ids, continuation ids) pair (module docstring)."""
    core = unwrap(model)
    any_order = reading_mode(core, order)
    if num_orders < 1 or batch_size < 1:
        raise AOGPTError("the number of orders and the batch size must be at least 1", "pass K >= 1, batch_size >= 1")
    K = num_orders if any_order else 1
    device = next(core.parameters()).device
    fitted = [_fit(ctx, cont, core.config.block_size) for ctx, cont in pairs]
    scores: list[Score | None] = [None] * len(pairs)
    by_length = sorted(range(len(pairs)), key=lambda i: -len(fitted[i][0]))
    was_training = core.training
    core.eval()
    try:
        for b0 in range(0, len(by_length), batch_size):
            rows = by_length[b0:b0 + batch_size]
            L = len(fitted[rows[0]][0])
            idx = torch.zeros(len(rows), max(L, 1), dtype=torch.long)
            for r, i in enumerate(rows):
                idx[r, :len(fitted[i][0])] = torch.tensor(fitted[i][0], dtype=torch.long)
            idx = idx.to(device)
            logits, losses = core(idx)  # left to right: exact, and the greedy check
            draws = [-losses.double()] if not any_order else []
            orders: list[list[list[int]]] = [[] for _ in rows]
            for k in range(K if any_order else 0):
                sigma = torch.arange(idx.shape[1]).repeat(len(rows), 1)
                for r, i in enumerate(rows):
                    tokens, m, _ = fitted[i]
                    c = len(tokens) - m
                    gen = torch.Generator().manual_seed(draw_seed(seed, "continuation", tuple(tokens), m, k))
                    perm = torch.randperm(c, generator=gen)
                    sigma[r, m:m + c] = m + perm
                    orders[r].append(perm.tolist())
                draws.append(-core(idx, sigma.to(device))[1].double())
            for r, i in enumerate(rows):
                tokens, m, dropped = fitted[i]
                c = len(tokens) - m
                target = idx[r, m:m + c]
                values = [float(d[r, m:m + c].sum()) for d in draws]
                greedy = bool((logits[r, m:m + c].argmax(-1) == target).all())
                scores[i] = Score(sum(values) / len(values), greedy, c, values, not any_order,
                                  orders[r] if any_order else None, dropped)
            if progress is not None:
                progress(len(rows))
    finally:
        core.train(was_training)
    return scores  # type: ignore[return-value]


def rolling_windows(n: int, window: int) -> list[tuple[int, int, int]]:
    """(start, first scored, end) token indices of the windows that score n tokens (module docstring)."""
    if window < 2:
        raise AOGPTError(f"a context of {window} tokens is too short for rolling windows", "use a real model")
    out = [(0, 0, min(n, window))] if n else []
    scored = min(n, window)
    while scored < n:
        end = min(n, scored + window - 1)
        out.append((end - window, scored, end))
        scored = end
    return out


def score_documents(model: torch.nn.Module, documents: Sequence[Sequence[int]], *, order: str = "l2r",
                    num_orders: int = 1, seed: int = 0, batch_size: int = 16,
                    progress: Callable[[int], None] | None = None) -> list[Score]:
    """log p(document) of every document (token ids), in rolling windows; draw k of a document is the
    sum of draw k of its windows (so its standard error is the draws' sd / sqrt(K) as for a pair)."""
    core = unwrap(model)
    exact = not reading_mode(core, order)
    K = 1 if exact else num_orders
    pairs, owner = [], []
    for d, doc in enumerate(documents):
        for start, first, end in rolling_windows(len(doc), core.config.block_size):
            pairs.append((doc[start:first], doc[first:end]))
            owner.append(d)
    parts = score_continuations(core, pairs, order=order, num_orders=num_orders, seed=seed, batch_size=batch_size,
                                progress=progress)
    out = [Score(0.0, True, 0, [0.0] * K, exact) for _ in documents]
    for d, part in zip(owner, parts, strict=True):
        doc = out[d]
        doc.draws = [a + b for a, b in zip(doc.draws, part.draws, strict=True)]
        doc.tokens += part.tokens
        doc.is_greedy = doc.is_greedy and part.is_greedy
    for doc in out:
        doc.logprob = sum(doc.draws) / len(doc.draws)
    return out


__all__ = ["Score", "reading_mode", "rolling_windows", "score_continuations", "score_documents"]


@torch.inference_mode()
def score_infill(model: torch.nn.Module, prefix: Sequence[int], span: Sequence[int], suffix: Sequence[int]) -> float:
    """Exact log p(span | prefix, suffix) of one request: the ids read as prefix, suffix, then the span
    left to right, in one causal pass (`aogpt.evaluation.infill` explains why this is exact). The sides
    are cut to fit the model's context (the prefix on the left, the suffix on the right); a span that
    does not fit is refused."""
    core = unwrap(model)
    fam = family_of(core)
    if not (fam.causal and fam.one_pass_nll and fam.any_order):
        raise AOGPTError(f"variant {fam.name} cannot score a span given the text after it in one pass",
                         "use an any-order decoder (aogpt, sigma)")
    room = core.config.block_size - len(span)
    if not span or room < 0:
        raise AOGPTError(f"a span of {len(span)} tokens does not fit the model's context of "
                         f"{core.config.block_size}", "score a non-empty, shorter span")
    pre = list(prefix)[max(0, len(prefix) - room):]
    suf = list(suffix)[:room - len(pre)]
    P, L = len(pre), len(span)
    device = next(core.parameters()).device
    idx = torch.tensor([pre + list(span) + suf], dtype=torch.long, device=device)
    order = torch.cat([torch.arange(P), torch.arange(P + L, P + L + len(suf)), torch.arange(P, P + L)])
    losses = core(idx, order.to(device)[None])[1]
    return -float(losses[0, P + len(suf):].double().sum())
