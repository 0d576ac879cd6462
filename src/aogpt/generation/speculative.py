"""Exact self-speculative decoding: several tokens per forward pass, with samples from the model's
own sequential (any-order) distribution along the chain order.

Along the chain order (known tokens first, then the positions to generate), a decoder reveals one
position per step exactly by the chain rule. Speculation drafts several at once and verifies them:

- **Draft.** k query slots at once (the pending token's content, each with one of the next k
  chain positions as target, attending to the cache and itself: the parallel step of Lemma 4.1)
  give draft conditionals p_0..p_{k-1}; drafts d_j ~ p_j are drawn independently. p_0 *is* the true
  conditional q_0 (query 0 is the causal slot), so d_0 is committed at once.
- **Verify.** The next forward holds the drafted tokens d_1..d_{k-1} as ordinary causal slots (the
  catch-up slots of the step machinery), whose outputs are the true conditionals q_1..q_{k-1} given
  every token before them. Draft j is accepted with probability min(1, q_j(d_j) / p_j(d_j)); at the
  first rejection the position is resampled from normalize(max(0, q_j - p_j)) and the rest of the
  draft is dropped (Leviathan et al. 2023; Chen et al. 2023): the committed tokens are distributed
  exactly as sequential sampling. p and q are taken after the same temperature / top-k / top-p
  transform, so it is the transformed sequential law that is matched.
- **Pipelined.** The same forward also drafts the next k positions, assuming every draft is
  accepted (their content is the last draft). When one is rejected those new drafts are discarded
  and the next forward drafts afresh; the cache stays exact because a column always holds the slot
  of its chain index: rejected slots are overwritten, never appended.

After the first forward (which also prefills the known tokens' slots) each sequence's cache holds
exactly its committed tokens, so a sequence contributes t catch-up rows (its t pending drafts)
and k query rows; sequences of a batch
accept different counts and are packed (`aogpt.kv_cache.PackedSlots`), so none waits for another
beyond the attention padding. k is fixed (``speculative=K``) or adapted per sequence
(``speculative="auto"``: doubled after a fully accepted round, cut to one more than the accepted
count after a rejection, between 1 and `AUTO_MAX`). With k = 1 this is one token per step, draw for
draw (same random stream).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from aogpt.decode.layouts import ragged_layout, sequence_major, step_rows
from aogpt.generation.decoder import compiled
from aogpt.generation.reveal import scatter_by_position
from aogpt.generation.settings import GenerationSettings
from aogpt.generation.streams import SequenceStreams
from aogpt.orders import identity_run, step_gates
from aogpt.pathway import is_gated
from aogpt.sampling import SamplingConfig, categorical, probabilities, sample_tokens

AUTO_START, AUTO_MAX = 4, 16


def distribution(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The law a token is drawn from (after temperature, top-k, top-p; a point mass when greedy)."""
    if cfg.greedy:
        limit = cfg.vocab_limit or logits.shape[-1]
        return torch.nn.functional.one_hot(logits[..., :limit].argmax(-1), limit).to(cfg.dtype)
    return probabilities(logits, cfg)


class SpeculativeSampler:
    """One batch decoded along fixed chain orders by drafting and exactly verifying k tokens a time."""

    def __init__(self, model: torch.nn.Module, chain: torch.Tensor, known: torch.Tensor,
                 settings: GenerationSettings, k: int | str):
        B, n = chain.shape
        dev = chain.device
        m = known.numel()
        self.model, self.B, self.n, self.dev = model, B, n, dev
        self.ychain = torch.full((B, n + 2), -1, dtype=torch.long, device=dev)  # content of chain slot i
        self.ychain[:, 1:m + 1] = known
        self.pos = torch.cat([torch.zeros_like(chain[:, :1]), chain + 1], dim=1)
        self.tgt = torch.cat([chain, torch.full_like(chain[:, :1], model.config.block_size)], dim=1)
        self.cache = model.setup_cache(B, n + 1, settings.attention)
        self.layout = ragged_layout(model, "padded")  # the fast path's (measured); the reference path: padded
        self.forward = compiled(model.forward_slots, settings.compile, dev)
        self.runs = identity_run(chain) if is_gated(model) else None  # a gated model's (`aogpt.orders.step_gates`)
        self.auto = k == "auto"
        longest = AUTO_MAX if self.auto else int(k)
        self.k = np.full(B, AUTO_START if self.auto else int(k), dtype=np.int64)
        self.g = np.full(B, m, dtype=np.int64)  # committed chain positions
        self.L = np.zeros(B, dtype=np.int64)  # cached slots (= g after the first forward)
        self.t = np.zeros(B, dtype=np.int64)  # pending drafts, at chain positions g .. g + t - 1
        self.draft_p: torch.Tensor | None = None  # (B, longest, V): the laws the pending drafts came from
        self.streams: SequenceStreams | None = None  # the batch's random streams, given to `run`
        self.logits = None
        self.forwards = self.slots = self.padded = 0
        self.revealed: list[np.ndarray] = []  # tokens committed per forward, per sequence
        self.proposed = np.zeros(longest + 1, dtype=np.int64)  # drafts verified, by draft position
        self.accepted = np.zeros(longest + 1, dtype=np.int64)  # ... and accepted

    def _t(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(self.dev)

    def decided(self) -> torch.Tensor:
        """Tokens by position (B, n) committed so far (pending drafts are not), -1 where still masked."""
        committed = torch.arange(self.n, device=self.dev) < self._t(self.g)[:, None]
        return scatter_by_position(self.pos[:, 1:] - 1, self.ychain[:, 1:self.n + 1], committed)

    def run(self, cfg: SamplingConfig, streams: SequenceStreams,
            progress: Callable[[int], None] | None) -> torch.Tensor:
        """Decode to the end; every draw (drafts, verification, redraws) from the sequence's own
        ``tokens`` stream, in an order that depends on that sequence alone."""
        self.streams = streams
        while (self.g < self.n).any():
            before = self.g.copy()
            self._forward(cfg)
            self.revealed.append(self.g - before)
            if progress is not None:
                progress(int((self.g - before).sum()))
        return self.ychain[:, 1:self.n + 1]

    def _uniforms(self, seqs: np.ndarray, cfg: SamplingConfig) -> torch.Tensor:
        return self.streams.token_uniforms(seqs, cfg.dtype, self.dev)

    def _forward(self, cfg: SamplingConfig) -> None:
        """One forward: verify every sequence's pending drafts and draft its next k positions."""
        B, n, g, t, L = self.B, self.n, self.g, self.t, self.L
        k = np.where(g < n, np.minimum(self.k, n - g - t), 0)
        decided = g + t  # the query rows see every committed and drafted slot, causally
        sizes = np.where(g < n, decided - L + k, 0)  # catch-ups (prefill, then the drafts) + queries
        R, W = int(sizes.sum()), int(sizes.max())
        b = np.repeat(np.arange(B), sizes)  # the rows sequence-major, as the logits come back
        s = np.arange(R) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        col = L[b] + s
        # the forward's rows in the decode path's layout (packed; attention bucketed by width, or padded)
        pb, pcol, where, mask = step_rows(self.layout, sizes, L, decided, self.cache.k.dtype, self.dev)
        content = np.minimum(pcol, decided[pb])
        order = sequence_major(pb, pcol)
        pb_t, pcol_t = self._t(pb), self._t(pcol)
        pos, target = self.pos[pb_t, self._t(content)][None], self.tgt[pb_t, pcol_t][None]
        extra = {} if self.runs is None else {"gate": step_gates(self.runs, pb_t[None], self._t(content)[None], pos,
                                                                target)}
        logits = self.forward(self.ychain.view(-1)[self._t(pb * (n + 2) + content)][None], pos, target,
                              attn_mask=mask, cache=self.cache, cache_pos=where,
                              select=None if order is None else self._t(order)[None], **extra)[0]
        self.forwards += 1
        self.slots += R
        self.padded += B * W - R if self.layout == "padded" else 0
        queries = np.nonzero(col >= decided[b])[0]
        drafts = sample_tokens(logits[self._t(queries)], cfg,
                               uniforms=None if cfg.greedy else self._uniforms(b[queries], cfg))
        first_draft = np.cumsum(sizes) - sizes + (g - L)  # each sequence's first verification row
        accepted = self._verify(logits, first_draft, cfg)
        self._commit(drafts, k, first_draft + t, accepted, logits, cfg)
        self.L = self.g.copy()

    def _verify(self, logits: torch.Tensor, first: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
        """Accept or resample every sequence's pending drafts, all at once; returns how many drafts
        each sequence accepted (its t when all)."""
        accepted = self.t.copy()
        seqs = np.nonzero(self.t > 0)[0]
        if not len(seqs):
            return accepted
        t = self.t[seqs]
        T = int(t.max())
        si, ji = np.nonzero(np.arange(T) < t[:, None])  # (sequence, draft) pairs pending, row-major
        s_t, j_t = self._t(si), self._t(ji)
        q = distribution(logits[self._t(first[seqs][si] + ji)], cfg)  # the drafts' true conditionals
        p = self.draft_p[self._t(seqs[si]), j_t]
        drafted = self.ychain[self._t(seqs[si]), self._t(self.g[seqs][si] + 1 + ji)]
        u = self._uniforms(seqs[si], cfg)[:, 0]  # one per pending draft, each sequence's in draft order
        rows = torch.arange(len(si), device=self.dev)
        ok = torch.zeros(len(seqs), T, dtype=torch.bool, device=self.dev)  # past a row's t: stop counting
        ok[s_t, j_t] = u * p[rows, drafted] <= q[rows, drafted]  # u < q(d) / p(d)
        a = ok.long().cumprod(dim=1).sum(dim=1).cpu().numpy()  # drafts before the first rejection
        accepted[seqs] = a
        self._count(np.minimum(a + 1, t), a)
        rejected = np.nonzero(a < t)[0]
        if len(rejected):  # the first rejected position, redrawn from normalize(max(0, q - p))
            at = self._t(np.searchsorted(si, rejected) + a[rejected])  # its row among the pending drafts
            b = seqs[rejected]
            redrawn = categorical(torch.clamp(q[at] - p[at], min=0), uniforms=self._uniforms(b, cfg))
            self.ychain[self._t(b), self._t(self.g[b] + 1 + a[rejected])] = redrawn
        return accepted

    def _count(self, verified: np.ndarray, accepted: np.ndarray) -> None:
        """Acceptance statistics by draft position (position 0, the true conditional, is not counted)."""
        for into, counts in ((self.proposed, verified), (self.accepted, accepted)):
            into[1:] += np.bincount(np.concatenate([np.arange(c) for c in counts]).astype(np.int64) + 1,
                                    minlength=len(into))[1:]

    def _commit(self, drafts: torch.Tensor, k: np.ndarray, first_query: np.ndarray, accepted: np.ndarray,
                logits: torch.Tensor, cfg: SamplingConfig) -> None:
        """Commit accepted drafts (and redrawn tokens); keep the new drafts of fully accepted sequences."""
        rejected = accepted < self.t
        self.g = np.where(rejected, self.g + accepted + 1, self.g + self.t)
        offsets = np.cumsum(k) - k  # each sequence's first draft among `drafts`
        k = np.where(rejected, 0, k)  # drafts made on top of a rejected token are dropped
        keep = np.nonzero(k > 0)[0]
        if len(keep):
            b = np.repeat(keep, k[keep])
            j = np.arange(len(b)) - np.repeat(np.cumsum(k[keep]) - k[keep], k[keep])
            self.ychain[self._t(b), self._t(self.g[b] + 1 + j)] = drafts[self._t(offsets[b] + j)]
            later = j > 0  # pending drafts: keep the laws they were drawn from, for their verification
            if later.any():
                laws = distribution(logits[self._t(first_query[b][later] + j[later])], cfg)
                if self.draft_p is None:
                    self.draft_p = laws.new_zeros(self.B, len(self.proposed) - 1, laws.shape[-1])
                self.draft_p[self._t(b[later]), self._t(j[later] - 1)] = laws
        self.g[keep] += 1  # each first draft is the true conditional: committed now
        self.t = np.where(k > 0, k - 1, 0)
        if self.auto:
            self.k = np.where(rejected, np.maximum(1, accepted + 1), np.minimum(AUTO_MAX, 2 * self.k))
