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

Planned before the loop. The orders and per-step counts do not depend on the sampled tokens, so
`plan_steps` turns them into one `Step` per forward before the model runs: which slot contents to
gather, their positions and targets, where their keys go, the attention mask, which rows go
through the head and where their tokens land. The loop itself only gathers, runs the model,
samples and scatters: no host-side bookkeeping, no device-to-host synchronisation.

Batches: when every sequence has the same (L, g, k) (the ``count`` policy) the step is a (B, S)
block written from one int column, and a single-slot step needs no mask at all. Otherwise
(Lemma 4.1's ragged steps) the real slots of all sequences are *packed* into one row dimension, so
the linear layers do exactly the real work, and attention runs once per run of consecutive
sequences of one width (`aogpt.kv_cache.RaggedSlots`): no slot anywhere is padding. A sequence
with k_b = 0 sits the step out.

``use_cache=False`` is the same step with L_b = 0: all decided slots are recomputed every step (the
benchmark's baseline and a test oracle for the cache logic).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from aogpt.generation.reveal import scatter_by_position
from aogpt.generation.settings import GenerationSettings
from aogpt.generation.streams import SequenceStreams
from aogpt.kv_cache import PackedSlots, RaggedSlots, additive, ragged_layout, ragged_steps, step_mask, step_rows
from aogpt.orders import identity_run, step_gates
from aogpt.pathway import is_gated
from aogpt.sampling import SamplingConfig, sample_tokens


@dataclass
class Step:
    """One decode forward, planned before the loop (tensors on the model's device).

    gather: flat indices into the chain contents of every slot's content ((B, S), or (1, R) when
    packed); pos, target: the slots' positions and targets; cache_pos and mask: where keys go and
    who attends to whom; select: the query rows sent through the head; dest: flat indices (into
    the chain contents) of the tokens they reveal; chain_at: the same as flat (b * n + chain index)
    positions, for teacher forcing and recorded logits; rows, padded: real and padding slots.
    Without a cache (the recompute baseline) ragged steps use a padded (B, S) layout instead of
    packing, and `pick` says which selected rows are real.
    """

    gather: torch.Tensor
    pos: torch.Tensor
    target: torch.Tensor
    cache_pos: int | torch.Tensor | RaggedSlots
    mask: torch.Tensor | None
    select: torch.Tensor | None
    dest: torch.Tensor
    chain_at: torch.Tensor
    revealed: int
    rows: int
    padded: int
    pick: torch.Tensor | None = None  # which of the selected rows are real (padded layout only)
    draws: np.ndarray | None = None  # the sequence of each revealed token, in the order they are drawn
    gate: torch.Tensor | None = None  # a gated model's slots through its pathway (`aogpt.orders.step_gates`)


class _Planner:
    """Turns per-step counts into `Step`s, tracking each sequence's decided (g) and cached (L) slots."""

    def __init__(self, B: int, n: int, m: int, use_cache: bool, pos: torch.Tensor, tgt: torch.Tensor,
                 dtype: torch.dtype, static: bool = False, layout: str = "buckets", run: torch.Tensor | None = None):
        self.B, self.n, self.use_cache, self.pos, self.tgt, self.dtype = B, n, use_cache, pos, tgt, dtype
        self.run = run  # a gated model's: the identity run of every chain (`aogpt.orders.identity_run`)
        self.layout = layout
        self.static = static and use_cache
        self.dev = pos.device
        self.L = np.zeros(B, dtype=np.int64)
        self.g = np.full(B, m, dtype=np.int64)

    def _t(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(self.dev)

    def _gate(self, seq: np.ndarray, read: np.ndarray, pos: torch.Tensor, target: torch.Tensor) -> torch.Tensor | None:
        """The rows' gates for a gated model (None for any other): rows (numpy, the shape of `pos`) of
        sequences `seq` whose content is chain slot `read`."""
        if self.run is None:
            return None
        return step_gates(self.run, self._t(np.array(seq)), self._t(np.array(read)), pos, target.expand(pos.shape))

    def plan(self, counts: np.ndarray) -> list[Step]:
        """The `Step` of every step of `counts` (B, T) that reveals something. Uniform steps are built
        one by one; the ragged steps' index arithmetic (bucketed layout) is done for all of them at
        once (`aogpt.kv_cache.ragged_steps`)."""
        steps: list[Step | None] = []
        ragged: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
        for i in range(counts.shape[1]):
            k = counts[:, i]
            if not k.any():
                continue
            L = self.L.copy() if self.use_cache else np.zeros_like(self.L)
            if (k == k[0]).all() and (L == L[0]).all() and (self.g == self.g[0]).all():
                steps.append(self._uniform(int(k[0]), int(L[0]), int(self.g[0])))
            elif not self.use_cache:
                steps.append(self._padded(k))
            elif self.layout == "buckets":
                ragged.append((len(steps), k, L, self.g.copy()))
                steps.append(None)
            else:
                steps.append(self._packed(k, L))
            if self.use_cache:
                self.L[k > 0] = self.g[k > 0] + 1
            self.g += k
        if ragged:
            _, k, L, g = (np.stack(a) for a in zip(*ragged, strict=True))
            for (i, *_), step in zip(ragged, self._bucketed(k, L, g), strict=True):
                steps[i] = step
        return steps

    def _bucketed(self, k: np.ndarray, L: np.ndarray, g: np.ndarray) -> list[Step]:
        """Ragged steps (T', B) in the bucketed packed layout, planned together (`_packed`, vectorised)."""
        n, T = self.n, k.shape[0]
        sizes = np.where(k > 0, g - L + k, 0)
        layouts = ragged_steps(sizes, L, g, self.dtype, self.dev)
        b = np.concatenate([x[0] for x in layouts])
        col = np.concatenate([x[1] for x in layouts])
        R = sizes.sum(axis=1)
        step_of = np.repeat(np.arange(T), R)
        g_row = g[step_of, b]
        content = np.minimum(col, g_row)
        query = col >= g_row
        pos, tgt = self.pos.cpu().numpy(), self.tgt.cpu().numpy()
        gather = self._t(b * (n + 2) + content)
        pos_t, tgt_t = self._t(pos[b, content]), self._t(tgt[b, col])
        first_row = np.cumsum(R) - R
        qrows = np.flatnonzero(query)
        qstep = step_of[qrows]
        select = self._t(qrows - first_row[qstep])
        qb, qcol = b[qrows], col[qrows]
        dest, chain_at = self._t(qb * (n + 2) + qcol + 1), self._t(qb * n + qcol)
        Q = np.bincount(qstep, minlength=T)
        qfirst = np.cumsum(Q) - Q
        out = []
        gate = self._gate(b, content, pos_t, tgt_t)
        for t in range(T):
            r0, r1, q0, q1 = int(first_row[t]), int(first_row[t] + R[t]), int(qfirst[t]), int(qfirst[t] + Q[t])
            out.append(Step(gather[r0:r1][None], pos_t[r0:r1][None], tgt_t[r0:r1][None], layouts[t][2], None,
                            select[q0:q1][None], dest[q0:q1], chain_at[q0:q1], int(Q[t]), int(R[t]), 0,
                            draws=qb[q0:q1], gate=None if gate is None else gate[r0:r1][None]))
        return out

    def _uniform(self, k: int, L: int, g: int) -> Step:
        """Every sequence has the same rows: a (B, S) block from column L, no packing, no padding."""
        B, n = self.B, self.n
        S, c = g - L + k, g - L
        cols = np.arange(L, L + S)
        content = np.minimum(cols, g)
        b = np.arange(B)[:, None]
        cols_t = self._t(cols)
        select = None if c == 0 else self._t(c + np.arange(k)).expand(B, k)
        query = g + np.arange(k)
        where: int | torch.Tensor = L
        if self.static:  # fixed shapes for a compiled step: columns as a tensor, the mask over the whole cache
            where = cols_t.expand(B, S)
            mask = additive(step_mask(cols_t, g, n + 1)[None, None], self.dtype)
        else:
            mask = None if S == 1 else additive(step_mask(cols_t, g, L + S)[None, None], self.dtype)
        pos, tgt = self.pos[:, self._t(content)], self.tgt[:, cols_t]
        return Step(self._t(b * (n + 2) + content), pos, tgt, where, mask, select,
                    self._t(b * (n + 2) + query + 1).reshape(-1), self._t(b * n + query).reshape(-1),
                    B * k, B * S, 0, draws=np.repeat(np.arange(B), k),
                    gate=self._gate(np.broadcast_to(b, (B, S)), np.broadcast_to(content, (B, S)), pos, tgt))

    def _packed(self, k: np.ndarray, L: np.ndarray) -> Step:
        """Ragged counts: the real rows of all sequences in one row dimension, bucketed by width for
        attention (`aogpt.kv_cache.ragged_rows`): no padding anywhere."""
        n, g = self.n, self.g
        sizes = np.where(k > 0, g - L + k, 0)
        b, col, where, mask = step_rows(self.layout, sizes, L, g, self.dtype, self.dev)
        content = np.minimum(col, g[b])
        query = col >= g[b]
        b_t, col_t = self._t(b), self._t(col)
        qb, qcol = b[query], col[query]
        pos, tgt = self.pos[b_t, self._t(content)][None], self.tgt[b_t, col_t][None]
        return Step(self._t(b * (n + 2) + content)[None], pos, tgt, where, mask, self._t(np.nonzero(query)[0])[None],
                    self._t(qb * (n + 2) + qcol + 1), self._t(qb * n + qcol), int(query.sum()), len(b), 0, draws=qb,
                    gate=self._gate(b[None], content[None], pos, tgt))

    def _padded(self, k: np.ndarray) -> Step:
        """Ragged counts without a cache: every decided slot recomputed, sequences padded to (B, W)."""
        B, n, g = self.B, self.n, self.g
        sizes = np.where(k > 0, g + k, 0)
        W, Q = int(sizes.max()), int(k.max())
        cols = np.broadcast_to(np.arange(W), (B, W))
        content = np.minimum(cols, g[:, None])
        b = np.arange(B)[:, None]
        cols_t, g_t = self._t(cols), self._t(g)[:, None]
        mask = additive(step_mask(cols_t, g_t, W)[:, None], self.dtype)
        j = np.arange(Q)
        real = j < k[:, None]
        select = np.where(real, g[:, None] + j, 0)
        qb, qj = np.nonzero(real)
        qcol = g[qb] + qj
        pos, tgt = self.pos.gather(1, self._t(content)), self.tgt.gather(1, cols_t)
        return Step(self._t(b * (n + 2) + content), pos, tgt, 0, mask, self._t(select),
                    self._t(qb * (n + 2) + qcol + 1), self._t(qb * n + qcol), len(qb), int(sizes.sum()),
                    B * W - int(sizes.sum()), self._t(qb * Q + qj), draws=qb,
                    gate=self._gate(np.broadcast_to(b, (B, W)), content, pos, tgt))


def plan_steps(counts: np.ndarray, m: int, use_cache: bool, pos: torch.Tensor, tgt: torch.Tensor,
               dtype: torch.dtype = torch.float32, static: bool = False, layout: str = "buckets",
               run: torch.Tensor | None = None) -> list[Step]:
    """Every forward of a batch decoded with `counts` (B, T) revealed per step, `m` known tokens first
    (attention masks in `dtype`). Steps that reveal nothing run no forward (pending catch-ups wait).
    `static`: uniform steps get shapes that do not grow with the cache (for a compiled step).
    `layout`: how a ragged step's attention runs (`aogpt.kv_cache.LAYOUTS`). `run`: for a gated model
    (`aogpt.pathway`), the identity run of every chain order: each step then carries its slots' gates."""
    B, n = pos.shape[0], pos.shape[1] - 1
    return _Planner(B, n, m, use_cache, pos, tgt, dtype, static, layout, run).plan(counts)


def compiled(fn: Callable, how: bool | str, device: torch.device, dynamic: bool = True) -> Callable:
    """`fn` itself, or torch.compile'd: ``True`` is inductor (CUDA graphs with mode reduce-overhead on
    CUDA; kernels kept on disk across runs, `aogpt.compiling`); a string names a backend (``eager``
    captures the graph without generating code: what the tests use). `dynamic`: shapes symbolic (a
    growing cache does not recompile every step); False for steps whose shapes are fixed."""
    if not how:
        return fn
    if isinstance(how, str):
        return torch.compile(fn, backend=how, dynamic=dynamic)
    from aogpt.compiling import check_compiler, use_persistent_cache

    check_compiler(device)
    use_persistent_cache()
    return torch.compile(fn, mode="reduce-overhead" if device.type == "cuda" else None, dynamic=dynamic)


class DecoderSampler:
    """One batch of sequences decoded along fixed chain orders with a fixed per-step plan."""

    def __init__(self, model: torch.nn.Module, chain: torch.Tensor, known: torch.Tensor, plan: np.ndarray,
                 settings: GenerationSettings, teacher: torch.Tensor | None = None, record: bool = False):
        B, n = chain.shape
        dev = chain.device
        m = known.shape[-1]  # known (m,) shared by the batch, or (B, m) one row per sequence
        self.model, self.B, self.n, self.chain = model, B, n, chain
        self.teacher = None if teacher is None else teacher.reshape(-1)
        # content of chain slot i is ychain[:, i] (start = -1); column n + 1 is a write sink
        self.ychain = torch.full((B, n + 2), -1, dtype=torch.long, device=dev)
        self.ychain[:, 1:m + 1] = known
        pos = torch.cat([torch.zeros_like(chain[:, :1]), chain + 1], dim=1)
        tgt = torch.cat([chain, torch.full_like(chain[:, :1], model.config.block_size)], dim=1)
        use_cache = settings.use_cache
        static = bool(settings.compile) and use_cache
        self.cache = model.setup_cache(B, n + 1, settings.attention) if use_cache else None
        mask_dtype = self.cache.k.dtype if use_cache else next(model.parameters()).dtype  # what attention runs in
        run = identity_run(chain) if is_gated(model) else None
        self.steps = plan_steps(plan, m, use_cache, pos, tgt, mask_dtype, static, ragged_layout(model), run)
        # compiled: the uniform steps, whose shapes are fixed (`static`: full-cache masks, columns as
        # tensors); ragged Lemma 4.1 steps change shape every step and run eagerly
        self.forward = compiled(model.forward_slots, settings.compile, dev, dynamic=not static)
        self.eager = model.forward_slots if static else self.forward
        self.conditions = None if use_cache else model.conditions()  # adaLN tables, computed once
        self.logits: torch.Tensor | None = None
        if record:
            V = model.config.vocab_size
            self.logits = torch.full((B, n, V), float("nan"), device=dev, dtype=next(model.parameters()).dtype)
        self.forwards = len(self.steps)
        self.slots = sum(s.rows for s in self.steps)
        self.padded = sum(s.padded for s in self.steps)

    def decided(self) -> torch.Tensor:
        """Tokens by position (B, n) decided so far, -1 where still masked (`aogpt.generation.reveal`)."""
        y = self.ychain[:, 1:self.n + 1]
        return scatter_by_position(self.chain, y, y >= 0)

    def _uniforms(self, cfg: SamplingConfig, streams: SequenceStreams) -> list[torch.Tensor | None]:
        """Every step's token uniforms, drawn before the loop from each sequence's own stream (the
        plan says which sequence each drawn token belongs to, in chain order within a sequence)."""
        if self.teacher is not None or cfg.greedy:
            return [None] * len(self.steps)
        sizes = [len(s.draws) for s in self.steps]
        u = streams.uniforms(np.concatenate([s.draws for s in self.steps]) if sizes else np.empty(0, np.int64),
                             "tokens", cfg.dtype, self.chain.device)
        return list(u.reshape(-1, 1).split(sizes))

    def run(self, cfg: SamplingConfig, streams: SequenceStreams,
            progress: Callable[[int], None] | None) -> torch.Tensor:
        flat = self.ychain.view(-1)
        draws = self._uniforms(cfg, streams)
        for step, u in zip(self.steps, draws, strict=True):
            forward = self.eager if isinstance(step.cache_pos, (RaggedSlots, PackedSlots)) else self.forward
            logits = forward(flat[step.gather], step.pos, step.target, attn_mask=step.mask, cache=self.cache,
                             cache_pos=step.cache_pos, select=step.select, conditions=self.conditions,
                             **({} if step.gate is None else {"gate": step.gate}))
            logits = logits.reshape(-1, logits.shape[-1])
            if step.pick is not None:
                logits = logits[step.pick]
            if self.teacher is not None:
                new = self.teacher[step.chain_at]
            else:
                new = sample_tokens(logits, cfg, uniforms=u)
            flat[step.dest] = new
            if self.logits is not None:
                self.logits.view(-1, self.logits.shape[-1])[step.chain_at] = logits
            if progress is not None:
                progress(step.revealed)
        return self.ychain[:, 1:self.n + 1]
