"""The exact law of the any-order sampler, and a chi-square test of samples against a law.

A decoder model (`forward_slots`) samples a sequence of `n` tokens over `V` symbols in a random order,
in steps that each reveal some tokens conditioned only on the tokens of earlier steps. For tiny `n`
and `V` its law can be enumerated: every sequence, every one of the n! orders, every step plan.
`exact_joint` does that by plain causal forwards (no cache, no custom mask), independently of the
generator's code; `chi2_pvalue` tests samples against such a law. Both the GPU check
(`aogpt.bench.gpu.checks`, on the device's generator) and the tests of the sampler use them, so they
live here, below both.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch

LAW_N, LAW_V = 3, 3  # sequences of 3 tokens over 3 symbols: 27 cells, 6 orders
LAW_P = 1e-3  # a sample law is accepted with p above this
POWER_P = 1e-6  # a wrong law must be rejected with p below this


def reference_logits(model: Any, chain: torch.Tensor, y: torch.Tensor, context: int, target: int) -> torch.Tensor:
    """Logits for chain position `target` given the first `context` chain tokens: one plain causal
    forward over (start, the context in chain order, the pending slot aimed at the target).

    chain: (n,) positions in decision order; y: (n,) or (X, n) tokens in chain order.
    """
    ys = y.reshape(-1, y.shape[-1])
    X = ys.shape[0]
    tokens = torch.cat([torch.full((X, 1), -1), ys[:, :context]], 1)
    pos = torch.cat([torch.tensor([0]), chain[:context] + 1]).expand(X, context + 1)
    tgt = torch.cat([chain[:context], chain[target:target + 1]]).expand(X, context + 1)
    with torch.no_grad():
        out = model.forward_slots(tokens, pos, tgt)[:, -1]
    return out.reshape(*y.shape[:-1], -1)


def exact_joint(model: Any, plans: list[tuple[float, list[int]]], n: int = LAW_N, V: int = LAW_V) -> np.ndarray:
    """p(x) for every x in V^n: the mean over all n! orders, summed over step plans (weight, sizes), of
    the product of the conditionals each step samples from (every step sees only earlier steps)."""
    xs = torch.tensor(list(itertools.product(range(V), repeat=n)))
    probs = torch.zeros(len(xs), dtype=torch.float64)
    orders = list(itertools.permutations(range(n)))
    for order in orders:
        chain = torch.tensor(order)
        y = xs[:, chain]
        for weight, sizes in plans:
            p, g = torch.ones(len(xs), dtype=torch.float64), 0
            for k in sizes:
                for i in range(g, g + k):
                    cond = torch.softmax(reference_logits(model, chain, y, g, i).double(), -1)
                    p = p * cond.gather(1, y[:, i:i + 1])[:, 0]
                g += k
            probs += weight * p
    return (probs / len(orders)).numpy()


def chi2_pvalue(tokens: torch.Tensor, probs: np.ndarray, V: int = LAW_V, min_expected: float = 5.0) -> float:
    """Pearson's chi-square of the samples' joint counts against `probs`; cells expected fewer than
    `min_expected` times pooled into one; a draw in a cell of probability 0 fails outright."""
    from scipy import stats

    n = tokens.shape[1]
    codes = (tokens * (V ** torch.arange(n - 1, -1, -1))).sum(1).numpy()
    observed = np.bincount(codes, minlength=V ** n)
    expected = probs / probs.sum() * observed.sum()
    if observed[expected == 0].any():
        return 0.0
    small = expected < min_expected
    if small.any():
        observed = np.append(observed[~small], observed[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    return float(stats.chisquare(observed, expected).pvalue)
