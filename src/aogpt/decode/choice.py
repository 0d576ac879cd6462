"""Which kernels a small decode step runs on this machine: measured once per process, not assumed.

What is fastest for 8-32 rows differs by CPU class and precision (measured on this project's
machines: on an Intel Xeon with AMX, MKL on a transposed float32 weight is about twice as fast as
oneDNN's packed one at 8 rows but gives a row different bits with the row count, while oneDNN's
packed bf16 product is the fastest of all; torch's fused attention over a bf16 cache beats two batched
products there, and is 4-6x slower than float32 on an AMD EPYC with avx512_bf16). So the fast
decode path (`aogpt.decode.runner`) asks `choose`, which times the candidates on tensors of the
model's shapes and keeps, for the process, per (CPU class, dtype, model shapes, threads):

- the linear kernel of each product (`aogpt.decode.kernels`; the q/k/v projection, the attention
  output, the MLP's two products, the output head): the fastest at a step's row counts among the
  kinds that are *row-invariant* on that shape (a row gets the same bits whatever the number of
  rows: `aogpt serve` batches requests on that premise); when none is, the fastest, and
  `row_invariant` says so;
- the attention kernel for a few queries (`aogpt.attention.attend_few`: ``sdpa`` or ``matmul``) and
  the dtype the KV cache keeps (a bf16 model's cache in bf16, or in float32 where bf16 attention is
  slower), timed on a step's queries over half the cache;
- the layout of a Lemma 4.1 step's attention (`aogpt.decode.layouts`: one call per run of sequences
  of one width, or one padded call), timed on a typical ragged step with that kernel.

Each timing is the CPU time of the fastest of a few interleaved repeats (another process on the
core only ever slows a kernel down). The whole measurement takes about 1.2 s of CPU time for the
benchmark's model (4 layers, width 256, vocabulary 8192) and is paid once per process, precision
and model shape. On a GPU nothing is chosen: the model's own layers run, captured as CUDA graphs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from aogpt import capability
from aogpt.attention import FEW_QUERY_KERNELS, attend_few
from aogpt.decode.kernels import INVARIANCE_ROWS, LinearKernel, available, row_invariant

REPEATS = 5  # interleaved timings per candidate, the fastest kept
MIN_SECONDS = 0.003  # each timing loops at least this long


LAYERS = 4  # layers' caches a timed attention step goes through
ROWS = 8  # a step's rows as timed (and twice as many): the benchmark's batch, one or two rows per sequence
BATCH = 8  # sequences of the timed attention


@dataclass(frozen=True)
class Shapes:
    """What the choice depends on: the model's widths and its context. Not the batch: a served
    request and the same request offline must run the same kernels (`aogpt.serve`), whatever else
    shares their steps."""

    width: int
    hidden: int
    vocab: int
    heads: int
    head_dim: int
    capacity: int  # cache columns


@dataclass
class Choice:
    """The kernels of the fast decode path for one (CPU class, dtype, shapes), and the timings behind it."""

    linear: dict[str, str]  # role (`ROLES`) -> kernel kind
    attention: str
    store: torch.dtype
    row_invariant: bool
    linear_us: dict[str, float] = field(default_factory=dict)  # per "role/kind": microseconds per call
    attention_us: dict[str, float] = field(default_factory=dict)  # per "kernel/store"
    invariant: dict[str, bool] = field(default_factory=dict)  # per "role/kind"
    cpu_class: str = ""
    layout: str = "runs"  # a ragged step's attention (`aogpt.decode.layouts.LAYOUTS`)
    layout_us: dict[str, float] = field(default_factory=dict)  # per layout: microseconds per step and layer

    def describe(self) -> str:
        kinds = sorted(set(self.linear.values()), key=list(self.linear.values()).index)
        linear = kinds[0] if len(kinds) == 1 else ", ".join(f"{r} {k}" for r, k in self.linear.items())
        store = str(self.store).removeprefix("torch.")
        return (f"linear {linear}{'' if self.row_invariant else ' (not row-invariant)'}, attention "
                f"{self.attention} over a {store} cache, ragged steps {self.layout} ({self.cpu_class})")


def _timed(fn: Callable[[], object]) -> float:
    """CPU seconds per call of `fn` (this process's: time spent waiting for a busy core is not the
    kernel's), looped for at least `MIN_SECONDS`."""
    fn()
    calls, start = 0, time.process_time()
    while True:
        fn()
        calls += 1
        elapsed = time.process_time() - start
        if elapsed >= MIN_SECONDS:
            return elapsed / calls


def _fastest(candidates: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Microseconds per call of every candidate: the fastest of `REPEATS` interleaved timings."""
    best = {name: float("inf") for name in candidates}
    for _ in range(REPEATS):
        for name, fn in candidates.items():
            best[name] = min(best[name], _timed(fn) * 1e6)
    return best


MARGIN = 0.05  # an attention kernel or layout replaces an earlier one only when this much faster


def preferred(us: dict[str, float]) -> str:
    """The first candidate (in the order measured: the fused kernel and the model's own dtype first)
    within `MARGIN` of the fastest: timings this close differ from run to run on a shared machine,
    and a step's attention reads its cache from memory, which a repeated timing does not."""
    best = min(us.values())
    return next(name for name, t in us.items() if t <= best * (1 + MARGIN))


ROLES = ("qkv", "proj", "fc", "out", "head")  # a block's four products and the output head
DECODE_PATH = {"attn.c_attn": "qkv", "attn.c_proj": "proj", "mlp.c_fc": "fc", "mlp.c_proj": "out",
               "lm_head": "head"}  # the module name (suffix) of each role's linear layer in a model


def _call(role: str, kernel: LinearKernel, residual: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """What a step calls for `role`: the residual add fused after the two output products, the GELU
    after the MLP's first."""
    if role in ("proj", "out"):
        return lambda x: kernel.add(x, residual[:x.shape[0]])
    return kernel.gelu if role == "fc" else kernel


def _linear_candidates(shapes: Shapes, dtype: torch.dtype, device: torch.device
                       ) -> tuple[dict[str, Callable[[], object]], dict[str, bool]]:
    """Per (role, kernel kind), on a random weight of the model's shape for that role, the call a
    step makes (q/k/v; attention output + residual; MLP with GELU; MLP output + residual; the head)
    at `ROWS` and twice as many rows; and whether that call is row-invariant."""
    d, h, V = shapes.width, shapes.hidden, shapes.vocab
    gen = torch.Generator().manual_seed(0)
    sizes = {"qkv": (3 * d, d), "proj": (d, d), "fc": (h, d), "out": (d, h), "head": (V, d)}
    candidates, invariant = {}, {}
    for role, (out, inp) in sizes.items():
        weight = (torch.randn(out, inp, generator=gen) * inp ** -0.5).to(device=device, dtype=dtype)
        bias = torch.zeros(out, device=device, dtype=dtype)
        x = torch.randn(2 * ROWS, inp, generator=gen).to(device=device, dtype=dtype)
        residual = torch.zeros(max(INVARIANCE_ROWS), out, device=device, dtype=dtype)
        for kind in available(dtype, device, fused=role in ("fc", "proj", "out")):
            call = _call(role, LinearKernel(weight, bias, kind), residual)

            def run(call=call, x=x) -> None:
                call(x[:ROWS])
                call(x)

            candidates[f"{role}/{kind}"] = run
            invariant[f"{role}/{kind}"] = row_invariant(call, inp, dtype, device)
    return candidates, invariant


def _attention_candidates(shapes: Shapes, dtype: torch.dtype, device: torch.device
                          ) -> dict[str, Callable[[], object]]:
    """A step's attention per (kernel, cache dtype): one query per sequence, and two with a mask,
    over half the cache, in each of `LAYERS` layers' caches in turn (as a step reads them: a cache
    that stayed in the core's own cache between calls would favour the kernel that rereads it)."""
    B, H, D = BATCH, shapes.heads, shapes.head_dim
    span = max(2, shapes.capacity // 2)
    stores = [dtype] + ([torch.float32] if dtype in (torch.bfloat16, torch.float16) else [])
    gen = torch.Generator().manual_seed(1)
    out = {}
    for store in stores:
        kv = torch.randn(LAYERS, 2, B, H, shapes.capacity, D, generator=gen).to(device=device, dtype=store)
        q1, q2 = (torch.randn(B, H, w, D, generator=gen).to(device=device, dtype=store) * D ** -0.5 for w in (1, 2))
        mask = torch.zeros(B, 1, 2, span, device=device, dtype=store)
        mask[:, :, 0, -1] = float("-inf")
        for kernel in FEW_QUERY_KERNELS:
            def run(kv=kv, q1=q1, q2=q2, mask=mask, kernel=kernel) -> None:
                for layer in kv:
                    attend_few(q1, layer[0, :, :, :span], layer[1, :, :, :span], None, kernel)
                    attend_few(q2, layer[0, :, :, :span], layer[1, :, :, :span], mask, kernel)

            out[f"{kernel}/{str(store).removeprefix('torch.')}"] = run
    return out


LAYOUT_SIZES = (1, 2, 0, 1, 3, 1, 2, 1)  # a Lemma 4.1 step's rows per sequence at T = n (catch-ups and queries)


def _layout_candidates(shapes: Shapes, kernel: str, store: torch.dtype, device: torch.device
                       ) -> dict[str, Callable[[], object]]:
    """A ragged step's attention (`LAYOUT_SIZES` rows per sequence, half the cache decided) in each
    layout of `aogpt.decode.layouts`, with the chosen kernel, through `LAYERS` layers: the keys
    written, the mask built (padded, once a step) and every row attended."""
    from aogpt.decode.layouts import padded_steps, ragged_rows, run_steps
    from aogpt.kv_cache import KVCache

    sizes = np.array(LAYOUT_SIZES)
    B, H, D = len(sizes), shapes.heads, shapes.head_dim
    decided = np.full(B, max(2, shapes.capacity // 2))
    first = decided - np.maximum(sizes - 1, 0)  # a sequence's catch-ups, then one query
    cache = KVCache(LAYERS, B, H, shapes.capacity, D, device, store, kernel=kernel, store=store)
    cache.kv.normal_(generator=torch.Generator(device).manual_seed(2))
    qkv = torch.randn(int(sizes.sum()), 3, H, D, generator=torch.Generator().manual_seed(3)).to(device, store)
    _, _, buckets = ragged_rows(sizes, first, decided, store, device)
    _, _, runs = run_steps(sizes[None], first[None], decided[None], store, device)[0]
    _, _, padded = padded_steps(sizes[None], first[None], decided[None], device)[0]
    def step(where: object, mask: Callable[[], torch.Tensor | None]) -> Callable[[], None]:
        def run() -> None:
            m = mask()
            for layer in range(LAYERS):
                cache.attend_rows(layer, qkv, where, m)
        return run

    return {"runs": step(runs, lambda: None), "buckets": step(buckets, lambda: None),
            "padded": step(padded, lambda: padded.mask(store))}


_CACHE: dict[tuple, Choice] = {}


def _key(shapes: Shapes, dtype: torch.dtype, device: torch.device) -> tuple:
    return (capability.cpu_class() if device.type == "cpu" else device.type, str(dtype), shapes,
            torch.get_num_threads())


def choose(shapes: Shapes, dtype: torch.dtype, device: torch.device) -> Choice:
    """The fast path's kernels for a model of `shapes` in `dtype` on `device` (module docstring),
    measured on the first call for this key and cached for the process."""
    key = _key(shapes, dtype, device)
    if key not in _CACHE:
        _CACHE[key] = _measure(shapes, dtype, device)
    return _CACHE[key]


def _measure(shapes: Shapes, dtype: torch.dtype, device: torch.device) -> Choice:
    where = capability.cpu_class() if device.type == "cpu" else device.type
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return Choice(dict.fromkeys(ROLES, "plain"), "sdpa", dtype, True, cpu_class=where)  # nothing to choose
    with torch.inference_mode():
        linear_fns, invariant = _linear_candidates(shapes, dtype, device)
        linear_us = _fastest(linear_fns)
        attention_us = _fastest(_attention_candidates(shapes, dtype, device))
        kernel, store = preferred(attention_us).split("/")
        layout_us = _fastest(_layout_candidates(shapes, kernel, getattr(torch, store), device))
    linear = {}
    for role in ROLES:
        tried = [name for name in linear_us if name.startswith(role + "/")]
        usable = [name for name in tried if invariant[name]] or tried
        linear[role] = min(usable, key=linear_us.__getitem__).split("/")[1]
    return Choice(linear, kernel, getattr(torch, store), all(invariant[f"{r}/{k}"] for r, k in linear.items()),
                  linear_us, attention_us, invariant, where, preferred(layout_us), layout_us)


def forget() -> None:
    """Drop every cached choice (tests that change the CPU switch)."""
    _CACHE.clear()


__all__ = ["DECODE_PATH", "ROLES", "Choice", "Shapes", "choose", "forget"]
