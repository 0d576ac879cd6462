"""How a ragged decode step's rows are laid out for attention: planned on the host, before the loop.

A Lemma 4.1 step gives every sequence its own number of rows (catch-ups and queries; none when it
sits the step out). The linear layers run on the packed rows (input (1, R): exactly the real rows);
attention needs each row beside its own sequence's cache, in one of two layouts (`LAYOUTS`):

- ``buckets`` (`ragged_steps`, `aogpt.kv_cache.RaggedSlots`): the rows ordered by width and, within
  a width, by sequence; one attention call per run of consecutive sequences of one width, on views of
  the cache, with no padding row anywhere (several calls per layer);
- ``padded`` (`padded_steps`, `aogpt.kv_cache.PackedSlots`): the rows sequence-major, their queries
  scattered into a (B, width) layout for one attention call per layer, padding slots attending to
  column 0 only and dropped after. With `Static` shapes (a CUDA graph per bucket, `aogpt.decode.graphs`)
  the rows, the width and the selected rows are padded up to powers of two and attention covers the
  whole cache, so a step's shapes come from a small set; the padding rows belong to a sink sequence
  (cache row B) that no real row ever sees.

Both are exact: a row attends to its own sequence's columns under the same mask either way; only which
other rows share its attention call differs, and attention never mixes rows. Which layout is faster
depends on the device, the dtype and the shape: `aogpt.decode.choice` measures it. Every step of a
decoder's plan is laid out at once, with a few numpy operations over all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from aogpt.kv_cache import Bucket, PackedSlots, RaggedSlots

LAYOUTS = ("buckets", "runs", "padded")  # a ragged step's attention (module docstring)


MAX_VIEW_RUNS = 8  # up to this many runs (at least: twice the widths), views of the cache beat gathered copies


def additive_rows(cols: np.ndarray, decided: np.ndarray, span: int, dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
    """`additive(step_mask(...))` built in numpy, for rows at cache columns `cols` (any shape) whose
    sequences have `decided` (same shape) decided columns: (..., span), 0 where a row may attend."""
    a = np.arange(span)
    c, g = cols[..., None], decided[..., None]
    allowed = ((a < g) & (a <= c)) | (a == c)
    bias = np.where(allowed, np.float32(0), np.float32(-np.inf))
    return torch.from_numpy(bias).to(device=device, dtype=dtype)


def ragged_rows(sizes: np.ndarray, first: np.ndarray, decided: np.ndarray, dtype: torch.dtype,
                device: torch.device) -> tuple[np.ndarray, np.ndarray, RaggedSlots]:
    """The packed rows of a ragged step, bucketed by width: sequence b has `sizes[b]` rows (0: it sits
    the step out) at cache columns first[b] .. first[b] + sizes[b] - 1, and `decided[b]` decided
    columns that its rows may see (`step_mask`). Returns the rows' sequences and columns (numpy, in
    packed order) and the `RaggedSlots` for the forward (`ragged_steps` for one step)."""
    return ragged_steps(sizes[None], first[None], decided[None], dtype, device)[0]


MASK_CHUNK = 1 << 24  # mask elements built at once while planning ragged steps (64 MiB of float32)


def ragged_steps(sizes: np.ndarray, first: np.ndarray, decided: np.ndarray, dtype: torch.dtype,
                 device: torch.device) -> list[tuple[np.ndarray, np.ndarray, RaggedSlots]]:
    """`ragged_rows` for several steps at once, (T, B) arrays: a decode loop plans all its steps
    before the first forward, so the index arithmetic, the buckets and the masks of every step are
    built with a few numpy operations over all of them (per step, only the `Bucket` objects remain)."""
    T, B = sizes.shape
    order = np.argsort(sizes * (B + 1) + np.arange(B), axis=1, kind="stable")  # by width, then by index
    width = np.take_along_axis(sizes, order, axis=1)
    rows_per_step = width.sum(axis=1)
    row0 = np.cumsum(rows_per_step) - rows_per_step
    flat_w, flat_s = width.ravel(), order.ravel()
    flat_t = np.repeat(np.arange(T), B)
    step_of = np.repeat(flat_t, flat_w)
    b_all = np.repeat(flat_s, flat_w)
    within = np.arange(len(b_all)) - np.repeat(np.cumsum(flat_w) - flat_w, flat_w)
    col_all = first[step_of, b_all] + within
    # buckets: runs of consecutive sequences of one width within a step (their cache is a view: a
    # slice of the batch, never a gathered copy, which per layer costs more than the extra calls)
    on = flat_w > 0
    t_on, s_on, w_on = flat_t[on], flat_s[on], flat_w[on]
    new = np.r_[True, (t_on[1:] != t_on[:-1]) | (w_on[1:] != w_on[:-1]) | (s_on[1:] != s_on[:-1] + 1)]
    runs_per_step = np.bincount(t_on[new], minlength=T)
    widths_per_step = np.array([len(np.unique(w_on[t_on == t])) for t in range(T)]) if \
        (runs_per_step > MAX_VIEW_RUNS).any() else np.zeros(T, dtype=np.int64)
    gathered = runs_per_step > np.maximum(MAX_VIEW_RUNS, 2 * widths_per_step)
    # a large batch (a sampler's law test, a server's full batch): runs of consecutive sequences would be
    # nearly one attention call per sequence; one call per width there, its keys gathered
    new_g = np.r_[True, (t_on[1:] != t_on[:-1]) | (w_on[1:] != w_on[:-1])]
    new = np.where(gathered[t_on], new_g, new)
    starts = np.flatnonzero(new)
    count = np.diff(np.r_[starts, len(t_on)])
    bucket_t, bucket_w = t_on[starts], w_on[starts]
    bucket_lo, bucket_hi = s_on[starts], s_on[starts + count - 1]
    rows_before = np.cumsum(count * bucket_w) - count * bucket_w
    bucket_row = rows_before - row0[bucket_t]  # first row within its step
    span = np.maximum.reduceat(first[t_on, s_on], starts) + bucket_w
    b_t = torch.from_numpy(b_all.astype(np.int64)).to(device)
    col_t = torch.from_numpy(col_all.astype(np.int64)).to(device)
    masks = _chunked_masks(col_all, decided[step_of, b_all], step_of, row0, rows_per_step, dtype, device)
    buckets: list[list[Bucket]] = [[] for _ in range(T)]
    for i in range(len(starts)):
        t, c, w, lo, hi = int(bucket_t[i]), int(count[i]), int(bucket_w[i]), int(bucket_lo[i]), int(bucket_hi[i])
        at, sp = int(bucket_row[i]), int(span[i])
        which = slice(lo, hi + 1) if hi - lo + 1 == c else \
            torch.from_numpy(s_on[starts[i]:starts[i] + c].astype(np.int64)).to(device)
        mask = masks[t][at:at + c * w, :, :sp].unflatten(0, (c, w)).transpose(1, 2)
        buckets[t].append(Bucket(at, c, w, which, mask))
    out = []
    for t in range(T):
        r0, r1 = int(row0[t]), int(row0[t] + rows_per_step[t])
        out.append((b_all[r0:r1], col_all[r0:r1], RaggedSlots(b_t[r0:r1], col_t[r0:r1], buckets[t])))
    return out


def run_steps(sizes: np.ndarray, first: np.ndarray, decided: np.ndarray, dtype: torch.dtype,
              device: torch.device) -> list[tuple[np.ndarray, np.ndarray, RaggedSlots]]:
    """The ``runs`` layout of ragged steps (T, B) (arguments as `padded_steps`): the rows
    sequence-major, attention once per run of consecutive sequences that take part in the step,
    each run padded to its widest sequence (a padding slot sees column 0 only). A sequence sitting
    the step out costs nothing, and a step makes a few calls, not one per width."""
    T, B = sizes.shape
    flat = sizes.ravel()
    step_of = np.repeat(np.repeat(np.arange(T), B), flat)
    b = np.repeat(np.tile(np.arange(B), T), flat)
    within = np.arange(len(b)) - np.repeat(np.cumsum(flat) - flat, flat)
    col = first[step_of, b] + within
    R = sizes.sum(axis=1)
    row0 = np.cumsum(R) - R
    on = sizes > 0
    starts_run = on & ~np.c_[np.zeros((T, 1), dtype=bool), on[:, :-1]]  # a sequence opening a run
    run_id = np.cumsum(starts_run.ravel()).reshape(T, B) - 1  # global run index (valid where on)
    n_runs = int(starts_run.sum())
    run_t = np.repeat(np.arange(T), starts_run.sum(axis=1))
    width = np.zeros(n_runs, dtype=np.int64)
    np.maximum.at(width, run_id[on], sizes[on])
    count = np.bincount(run_id[on], minlength=n_runs)
    lo = np.nonzero(starts_run)[1]
    slots_run = count * width
    slots_t = np.bincount(run_t, weights=slots_run, minlength=T).astype(np.int64)
    run_start = np.cumsum(slots_run) - slots_run - (np.cumsum(slots_t) - slots_t)[run_t]  # slot offset in its step
    # every slot: its sequence, column and decided columns (padding: 0 and 0, column 0 only)
    slot_t = np.repeat(run_t, slots_run)
    slot_in_run = np.arange(slot_t.size) - np.repeat(np.cumsum(slots_run) - slots_run, slots_run)
    slot_seq = np.repeat(lo, slots_run) + slot_in_run // np.repeat(width, slots_run)
    slot_s = slot_in_run % np.repeat(width, slots_run)
    real = slot_s < sizes[slot_t, slot_seq]
    slot_col = np.where(real, first[slot_t, slot_seq] + slot_s, 0)
    slot_dec = np.where(real, decided[slot_t, slot_seq], 0)
    slot0 = np.cumsum(slots_t) - slots_t
    masks = _chunked_masks(slot_col, slot_dec, slot_t, slot0, slots_t, dtype, device)
    rid = run_id[step_of, b]
    pad = run_start[rid] + (b - lo[rid]) * width[rid] + within
    span = np.zeros(n_runs, dtype=np.int64)
    np.maximum.at(span, rid, col + 1)
    buckets: list[list[Bucket]] = [[] for _ in range(T)]
    for i in range(n_runs):
        t, c, w, at, sp = int(run_t[i]), int(count[i]), int(width[i]), int(run_start[i]), int(span[i])
        mask = masks[t][at:at + c * w, :, :sp].unflatten(0, (c, w)).transpose(1, 2)
        buckets[t].append(Bucket(at, c, w, slice(int(lo[i]), int(lo[i]) + c), mask))
    b_t, col_t, pad_t = (torch.from_numpy(a.astype(np.int64)).to(device) for a in (b, col, pad))
    out = []
    for t in range(T):
        r0, r1 = int(row0[t]), int(row0[t] + R[t])
        out.append((b[r0:r1], col[r0:r1], RaggedSlots(b_t[r0:r1], col_t[r0:r1], buckets[t], pad_t[r0:r1],
                                                      int(slots_t[t]))))
    return out


def _chunked_masks(col: np.ndarray, decided: np.ndarray, step_of: np.ndarray, row0: np.ndarray,
                   rows_per_step: np.ndarray, dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """Every step's additive mask rows (R_t, 1, span_t), built in chunks of steps of at most
    `MASK_CHUNK` elements (`additive_rows` over the chunk's widest span)."""
    T = len(rows_per_step)
    span_t = np.zeros(T, dtype=np.int64)
    np.maximum.at(span_t, step_of, col + 1)
    out: list[torch.Tensor] = []
    t = 0
    while t < T:
        end, widest = t + 1, int(span_t[t])
        while end < T and int(rows_per_step[t:end + 1].sum()) * max(widest, int(span_t[end])) <= MASK_CHUNK:
            widest = max(widest, int(span_t[end]))
            end += 1
        r0, r1 = int(row0[t]), int(row0[end - 1] + rows_per_step[end - 1])
        chunk = additive_rows(col[r0:r1], decided[r0:r1], widest, dtype, device)[:, None]
        for u in range(t, end):
            a = int(row0[u]) - r0
            out.append(chunk[a:a + int(rows_per_step[u]), :, :int(span_t[u])])
        t = end
    return out


def bucket(x: np.ndarray | int, floor: int = 1) -> np.ndarray:
    """The static size for `x` rows (or widths, or selected rows): the next power of two, at least
    `floor`'s."""
    return 1 << np.ceil(np.log2(np.maximum(np.asarray(x), floor))).astype(np.int64)


@dataclass(frozen=True)
class Static:
    """Static shapes for padded steps (a captured step per bucket): the cache has `batch` + 1 rows (the
    last a sink for padding rows) and `capacity` columns, all of which attention covers. A step's rows
    and selected rows are padded to at least the batch's power of two (a GPU's products cost about
    the same for a few more rows, and every shape is one more graph)."""

    batch: int
    capacity: int

    def rows(self, x: np.ndarray | int) -> np.ndarray:
        return bucket(x, self.batch)


def padded_steps(sizes: np.ndarray, first: np.ndarray, decided: np.ndarray, device: torch.device,
                 static: Static | None = None) -> list[tuple[np.ndarray, np.ndarray, PackedSlots]]:
    """The packed rows of ragged steps (T, B) in the padded layout (module docstring): step t gives
    sequence b `sizes[t, b]` rows (0: it sits the step out) at cache columns first[t, b] ..
    first[t, b] + sizes[t, b] - 1, which see the columns before `decided[t, b]` up to themselves and
    themselves (`aogpt.kv_cache.step_mask`). Per step: the rows' sequences and columns (numpy,
    sequence-major; with `static`, the real rows only) and the `PackedSlots` (its mask: `PackedSlots.mask`)."""
    T, B = sizes.shape
    W = sizes.max(axis=1)
    R = sizes.sum(axis=1)
    flat = sizes.ravel()
    step_of = np.repeat(np.repeat(np.arange(T), B), flat)
    b = np.repeat(np.tile(np.arange(B), T), flat)
    within = np.arange(len(b)) - np.repeat(np.cumsum(flat) - flat, flat)
    col = first[step_of, b] + within
    width = W if static is None else bucket(W)
    pad = b * width[step_of] + within
    span = np.zeros(T, dtype=np.int64)
    np.maximum.at(span, step_of, col + 1)
    row0 = np.cumsum(R) - R
    out = []
    for t in range(T):
        r0, r1 = int(row0[t]), int(row0[t] + R[t])
        w = int(width[t])
        real = np.arange(w) < sizes[t][:, None]
        cols = np.where(real, first[t][:, None] + np.arange(w), 0)  # a padding slot: column 0, seeing column 0 only
        limit = np.where(real, np.minimum(decided[t][:, None], cols + 1), 0)
        bt, ct, pt = b[r0:r1], col[r0:r1], pad[r0:r1]
        sp = int(span[t])
        if static is not None:  # padding rows: the sink sequence B, its own columns and slots
            extra = int(static.rows(R[t])) - (r1 - r0)
            j = np.arange(extra)
            bt = np.r_[bt, np.full(extra, B)]
            ct = np.r_[ct, j % static.capacity]
            pt = np.r_[pt, B * w + j % w]
            cols, limit = np.r_[cols, np.zeros((1, w), np.int64)], np.r_[limit, np.zeros((1, w), np.int64)]
            sp = static.capacity
        where = PackedSlots(_tensor(bt, device), _tensor(ct, device), _tensor(pt, device), w,
                            _tensor(cols, device), _tensor(limit, device), sp)
        out.append((b[r0:r1], col[r0:r1], where))
    return out


def _tensor(a: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)


def padded_rows(sizes: np.ndarray, first: np.ndarray, decided: np.ndarray, dtype: torch.dtype,
                device: torch.device) -> tuple[np.ndarray, np.ndarray, PackedSlots, torch.Tensor]:
    """`padded_steps` for one step (`sizes`, `first`, `decided`: (B,)), with its additive mask
    (B, 1, width, span) in `dtype`."""
    b, col, where = padded_steps(sizes[None], first[None], decided[None], device)[0]
    return b, col, where, where.mask(dtype)


def ragged_layout(model: object, default: str = "buckets") -> str:
    """The layout a model wants for ragged steps (its ``kernels.ragged``, which the fast decode path
    measures); unset (the reference path), each sampler keeps its own (`default`)."""
    kernels = getattr(model, "kernels", None)
    return getattr(kernels, "ragged", None) or default


def step_rows(layout: str, sizes: np.ndarray, first: np.ndarray, decided: np.ndarray, dtype: torch.dtype,
              device: torch.device) -> tuple[np.ndarray, np.ndarray, RaggedSlots | PackedSlots, torch.Tensor | None]:
    """A ragged step's packed rows in `layout` (`ragged_rows` or `padded_rows`): their sequences and
    columns (numpy, in packed order), where their keys go, and the step's mask (None for buckets,
    which carry their own)."""
    if layout == "padded":
        return padded_rows(sizes, first, decided, dtype, device)
    steps = run_steps if layout == "runs" else ragged_steps
    b, col, where = steps(sizes[None], first[None], decided[None], dtype, device)[0]
    return b, col, where, None


def sequence_major(b: np.ndarray, col: np.ndarray) -> np.ndarray | None:
    """The packed rows (sequences `b`, columns `col`) in sequence-major order, sequence by sequence and
    columns ascending, as indices into the packed order; None when they already are."""
    order = np.lexsort((col, b))
    return None if (order == np.arange(len(order))).all() else order
