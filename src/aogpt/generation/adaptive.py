"""Adaptive unmasking: the model chooses which positions to reveal next, from its own confidence.

The orders ``confidence``, ``margin`` and ``entropy`` (`aogpt.orders.ADAPTIVE`) are not permutations
drawn before decoding: at every step each still-masked *candidate* position is scored from the
model's distribution for it given the tokens decided so far, and the best ones are revealed:

- ``confidence``: the largest probability (LLaDA's low-confidence remasking keeps the rest masked);
- ``margin``: the largest gap between the two most likely tokens (Kim et al., ICML 2025);
- ``entropy``: the lowest entropy.

How many per step comes from the plan as for any order (`aogpt.generation.plan`; the ``count``
policy by default: one position per step unless `--steps` says otherwise). A confidence threshold P
(Fast-dLLM) additionally reveals every candidate whose largest probability is at least P, and at
least one position per step. The scores use the model's own distribution (temperature 1, no top-k
or top-p, the vocabulary padding cut off), so the sampling knobs change which token is drawn but
not which positions are chosen. Ties go to the lowest position.

**Decoder, with the exact KV cache.** The decoder's step (`aogpt.generation.decoder`, docs/design.md)
already evaluates query slots that hold the pending token and aim at any target. Here one forward
evaluates, per sequence, the catch-up slots of the previous step and one query slot per candidate
(query j at cache column g + j, attending to the decided columns [0, g) and to itself only), so
every candidate's logits are exactly p(x_j | decided tokens). The chosen positions extend the chain
order, best first; the tokens are drawn from those same logits. The best candidate's query computed
exactly the keys and values of chain slot g (same content, same target, same context), so they are
copied from its column to column g instead of being recomputed; the other chosen positions are next
step's catch-ups, as for any order. Sequences of a batch choose different positions, so the rows of
all sequences are packed (`aogpt.kv_cache.PackedSlots`).

**Cost.** A step costs one query slot per candidate: scoring every remaining position reveals n
tokens one per step with n(n+1)/2 query slots, O(n^2), against n for a fixed order. `candidates=C`
scores a random subset of C remaining positions per step instead (at least as many as the step
reveals), about C * n slots in all; ``slot_evaluations`` in the timing reports what was spent.
The encoder-only MDM scores all masked positions in its single bidirectional pass per step, so
candidates cost it nothing beyond the output head (`aogpt.families.encoder`).

The choice of positions depends on the sampled tokens, so unlike the fixed-order sampler nothing is
planned before the loop: each step's layout is built on the host from the previous step's choice.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from aogpt.decode.layouts import ragged_layout, sequence_major, step_rows
from aogpt.generation.reveal import scatter_by_position
from aogpt.generation.settings import GenerationSettings
from aogpt.generation.streams import SequenceStreams
from aogpt.orders import ADAPTIVE, identity_run, step_gates
from aogpt.pathway import is_gated
from aogpt.sampling import SamplingConfig, sample_tokens


def candidate_scores(logits: torch.Tensor, policy: str, vocab_limit: int | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(score, confidence) per row of `logits` (R, V): higher scores are revealed first; confidence
    is the largest probability (what a threshold compares with). In at least float32."""
    if policy not in ADAPTIVE:
        raise ValueError(f"unknown adaptive policy {policy!r}")
    if vocab_limit is not None:
        logits = logits[..., :vocab_limit]
    logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    p = logp.exp()
    top = p.topk(min(2, p.shape[-1]), dim=-1).values
    confidence = top[..., 0]
    if policy == "confidence":
        return confidence, confidence
    if policy == "margin":
        second = top[..., 1] if top.shape[-1] > 1 else torch.zeros_like(confidence)
        return confidence - second, confidence
    entropy = -(p * logp.clamp(min=torch.finfo(logp.dtype).min)).sum(dim=-1)  # 0 * log 0 = 0
    return -entropy, confidence


def choose(score: np.ndarray, confidence: np.ndarray, count: np.ndarray, threshold: float | None
           ) -> list[np.ndarray]:
    """Which candidates a step reveals, per sequence, best first (indices into its candidates).

    score and confidence are (A, C), padded with -inf and -1 past each sequence's candidates; count
    (A,) is the planned number. The revealed set is the `count` best by score plus every candidate
    whose confidence reaches `threshold` (with a threshold, at least the best one). Ties in score go
    to the candidate listed first (the lower position)."""
    ranked = np.argsort(-score, axis=1, kind="stable")
    rank = np.empty_like(ranked)
    np.put_along_axis(rank, ranked, np.broadcast_to(np.arange(score.shape[1]), score.shape), axis=1)
    take = rank < count[:, None]
    if threshold is not None:
        take |= (confidence >= threshold) | (rank == 0)
    return [r[t[r]] for r, t in zip(ranked, take, strict=True)]


class AdaptiveSteps:
    """Bookkeeping shared by the decoder's and the encoder's adaptive samplers: the chain order as it
    is chosen, how many positions each step revealed, the candidates of a step and the choice."""

    def __init__(self, chain: torch.Tensor, m: int, plan: np.ndarray, settings: GenerationSettings,
                 streams: SequenceStreams, teacher: torch.Tensor | None, record: bool, vocab: int,
                 dtype: torch.dtype):
        B, n = chain.shape
        self.B, self.n, self.plan = B, n, plan
        self.policy = settings.plan.order
        self.budget, self.threshold = settings.plan.candidates, settings.plan.threshold
        self.streams = streams
        self.order = chain.cpu().numpy().copy()  # known positions first; the rest is filled in as chosen
        self.remaining = np.ones((B, n), dtype=bool)
        np.put_along_axis(self.remaining, self.order[:, :m], False, axis=1)
        self.g = np.full(B, m, dtype=np.int64)
        self.counts = np.zeros_like(plan)
        self.teacher = teacher
        self.logits: torch.Tensor | None = None
        if record:
            self.logits = torch.full((B, n, vocab), float("nan"), device=chain.device, dtype=dtype)
        self.forwards = self.slots = self.padded = self.scored = 0

    @property
    def chain(self) -> torch.Tensor:
        """The chain orders (B, n) chosen so far: orders[b, i] = the position decided i-th."""
        return torch.from_numpy(self.order)

    def planned(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Which sequences take part in step t, and the number each must reveal at least."""
        left = self.n - self.g
        k = np.minimum(self.plan[:, t], left)
        if self.threshold is not None:
            k = np.minimum(np.maximum(k, 1), left)
        return np.nonzero(k > 0)[0], k

    def candidates(self, active: np.ndarray, k: np.ndarray) -> list[np.ndarray]:
        """The candidate positions of each active sequence, ascending: every remaining position, or a
        random subset of `candidates` of them (at least as many as the step reveals)."""
        rem = self.remaining[active]
        if self.budget is None:
            return [np.flatnonzero(r) for r in rem]
        keys = self.streams.uniforms(np.repeat(active, rem.shape[1]), "plan").reshape(rem.shape)
        keys[~rem] = 2.0  # never drawn
        first = np.argsort(keys, axis=1, kind="stable")
        sizes = np.minimum(rem.sum(axis=1), np.maximum(self.budget, k[active]))
        return [np.sort(first[i, :s]) for i, s in enumerate(sizes)]

    def decide(self, logits: torch.Tensor, active: np.ndarray, cands: list[np.ndarray], k: np.ndarray,
               cfg: SamplingConfig) -> tuple[torch.Tensor, list[np.ndarray]]:
        """Score the candidates (their logits, flat in `cands` order), choose, draw the tokens and extend
        the chains. Returns the drawn tokens (flat, sequences in turn, best first) and, per active
        sequence, the indices (into its candidates) of the positions it revealed, best first."""
        score, conf = candidate_scores(logits, self.policy, cfg.vocab_limit)
        sizes = np.array([len(c) for c in cands])
        A, C = len(active), int(sizes.max())
        seq = np.repeat(np.arange(A), sizes)
        slot = np.arange(len(seq)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        S = np.full((A, C), -np.inf)
        P = np.full((A, C), -1.0)
        S[seq, slot] = score.double().cpu().numpy()
        P[seq, slot] = conf.double().cpu().numpy()
        picks = choose(S, P, k[active], self.threshold)
        taken = np.array([len(p) for p in picks])
        offsets = np.cumsum(sizes) - sizes
        rows = np.concatenate([offsets[a] + picks[a] for a in range(A)])
        rows_t = torch.from_numpy(rows).to(logits.device)
        chosen = logits.index_select(0, rows_t)
        b_of = np.repeat(active, taken)
        pos_of = np.concatenate([cands[a][picks[a]] for a in range(A)])
        if self.teacher is not None:
            new = self.teacher[torch.from_numpy(b_of).to(self.teacher.device),
                               torch.from_numpy(pos_of).to(self.teacher.device)]
        else:
            u = None if cfg.greedy else self.streams.token_uniforms(b_of, cfg.dtype, chosen.device)
            new = sample_tokens(chosen, cfg, uniforms=u)
        at = np.concatenate([self.g[b] + np.arange(taken[a]) for a, b in enumerate(active)])
        if self.logits is not None:
            self.logits[torch.from_numpy(b_of).to(chosen.device), torch.from_numpy(at).to(chosen.device)] = chosen
        self.order[b_of, at] = pos_of
        self.remaining[b_of, pos_of] = False
        self.scored += len(seq)
        return new, picks

    def advance(self, t: int, active: np.ndarray, picks: list[np.ndarray]) -> int:
        taken = np.array([len(p) for p in picks])
        self.counts[active, t] = taken
        self.g[active] += taken
        return int(taken.sum())


class AdaptiveSampler:
    """The loop every adaptive sampler runs, step by step: who takes part, their candidates, one
    forward that scores them (`_forward`), the choice and the draws (`AdaptiveSteps.decide`), and
    writing the tokens back (`_commit`). Same interface as `aogpt.generation.decoder.DecoderSampler`,
    plus the chain orders chosen (`chain`) and the positions revealed per step (`step_counts`)."""

    steps: AdaptiveSteps
    dev: torch.device

    def run(self, cfg: SamplingConfig, streams: SequenceStreams,
            progress: Callable[[int], None] | None) -> torch.Tensor:
        """Decode every step; returns the tokens in the chosen chain order (B, n). Token draws and
        candidate subsets come from each sequence's own streams (given at construction)."""
        st = self.steps
        for t in range(st.plan.shape[1]):
            active, k = st.planned(t)
            if len(active) == 0:
                continue
            cands = st.candidates(active, k)
            logits = self._forward(active, cands)
            new, picks = st.decide(logits, active, cands, k, cfg)
            self._commit(active, cands, picks, new)
            revealed = st.advance(t, active, picks)
            if progress is not None:
                progress(revealed)
        return self._tokens()

    def _forward(self, active: np.ndarray, cands: list[np.ndarray]) -> torch.Tensor:
        """The candidates' logits, flat in `cands` order, given the tokens decided so far."""
        raise NotImplementedError

    def _commit(self, active: np.ndarray, cands: list[np.ndarray], picks: list[np.ndarray],
                new: torch.Tensor) -> None:
        """Record the drawn tokens `new` (sequences in turn, best first) before the chains advance."""
        raise NotImplementedError

    def _tokens(self) -> torch.Tensor:
        raise NotImplementedError

    @property
    def chain(self) -> torch.Tensor:
        return self.steps.chain.to(self.dev)

    @property
    def step_counts(self) -> np.ndarray:
        return self.steps.counts

    @property
    def logits(self) -> torch.Tensor | None:
        return self.steps.logits

    @property
    def forwards(self) -> int:
        return self.steps.forwards

    @property
    def slots(self) -> int:
        return self.steps.slots

    @property
    def padded(self) -> int:
        return self.steps.padded

    @property
    def scored(self) -> int:
        """Candidate slots scored (query slots for a decoder; head rows for the encoder)."""
        return self.steps.scored


class AdaptiveDecoderSampler(AdaptiveSampler):
    """One batch decoded by a decoder (sigma-GPT, AO-GPT) in an adaptive order, with the exact KV
    cache (module docstring)."""

    def __init__(self, model: torch.nn.Module, chain: torch.Tensor, known: torch.Tensor, plan: np.ndarray,
                 settings: GenerationSettings, streams: SequenceStreams,
                 teacher: torch.Tensor | None = None, record: bool = False):
        B, n = chain.shape
        dev = chain.device
        m = known.numel()
        self.model, self.B, self.n, self.dev = model, B, n, dev
        self.dtype = next(model.parameters()).dtype
        self.steps = AdaptiveSteps(chain, m, plan, settings, streams, teacher, record, model.config.vocab_size,
                                   self.dtype)
        self.ychain = torch.full((B, n + 2), -1, dtype=torch.long, device=dev)  # content of chain slot i
        self.ychain[:, 1:m + 1] = known
        self.use_cache = settings.use_cache
        self.cache = model.setup_cache(B, n + 1, settings.attention)  # without reuse: every slot recomputed
        self.L = np.zeros(B, dtype=np.int64)  # chain slots whose keys are cached
        self.layout = ragged_layout(model, "padded")  # the fast path's (measured); the reference path: padded

    def _tokens(self) -> torch.Tensor:
        return self.ychain[:, 1:self.n + 1]

    def decided(self) -> torch.Tensor:
        """Tokens by position (B, n) decided so far, -1 where still masked (`aogpt.generation.reveal`)."""
        decided = torch.arange(self.n, device=self.dev) < self._t(self.steps.g)[:, None]
        return scatter_by_position(self.chain, self._tokens(), decided)

    def _t(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(self.dev)

    def _forward(self, active: np.ndarray, cands: list[np.ndarray]) -> torch.Tensor:
        """One packed forward: each active sequence's catch-up slots L .. g - 1, then one query slot per
        candidate at columns g, g + 1, ...; returns the candidates' logits (flat, in `cands` order)."""
        B, n, st = self.B, self.n, self.steps
        if not self.use_cache:
            self.L[:] = 0  # recompute every decided slot
        g, L = st.g, self.L
        sizes = np.zeros(B, dtype=np.int64)
        n_cand = np.array([len(c) for c in cands])
        sizes[active] = g[active] - L[active] + n_cand
        R, W = int(sizes.sum()), int(sizes.max())
        # the rows in the decode path's layout (packed; in attention bucketed by width, or padded)
        b, col, where, mask = step_rows(self.layout, sizes, L, g, self.cache.k.dtype, self.dev)
        content = np.minimum(col, g[b])  # a query holds the pending slot's content
        query = col >= g[b]
        slot_pos = np.concatenate([np.zeros((B, 1), dtype=np.int64), st.order + 1], axis=1)
        candidate = np.zeros((B, int(n_cand.max())), dtype=np.int64)
        for a, c in zip(active, cands, strict=True):
            candidate[a, :len(c)] = c
        target = np.where(query, candidate[b, np.where(query, col - g[b], 0)], st.order[b, np.minimum(col, n - 1)])
        order = sequence_major(b, col)
        rows = np.flatnonzero(query) if order is None else order[query[order]]  # candidates in `cands` order
        tokens = self.ychain.view(-1)[self._t(b * (n + 2) + content)][None]
        pos_t, target_t = self._t(slot_pos[b, content])[None], self._t(target)[None]
        extra = {}
        if is_gated(self.model):  # the decided part of each chain reads left to right up to its identity run
            run = identity_run(self._t(st.order))
            extra["gate"] = step_gates(run, self._t(b)[None], self._t(content)[None], pos_t, target_t)
        logits = self.model.forward_slots(tokens, pos_t, target_t, attn_mask=mask, cache=self.cache, cache_pos=where,
                                          select=self._t(rows)[None], **extra)
        st.forwards += 1
        st.slots += R
        st.padded += B * W - R if self.layout == "padded" else 0
        return logits[0]

    def _commit(self, active: np.ndarray, cands: list[np.ndarray], picks: list[np.ndarray],
                new: torch.Tensor) -> None:
        """Write the drawn tokens into the chain contents, and the best candidate's keys and values
        into column g (they are chain slot g's: module docstring)."""
        g, n = self.steps.g, self.n
        taken = np.array([len(p) for p in picks])
        dest = np.concatenate([b * (n + 2) + g[b] + 1 + np.arange(t) for b, t in zip(active, taken, strict=True)])
        self.ychain.view(-1)[self._t(dest)] = new
        best = np.array([p[0] for p in picks])
        moved = best > 0
        if moved.any():
            bi, dst = self._t(active[moved]), self._t(g[active[moved]])
            src = dst + self._t(best[moved])
            for buf in (self.cache.k, self.cache.v):
                buf[:, bi, :, dst] = buf[:, bi, :, src]
        self.L[active] = g[active] + 1
