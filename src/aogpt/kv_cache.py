"""The static KV cache for generation, and the inference tables it is set up with.

`Transformer.setup_cache(batch, capacity)` allocates one key and one value buffer per layer,
(batch, heads, capacity, head_dim), once per generation (gpt-fast style): nothing is concatenated
or copied as the cache grows. Column c holds the keys of chain slot c (docs/design.md, "The KV
cache").

Each forward says where its new keys go (`cache_pos`, gpt-fast's ``input_pos``): an int start
column shared by the batch (this forward's S slots go to columns start .. start + S - 1), a
LongTensor (B, S) of columns per sequence, or `PackedSlots` for a ragged step (below). Attention
then reads the leading `span` columns: those its attention mask covers, or start + S when there is
no mask. The cache keeps no cursor of its own, so a forward never depends on what an earlier
caller set.

Ragged steps (Lemma 4.1: sequences reveal different numbers of positions) are *packed*: the step's
R real slots of all sequences form one row dimension (input (1, R)), so every linear layer works
on exactly the real slots. Attention needs a per-sequence layout, in one of two forms:

- `RaggedSlots` (the decoder's Lemma 4.1 steps): the packed rows are ordered by *width* (how many
  rows the sequence has this step), sequence-major inside a width. The rows of the nb sequences of
  width w are then contiguous, and a run of consecutive sequences among them is (nb, H, w, D) by
  a reshape over a slice of the cache: one attention call per such run (a `Bucket`), with no
  padding row anywhere and no copy of the cache.
- `PackedSlots` (the adaptive and speculative samplers): the queries are scattered into (B, S)
  (S = the most rows any sequence has), attend under the step's mask (B, 1, S, span), and are
  gathered back; padding rows attend to column 0 and are dropped.

Both are exact: a row attends to its own sequence's columns under the same mask either way; only
which other rows share its attention call differs, and attention never mixes rows.

AO-GPT's adaLN modulation depends on the target position only: at setup the per-position rows of
every block (and of the final layer) are computed once from the current weights and kept here
(`conditions`), so a decode step looks them up instead of recomputing them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from aogpt.attention import KERNELS, attend_few, choose_kernel


@dataclass
class Conditions:
    """Per-position adaLN rows computed from fixed weights: blocks[i] (P + 1, 6d) for block i,
    final (P + 1, 2d); row P is the "no target" sentinel. `table` (P + 1, layers * 6d): the blocks'
    rows side by side (`blocks` are its column slices), looked up once per step for every block."""

    blocks: list[torch.Tensor]
    final: torch.Tensor
    table: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.table is None:
            self.table = torch.cat(self.blocks, dim=1)


ATTENTION = KERNELS  # the kernels a decode step may use (`aogpt.attention`)


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask as the additive one attention uses (0 where allowed, -inf elsewhere),
    converted once when the step is planned rather than in every layer."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def step_mask(cols: torch.Tensor, decided: int | torch.Tensor, span: int) -> torch.Tensor:
    """Who a step's rows may attend to: the row at cache column `col` sees the decided columns
    c < decided up to itself (catch-ups are causal) and itself (a query sees no other query).
    cols (..., S), decided an int or (..., 1) -> bool (..., S, span)."""
    a = torch.arange(span, device=cols.device)
    col = cols[..., None]
    decided = decided[..., None] if isinstance(decided, torch.Tensor) else decided
    return ((a < decided) & (a <= col)) | (a == col)


@dataclass
class PackedSlots:
    """Where the rows of a packed forward go: row r belongs to sequence `batch[r]`, writes its keys
    at cache column `column[r]`, and sits at `pad[r]` = b * width + s of the (B, width) layout that
    attention runs in."""

    batch: torch.Tensor
    column: torch.Tensor
    pad: torch.Tensor
    width: int


@dataclass
class Bucket:
    """The `count` sequences of one width in a `RaggedSlots` step: their rows are the packed rows
    start .. start + count * width - 1 (sequence-major). seqs: the sequences (cache batch rows),
    consecutive, as a slice (their cache is a view); mask: additive (count, 1, width, span) over
    the first `span` cache columns."""

    start: int
    count: int
    width: int
    seqs: slice | torch.Tensor  # a view of the batch, or (large batches) the gathered sequences
    mask: torch.Tensor


@dataclass
class RaggedSlots:
    """Where the rows of a packed forward go, bucketed by width (module docstring): row r belongs to
    sequence `batch[r]` and writes its keys at cache column `column[r]`."""

    batch: torch.Tensor
    column: torch.Tensor
    buckets: list[Bucket]


def storage_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype a cache keeps keys and values in for a model computing in `dtype`: float32 on the
    CPU for bf16/fp16 models, else `dtype`. A decode step's attention is a few rows against the
    whole cache, where the CPU's half-precision kernels are slow (SDPA's is 4-6x slower than in
    float32 at these shapes, and the explicit path copies the cache slice to feed bf16 matrix
    products); in float32 the step's new keys are converted once (exactly: bf16 -> fp32 loses
    nothing), the attention reads the cache as it is, and only its small output is cast back."""
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return dtype


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


def padded_rows(sizes: np.ndarray, first: np.ndarray, decided: np.ndarray, dtype: torch.dtype,
                device: torch.device) -> tuple[np.ndarray, np.ndarray, PackedSlots, torch.Tensor]:
    """The packed rows of a ragged step in one attention call: sequence b's `sizes[b]` rows (0: it sits
    the step out) at cache columns first[b] .. first[b] + sizes[b] - 1, sequence-major, attend in the
    padded (B, width) layout under the returned additive mask (B, 1, width, span) over the first span
    cache columns (`step_mask` with `decided`); a padding row sees column 0 only and is dropped.
    Returns the rows' sequences and columns (numpy), the `PackedSlots` and the mask."""
    B = len(sizes)
    R, W = int(sizes.sum()), int(sizes.max())
    b = np.repeat(np.arange(B), sizes)
    s = np.arange(R) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    col = first[b] + s
    span = int(col.max()) + 1

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)

    cols = first[:, None] + np.arange(W)
    padding = np.arange(W) >= sizes[:, None]  # a padding row sees column 0 only
    mask = additive_rows(np.where(padding, 0, cols), np.where(padding, 0, decided[:, None]), span, dtype, device)
    return b, col, PackedSlots(t(b), t(col), t(b * W + s), W), mask[:, None]


LAYOUTS = ("buckets", "padded")  # a ragged step's attention: one call per run of a width, or one padded call


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
    b, col, where = ragged_rows(sizes, first, decided, dtype, device)
    return b, col, where, None


def sequence_major(b: np.ndarray, col: np.ndarray) -> np.ndarray | None:
    """The packed rows (sequences `b`, columns `col`) in sequence-major order, sequence by sequence and
    columns ascending, as indices into the packed order; None when they already are."""
    order = np.lexsort((col, b))
    return None if (order == np.arange(len(order))).all() else order


class KVCache:
    """Static key/value buffers for every layer, plus the inference tables of the weights they were
    set up from. Keys and values of a layer are one buffer (2, B, H, capacity, D), so a step writes
    both with one copy (`attend_rows`); `k` and `v` are its two halves, (layers, B, H, capacity, D).

    `kernel` is the few-query attention kernel of `attend_rows` (`aogpt.attention.CACHE_KERNELS`),
    `store` the dtype keys are kept in (default `storage_dtype`); `cache_settings` turns a
    generation's ``attention`` setting into both."""

    def __init__(self, n_layer: int, batch: int, n_head: int, capacity: int, head_dim: int,
                 device: torch.device | str, dtype: torch.dtype, conditions: Conditions | None = None,
                 kernel: str = "sdpa", store: torch.dtype | None = None):
        store = store or storage_dtype(torch.device(device), dtype)
        self.kv = torch.zeros((n_layer, 2, batch, n_head, capacity, head_dim), device=device, dtype=store)
        self.k, self.v = self.kv[:, 0], self.kv[:, 1]
        self.batch, self.capacity = batch, capacity
        self.conditions = conditions
        self.kernel = kernel
        self._rows = torch.arange(batch, device=device)[:, None]

    def attend_rows(self, layer: int, qkv: torch.Tensor, cache_pos: int | torch.Tensor | PackedSlots | RaggedSlots,
                    attn_mask: torch.Tensor | None, scale: float = 1.0) -> torch.Tensor:
        """A forward's attention over the cache: this step's rows `qkv` (R, 3, H, D) in the forward's
        row order (a (B, S) block: sequence-major; a packed step: packed) are written at `cache_pos`
        (an int start column shared by the batch, (B, S) columns, or the packed layouts) with one
        copy, then each row attends with `kernel` over its sequence's columns under `attn_mask`
        (additive, or None: every column up to the block's last), queries scaled by `scale`.
        Returns (R, H * D) in qkv's dtype (computed in the cache's, `storage_dtype`)."""
        R, _, H, D = qkv.shape
        out_dtype = qkv.dtype
        if qkv.dtype != self.kv.dtype:
            qkv = qkv.to(self.kv.dtype)
        if attn_mask is not None and attn_mask.dtype != self.kv.dtype:
            attn_mask = attn_mask.to(self.kv.dtype)
        kv = self.kv[layer]
        if isinstance(cache_pos, (int, torch.Tensor)):  # a (B, S) block
            B = self.batch
            S = R // B
            rows = qkv.view(B, S, 3, H, D)
            if isinstance(cache_pos, int):  # columns cache_pos .. cache_pos + S - 1
                kv[:, :, :, cache_pos:cache_pos + S] = rows[:, :, 1:].permute(2, 0, 3, 1, 4)
                span = attn_mask.shape[-1] if attn_mask is not None else cache_pos + S
            else:  # per-sequence columns: kv[:, b, :, cache_pos[b, s]] = the row (b, s); the mask says the span
                kv[:, self._rows, :, cache_pos] = rows[:, :, 1:]
                span = attn_mask.shape[-1]
            y = attend_few(rows[:, :, 0].transpose(1, 2), kv[0, :, :, :span], kv[1, :, :, :span], attn_mask,
                           self.kernel, scale)
            return y.transpose(1, 2).reshape(R, H * D).to(out_dtype)
        kv[:, cache_pos.batch, :, cache_pos.column] = qkv[:, 1:]
        if isinstance(cache_pos, PackedSlots):  # queries scattered into (B, width), padding dropped after
            W = cache_pos.width
            padded = qkv.new_zeros(self.batch * W, H, D).index_copy_(0, cache_pos.pad, qkv[:, 0])
            padded = padded.view(self.batch, W, H, D).transpose(1, 2)
            span = attn_mask.shape[-1]
            y = attend_few(padded, kv[0, :, :, :span], kv[1, :, :, :span], attn_mask, self.kernel, scale)
            return y.transpose(1, 2).reshape(-1, H * D).index_select(0, cache_pos.pad).to(out_dtype)
        out = []
        for bucket in cache_pos.buckets:  # one call per run of consecutive sequences of one width
            c, w = bucket.count, bucket.width
            q = qkv[bucket.start:bucket.start + c * w, 0].view(c, w, H, D).transpose(1, 2)
            span = bucket.mask.shape[-1]
            mask = bucket.mask if bucket.mask.dtype == self.kv.dtype else bucket.mask.to(self.kv.dtype)
            y = attend_few(q, kv[0, bucket.seqs, :, :span], kv[1, bucket.seqs, :, :span], mask, self.kernel, scale)
            out.append(y.transpose(1, 2).reshape(c * w, H * D))
        return (out[0] if len(out) == 1 else torch.cat(out)).to(out_dtype)


def cache_settings(attention: str, device: torch.device, dtype: torch.dtype, measured: str | None = None,
                   measured_store: torch.dtype | None = None) -> tuple[str, torch.dtype]:
    """The few-query kernel and the key dtype of a cache for a generation's ``attention`` setting
    (`aogpt.attention.KERNELS`): ``auto`` is what the decode path measured on this machine
    (`measured`, `measured_store`; `aogpt.decode.choice`) or, unmeasured, `choose_kernel`'s rule over
    `storage_dtype`; ``explicit`` is the batched products (``matmul``); ``sdpa-fp32`` SDPA over a
    float32 cache; ``sdpa`` and ``flex`` themselves."""
    store = measured_store or storage_dtype(device, dtype)
    if attention == "auto":
        if measured is not None:
            return measured, store
        return ("matmul" if choose_kernel(device, store) == "explicit" else "sdpa"), store
    if attention == "sdpa-fp32":
        return "sdpa", torch.float32
    return ("matmul" if attention == "explicit" else attention), store
