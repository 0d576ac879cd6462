"""The decoder's sampler: static KV cache, parallel query slots, Lemma 4.1.

The chain. Every sequence is generated along a *chain order* (a permutation of its n positions):
known tokens first (prompt or infill, ascending), then the masked positions in the unmasking order
(random, left to right or user-given). Chain slot i (the model's slot layout, `aogpt.model`) holds
the token at chain position i - 1 (the start token for i = 0) and targets chain position i. Its
keys and values depend on that target, so they can be computed only once the target is decided
(docs/design.md): the last decided token is *pending*.

One step reveals k_b positions of sequence b (k_b from `aogpt.schedules`). With g_b tokens decided
and L_b slots cached, the step evaluates, in one forward over the static cache:

- catch-up slots L_b .. g_b - 1 (decided in the previous step, not yet cached), causally;
- k_b query slots: the pending slot g_b's content, each with one of the new targets. Query j is
  written at cache column g_b + j and attends to columns [0, g_b) and to itself only (paper Fig. 10).

Cache column = chain slot index, always: query 0 *is* slot g_b and stays committed; the other query
columns are scratch, overwritten by the next step's catch-ups. So a row at column `col` reads
content slot min(col, g_b), targets chain position col, and attends to {c < g_b, c <= col} | {col}.
Afterwards L_b = g_b + 1 and g_b += k_b. A sequence with k_b = 0 sits the step out. Total work is
n queries + (n - steps) catch-ups, about 2n slot evaluations, and nothing is ever concatenated.

Batches: when every sequence has the same (L, g, k) (the ``count`` policy) all rows write from one
int column (`cache_pos`), and a single-slot step needs no mask at all. Otherwise rows are
padded to the longest sequence; padded rows write to columns nobody reads before they are
rewritten (or to the scratch column n) and are never selected.

``use_cache=False`` is the same step with L_b = 0: all decided slots are recomputed every step (the
benchmark's baseline and a test oracle for the cache logic).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from aogpt.sampling import SamplingConfig, sample_tokens


def step_mask(cols: torch.Tensor, decided: int | torch.Tensor, span: int) -> torch.Tensor:
    """Who a step's rows may attend to: the row at cache column `col` sees the decided columns
    c < decided up to itself (catch-ups are causal) and itself (a query sees no other query).
    cols (..., S), decided an int or (..., 1) -> bool (..., S, span)."""
    a = torch.arange(span, device=cols.device)
    col = cols[..., None]
    decided = decided[..., None] if isinstance(decided, torch.Tensor) else decided
    return ((a < decided) & (a <= col)) | (a == col)


class DecoderSampler:
    """One batch of sequences decoded along fixed chain orders with a fixed per-step plan."""

    def __init__(self, model: torch.nn.Module, chain: torch.Tensor, known: torch.Tensor, plan: np.ndarray,
                 use_cache: bool, teacher: torch.Tensor | None, record: bool):
        B, n = chain.shape
        dev = chain.device
        m = known.numel()
        self.model, self.B, self.n, self.m, self.plan = model, B, n, m, plan
        self.use_cache, self.teacher = use_cache, teacher
        self.ar = torch.arange(n + 1, device=dev)
        # content of chain slot i is ychain[:, i] (start = -1); column n + 1 is a write sink
        self.ychain = torch.full((B, n + 2), -1, dtype=torch.long, device=dev)
        self.ychain[:, 1:m + 1] = known
        self.pos = torch.cat([torch.zeros_like(chain[:, :1]), chain + 1], dim=1)
        self.tgt = torch.cat([chain, torch.full_like(chain[:, :1], model.config.block_size)], dim=1)
        self.cache = model.setup_cache(B, n + 1) if use_cache else None
        self.conditions = None if use_cache else model.conditions()  # adaLN tables, computed once
        self.L = np.zeros(B, dtype=np.int64)
        self.g = np.full(B, m, dtype=np.int64)
        self.uniform = bool((plan == plan[:1]).all())
        self.logits: torch.Tensor | None = None
        if record:
            V = model.config.vocab_size
            self.logits = torch.full((B, n, V), float("nan"), device=dev, dtype=next(model.parameters()).dtype)
        self.forwards = 0
        self.slots = 0
        self.padded = 0

    def run(self, cfg: SamplingConfig, gen: torch.Generator | None,
            progress: Callable[[int], None] | None) -> torch.Tensor:
        for i in range(self.plan.shape[1]):
            k = self.plan[:, i]
            if not k.any():
                continue  # nothing revealed: no forward (pending catch-ups simply wait)
            if self.uniform:
                self._uniform_step(int(k[0]), cfg, gen)
            else:
                self._general_step(k, cfg, gen)
            if progress is not None:
                progress(int(k.sum()))
        return self.ychain[:, 1:self.n + 1]

    def _draw(self, logits: torch.Tensor, cfg: SamplingConfig, gen: torch.Generator | None,
              teacher_index: tuple[Any, Any] | None) -> torch.Tensor:
        if self.teacher is not None:
            return self.teacher[teacher_index]
        return sample_tokens(logits, cfg, gen)

    def _uniform_step(self, k: int, cfg: SamplingConfig, gen: torch.Generator | None) -> None:
        B, ar = self.B, self.ar
        L, g = (int(self.L[0]) if self.use_cache else 0), int(self.g[0])
        c = g - L
        S = c + k
        span = L + S
        cols = ar[L:span]
        content = cols.clamp(max=g)
        tokens, pos, target = self.ychain[:, content], self.pos[:, content], self.tgt[:, cols]
        mask = None if S == 1 else step_mask(cols, g, span)[None, None]
        select = None if c == 0 else (c + ar[:k]).expand(B, k)
        logits = self.model.forward_slots(tokens, pos, target, attn_mask=mask, cache=self.cache, cache_pos=L,
                                          select=select, conditions=self.conditions)
        new = self._draw(logits.reshape(B * k, -1), cfg, gen, (slice(None), slice(g, g + k)))
        self.ychain[:, g + 1:g + 1 + k] = new.view(B, k)
        if self.logits is not None:
            self.logits[:, g:g + k] = logits
        self.forwards += 1
        self.slots += B * S
        if self.use_cache:
            self.L[:] = g + 1
        self.g += k

    def _general_step(self, k: np.ndarray, cfg: SamplingConfig, gen: torch.Generator | None) -> None:
        B, n, dev = self.B, self.n, self.ar.device
        act = k > 0
        L = self.L if self.use_cache else np.zeros_like(self.L)
        g = self.g
        c = g - L
        rows = np.where(act, c + k, 0)
        S, R = int(rows.max()), int(k.max())
        r = np.arange(S)
        cols = np.minimum(L[:, None] + r, n)  # padded rows: columns not read before rewritten, or n
        span = int(cols.max()) + 1
        cols_t = torch.from_numpy(cols).to(dev)
        g_t = torch.from_numpy(g).to(dev)[:, None]
        content = torch.minimum(cols_t, g_t)
        tokens = self.ychain.gather(1, content)
        pos, target = self.pos.gather(1, content), self.tgt.gather(1, cols_t)
        mask = step_mask(cols_t, g_t, span)[:, None]
        j = np.arange(R)
        valid = j < k[:, None]
        select = torch.from_numpy(np.where(valid, c[:, None] + j, 0)).to(dev)
        logits = self.model.forward_slots(tokens, pos, target, attn_mask=mask, cache=self.cache, cache_pos=cols_t,
                                          select=select, conditions=self.conditions)
        bi, ji = np.nonzero(valid)
        bi_t, col_t = torch.from_numpy(bi).to(dev), torch.from_numpy(g[bi] + ji).to(dev)
        rows_logits = logits[torch.from_numpy(bi).to(dev), torch.from_numpy(ji).to(dev)]
        new = self._draw(rows_logits, cfg, gen, (bi_t, col_t))
        self.ychain[bi_t, col_t + 1] = new
        if self.logits is not None:
            self.logits[bi_t, col_t] = rows_logits
        self.forwards += 1
        self.slots += int(rows.sum())
        self.padded += B * S - int(rows.sum())
        if self.use_cache:
            self.L[act] = g[act] + 1
        self.g += k
