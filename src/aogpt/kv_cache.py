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
    attention runs in. `cols` and `limit` (B, width), when given: the cache column of each slot of
    that layout and the columns before `limit` it sees besides its own (a padding slot: 0 and 0,
    column 0 only), from which `mask` builds the step's mask over the first `span` columns."""

    batch: torch.Tensor
    column: torch.Tensor
    pad: torch.Tensor
    width: int
    cols: torch.Tensor | None = None
    limit: torch.Tensor | None = None
    span: int = 0

    def mask(self, dtype: torch.dtype) -> torch.Tensor:
        """The additive mask (B, 1, width, span): 0 where a slot may attend, -inf elsewhere."""
        a = torch.arange(self.span, device=self.cols.device)
        allowed = (a < self.limit[..., None]) | (a == self.cols[..., None])
        return torch.where(allowed, 0.0, float("-inf")).to(dtype)[:, None]


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
    """Where the rows of a packed forward go, bucketed (module docstring): row r belongs to sequence
    `batch[r]` and writes its keys at cache column `column[r]`. Without `pad`, each bucket's rows are
    the packed rows start .. start + count * width - 1; with it, row r sits at slot `pad[r]` of
    `slots` slots laid out bucket after bucket (a bucket's sequences padded to its width)."""

    batch: torch.Tensor
    column: torch.Tensor
    buckets: list[Bucket]
    pad: torch.Tensor | None = None
    slots: int = 0


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
        return self._attend_buckets(layer, qkv.contiguous(), cache_pos, scale).to(out_dtype)

    def _attend_buckets(self, layer: int, qkv: torch.Tensor, where: RaggedSlots, scale: float) -> torch.Tensor:
        """One attention call per run of consecutive sequences of one width (`RaggedSlots`), each
        run's queries, keys and values and its place in the output one strided view apiece (a few
        operations per run: a step has several runs in every layer)."""
        R, _, H, D = qkv.shape
        B, C = self.batch, self.capacity
        q = qkv[:, 0]
        if where.pad is not None:  # runs padded to their widest sequence: the queries scattered to their slots
            q = qkv.new_zeros(where.slots, H, D).index_copy_(0, where.pad, q)
        rs = q.stride(0)
        out = qkv.new_empty(q.shape[0], H, D)
        for bucket in where.buckets:
            c, w, start = bucket.count, bucket.width, bucket.start
            span = bucket.mask.shape[-1]
            mask = bucket.mask if bucket.mask.dtype == self.kv.dtype else bucket.mask.to(self.kv.dtype)
            qb = q.as_strided((c, H, w, D), (w * rs, D, rs, 1), q.storage_offset() + start * rs)
            if isinstance(bucket.seqs, slice):  # the run's keys and values: views of the cache
                base = ((layer * 2) * B + bucket.seqs.start) * H * C * D
                shape, stride = (c, H, span, D), (H * C * D, C * D, D, 1)
                keys = self.kv.as_strided(shape, stride, base)
                values = self.kv.as_strided(shape, stride, base + B * H * C * D)
            else:  # a large batch's sequences of one width, gathered
                keys, values = self.kv[layer, 0, bucket.seqs, :, :span], self.kv[layer, 1, bucket.seqs, :, :span]
            y = attend_few(qb, keys, values, mask, self.kernel, scale)
            out.as_strided((c, H, w, D), (w * H * D, D, H * D, 1), start * H * D).copy_(y)
        if where.pad is not None:
            out = out.index_select(0, where.pad)
        return out.view(R, H * D)


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
