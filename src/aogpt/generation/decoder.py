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

from aogpt.decode.graphs import mode as graph_mode
from aogpt.decode.graphs import static_state
from aogpt.decode.layouts import Static, padded_steps, ragged_layout, ragged_steps, run_steps
from aogpt.generation.reveal import scatter_by_position
from aogpt.generation.settings import GenerationSettings
from aogpt.generation.streams import SequenceStreams
from aogpt.kv_cache import PackedSlots, RaggedSlots, additive, step_mask
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
    positions, for teacher forcing and recorded logits; rows, padded: real and padding slots through
    the model (attention's own padding slots, in the runs and padded layouts, are not slots: they
    never reach a linear layer). Without a cache (the recompute baseline) ragged steps use a padded
    (B, S) layout instead of packing, and `pick` says which selected rows are real.
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


def _runs(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For runs of `sizes` entries laid end to end: each entry's run and its index within the run."""
    run = np.repeat(np.arange(len(sizes)), sizes)
    return run, np.arange(len(run)) - (np.cumsum(sizes) - sizes)[run]


def _additive(cols: np.ndarray, decided: np.ndarray, a: np.ndarray, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    """`aogpt.kv_cache.additive(step_mask(...))`, entry by entry: 0 where the row at cache column
    `cols` may attend to column `a` (the decided columns up to itself, and itself), else -inf."""
    allowed = ((a < decided) & (a <= cols)) | (a == cols)
    return torch.from_numpy(np.where(allowed, np.float32(0), np.float32(-np.inf))).to(device=device, dtype=dtype)


class _Planner:
    """Turns per-step counts into `Step`s, tracking each sequence's decided (g) and cached (L) slots."""

    def __init__(self, B: int, n: int, m: int, use_cache: bool, pos: torch.Tensor, tgt: torch.Tensor,
                 dtype: torch.dtype, static: bool = False, layout: str = "buckets", shapes: Static | None = None,
                 run: torch.Tensor | None = None):
        self.B, self.n, self.use_cache, self.pos, self.tgt, self.dtype = B, n, use_cache, pos, tgt, dtype
        self.run = run  # a gated model's: the identity run of every chain (`aogpt.orders.identity_run`)
        if run is not None and shapes is not None:
            raise ValueError("a gated model's steps are not planned in static shapes (aogpt.decode.graphs.mode)")
        self.layout = "padded" if shapes is not None else layout
        self.static = static and use_cache
        self.static_shapes = shapes if use_cache else None
        self.none = int(tgt[0, -1])  # the target of the last slot: none
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
        return step_gates(self.run, self._t(seq), self._t(read), pos, target.expand(pos.shape))

    def plan(self, counts: np.ndarray) -> list[Step]:
        """The `Step` of every step of `counts` (B, T) that reveals something. The index arithmetic of
        the uniform steps, and of the ragged steps in the layout of their attention
        (`aogpt.decode.layouts`), is done for all of them at once (`_uniforms`, `_packed`): built one
        by one, a one-sequence plan cost about as much as its forwards' own Python. With static shapes
        every step is laid out as a ragged one (padded, a bucket's shapes)."""
        if (counts == counts[:1]).all() and self.static_shapes is None:  # every step uniform (one sequence, count)
            k = counts[0][counts[0] > 0]
            g = self.g[0] + np.cumsum(k) - k  # decided before each step
            L = np.r_[self.L[0], g[:-1] + 1] if self.use_cache else np.zeros_like(g)  # cached before each step
            if self.use_cache and len(k):
                self.L[:] = g[-1] + 1
            self.g += counts.sum(axis=1)
            return self._uniforms(k, L, g)
        steps: list[Step | None] = []
        ragged: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
        uniform: list[tuple[int, int, int, int]] = []
        for i in range(counts.shape[1]):
            k = counts[:, i]
            if not k.any():
                continue
            L = self.L.copy() if self.use_cache else np.zeros_like(self.L)
            if (k == k[0]).all() and (L == L[0]).all() and (self.g == self.g[0]).all() and self.static_shapes is None:
                uniform.append((len(steps), int(k[0]), int(L[0]), int(self.g[0])))
                steps.append(None)
            elif not self.use_cache:
                steps.append(self._padded(k))
            else:
                ragged.append((len(steps), k, L, self.g.copy()))
                steps.append(None)
            if self.use_cache:
                self.L[k > 0] = self.g[k > 0] + 1
            self.g += k
        if ragged:
            _, k, L, g = (np.stack(a) for a in zip(*ragged, strict=True))
            for (i, *_), step in zip(ragged, self._packed(k, L, g), strict=True):
                steps[i] = step
        if uniform:
            index, k, L, g = (np.array(a, dtype=np.int64) for a in zip(*uniform, strict=True))
            for i, step in zip(index, self._uniforms(k, L, g), strict=True):
                steps[i] = step
        return steps

    def _packed(self, k: np.ndarray, L: np.ndarray, g: np.ndarray) -> list[Step]:
        """Ragged steps (T', B), planned together: the real rows of all sequences in one row
        dimension (the linear layers do exactly the real work), laid out for attention by width
        (``buckets``), by run of the sequences taking part (``runs``) or padded to the widest sequence
        (``padded``; with `static` shapes, a bucket's: `aogpt.decode.layouts`)."""
        n, T = self.n, k.shape[0]
        sizes = np.where(k > 0, g - L + k, 0)
        if self.layout == "padded":
            layouts = padded_steps(sizes, L, g, self.dev, self.static_shapes)
        else:
            layouts = (run_steps if self.layout == "runs" else ragged_steps)(sizes, L, g, self.dtype, self.dev)
        b = np.concatenate([x[0] for x in layouts])
        col = np.concatenate([x[1] for x in layouts])
        R = sizes.sum(axis=1)
        step_of = np.repeat(np.arange(T), R)
        g_row = g[step_of, b]
        content = np.minimum(col, g_row)
        query = col >= g_row
        pos, tgt = self.pos.cpu().numpy(), self.tgt.cpu().numpy()
        gather = b * (n + 2) + content
        pos_r, tgt_r = pos[b, content], tgt[b, col]
        first_row = np.cumsum(R) - R
        qrows = np.flatnonzero(query)
        qstep = step_of[qrows]
        select = qrows - first_row[qstep]
        qb, qcol = b[qrows], col[qrows]
        dest, chain_at = self._t(qb * (n + 2) + qcol + 1), self._t(qb * n + qcol)
        Q = np.bincount(qstep, minlength=T)
        qfirst = np.cumsum(Q) - Q
        gate = self._gate(b, content, self._t(pos_r), self._t(tgt_r))  # every step's rows at once
        out = []
        for t in range(T):
            r0, r1, q0, q1 = int(first_row[t]), int(first_row[t] + R[t]), int(qfirst[t]), int(qfirst[t] + Q[t])
            rows = [gather[r0:r1], pos_r[r0:r1], tgt_r[r0:r1], select[q0:q1]]
            if self.static_shapes is not None:  # padding rows: no content, position 0, no target
                extra, more = len(layouts[t][2].batch) - (r1 - r0), int(self.static_shapes.rows(Q[t])) - (q1 - q0)
                rows = [np.r_[rows[0], np.full(extra, n + 1)], np.r_[rows[1], np.zeros(extra, np.int64)],
                        np.r_[rows[2], np.full(extra, self.none)], np.r_[rows[3], np.zeros(more, np.int64)]]
            gather_t, pos_t, tgt_t, select_t = (self._t(a)[None] for a in rows)
            where = layouts[t][2]
            padded = len(rows[0]) - int(R[t])  # padding rows through the model: static shapes' only
            out.append(Step(gather_t, pos_t, tgt_t, where, None, select_t, dest[q0:q1], chain_at[q0:q1],
                            int(Q[t]), int(R[t]), padded, draws=qb[q0:q1],
                            gate=None if gate is None else gate[r0:r1][None]))
        return out

    def _uniforms(self, k: np.ndarray, L: np.ndarray, g: np.ndarray) -> list[Step]:
        """Uniform steps (U,): every sequence has the same rows, a (B, S) block from column L (no
        packing, no padding), S = g - L + k: the catch-ups L .. g - 1, then k queries. Their indices
        are computed for all U steps at once, and each step's tensors are views of them."""
        B, n, U = self.B, self.n, len(k)
        S, span = g - L + k, g + k
        if U == 0:
            return []
        step, j = _runs(S)  # every step's columns, step after step: (B, sum S)
        cols = L[step] + j
        content = np.minimum(cols, g[step])
        b = np.arange(B)[:, None]
        content_t, cols_t = self._t(content), self._t(cols)
        gather = self._t(b * (n + 2) + content).split(S.tolist(), dim=1)
        pos_all, tgt_all = self.pos[:, content_t], self.tgt[:, cols_t]
        pos, target = pos_all.split(S.tolist(), dim=1), tgt_all.split(S.tolist(), dim=1)
        gate = self._gate(np.broadcast_to(b, pos_all.shape), content, pos_all, tgt_all)
        gates = [None] * U if gate is None else gate.split(S.tolist(), dim=1)
        qstep, qw = _runs(B * k)  # every step's B * k queries, sequence-major: chain positions g .. g + k - 1
        qb = qw // k[qstep]
        query = g[qstep] + qw % k[qstep]
        sizes = (B * k).tolist()
        dest, chain_at = self._t(qb * (n + 2) + query + 1).split(sizes), self._t(qb * n + query).split(sizes)
        draws = np.split(qb, np.cumsum(B * k)[:-1])
        if self.static:  # fixed shapes for a compiled step: columns as a tensor, the mask over the whole cache
            width = np.full(U, n + 1)
        else:  # no mask for a single row (a query sees the decided columns and itself: all of them)
            width = np.where(S > 1, span, 0)
        mstep, mw = _runs(S * width)
        masks = _additive(L[mstep] + mw // width[mstep], g[mstep], mw % width[mstep], self.dtype,
                          self.dev).split((S * width).tolist())
        arange = torch.arange(int(S.max()), device=self.dev)
        out = []
        for u in range(U):
            Su, c, ku = int(S[u]), int(S[u] - k[u]), int(k[u])
            where: int | torch.Tensor = (arange[:Su] + int(L[u])).expand(B, Su) if self.static else int(L[u])
            mask = masks[u].view(1, 1, Su, int(width[u])) if width[u] else None
            select = None if c == 0 else arange[c:c + ku].expand(B, ku)
            out.append(Step(gather[u], pos[u], target[u], where, mask, select, dest[u], chain_at[u], B * ku, B * Su,
                            0, draws=draws[u], gate=gates[u]))
        return out

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
               shapes: Static | None = None, run: torch.Tensor | None = None) -> list[Step]:
    """Every forward of a batch decoded with `counts` (B, T) revealed per step, `m` known tokens first
    (attention masks in `dtype`). Steps that reveal nothing run no forward (pending catch-ups wait).
    `static`: uniform steps get shapes that do not grow with the cache (for a compiled step).
    `layout`: how a ragged step's attention runs (`aogpt.decode.layouts.LAYOUTS`). `shapes`: every
    step padded, in static shapes (for a step captured per shape, `aogpt.decode.graphs`). `run`: for a
    gated model (`aogpt.pathway`), the identity run of every chain order: each step then carries its
    slots' gates."""
    B, n = pos.shape[0], pos.shape[1] - 1
    return _Planner(B, n, m, use_cache, pos, tgt, dtype, static, layout, shapes, run).plan(counts)


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
        # a stand-in model may draw the tokens itself (the serving engine draws a step's tokens of all
        # its requests in one call, row for row what `sample_tokens` draws for each: `aogpt.serve.engine`)
        self.draw = getattr(model, "draw_tokens", sample_tokens)
        self.teacher = None if teacher is None else teacher.reshape(-1)
        pos = torch.cat([torch.zeros_like(chain[:, :1]), chain + 1], dim=1)
        tgt = torch.cat([chain, torch.full_like(chain[:, :1], model.config.block_size)], dim=1)
        use_cache = settings.use_cache
        static = bool(settings.compile) and use_cache
        gated = is_gated(model)
        graphs = graph_mode(settings.graphs, dev, use_cache, settings.path() != "fast", gated) \
            if isinstance(model, torch.nn.Module) else None  # a stand-in (the server's) batches steps: never captured
        self.state = static_state(model, B, n, settings.attention, graphs == "capture") if graphs else None
        if self.state is not None:  # captured steps: static cache (a sink sequence B for padding rows) and contents
            self.state.busy = True
            self.cache, self.ychain, self.captured = self.state.cache, self.state.tokens, self.state.runner
            self.ychain.fill_(-1)
        else:
            self.cache = model.setup_cache(B, n + 1, settings.attention) if use_cache else None
            self.ychain = torch.full((B, n + 2), -1, dtype=torch.long, device=dev)
            self.captured = None
        # content of chain slot i is ychain[:, i] (start = -1); column n + 1 is a write sink
        self.ychain[:, 1:m + 1] = known
        self.mask_dtype = mask_dtype = self.cache.k.dtype if use_cache else next(model.parameters()).dtype
        shapes = Static(B, n + 1) if graphs else None
        run = identity_run(chain) if gated else None
        self.steps = plan_steps(plan, m, use_cache, pos, tgt, mask_dtype, static, ragged_layout(model), shapes, run)
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

    def _forward(self, flat: torch.Tensor, step: Step) -> torch.Tensor:
        """One planned step through the model (compiled where its shapes are fixed)."""
        forward = self.eager if isinstance(step.cache_pos, (RaggedSlots, PackedSlots)) else self.forward
        mask = step.mask
        if mask is None and isinstance(step.cache_pos, PackedSlots):  # the padded layout's, built per step
            mask = step.cache_pos.mask(self.mask_dtype)
        return forward(flat[step.gather], step.pos, step.target, attn_mask=mask, cache=self.cache,
                       cache_pos=step.cache_pos, select=step.select, conditions=self.conditions,
                       **({} if step.gate is None else {"gate": step.gate}))

    def run(self, cfg: SamplingConfig, streams: SequenceStreams,
            progress: Callable[[int], None] | None) -> torch.Tensor:
        try:
            return self._run(cfg, streams, progress)
        finally:
            if self.state is not None:
                self.state.busy = False

    def _run(self, cfg: SamplingConfig, streams: SequenceStreams,
             progress: Callable[[int], None] | None) -> torch.Tensor:
        flat = self.ychain.view(-1)
        draws = self._uniforms(cfg, streams)
        for step, u in zip(self.steps, draws, strict=True):
            if self.captured is not None:  # static shapes: the real selected rows first
                logits = self.captured(step)
                logits = logits.reshape(-1, logits.shape[-1])[:step.revealed]
            else:
                logits = self._forward(flat, step)
                logits = logits.reshape(-1, logits.shape[-1])
            if step.pick is not None:
                logits = logits[step.pick]
            if self.teacher is not None:
                new = self.teacher[step.chain_at]
            else:
                new = self.draw(logits, cfg, uniforms=u)
            flat[step.dest] = new
            if self.logits is not None:
                self.logits.view(-1, self.logits.shape[-1])[step.chain_at] = logits
            if progress is not None:
                progress(step.revealed)
        return self.ychain[:, 1:self.n + 1].clone() if self.state is not None else self.ychain[:, 1:self.n + 1]
