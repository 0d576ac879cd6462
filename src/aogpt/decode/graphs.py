"""Decode steps replayed as CUDA graphs, one graph per static shape.

A decode step of a small model launches a few hundred kernels of a few microseconds each; on a GPU
the host's work to launch them, not the kernels, sets the step's time (measured on an H200: AO-GPT's
Lemma 4.1 step at GPT-2 small's size took 10.4 ms against 3.4 ms for our GPT, docs/gpu.md). gpt-fast's
answer is to capture the step once as a CUDA graph and replay it: a replay launches every kernel at
once, in microseconds. A graph needs fixed shapes and fixed addresses, so here

- the decoder plans every step in the padded layout with static shapes (`aogpt.decode.layouts.Static`):
  rows, width and selected rows padded up to powers of two, attention over the whole cache, the
  padding rows in a sink sequence no real row sees; a step is then one of a few shapes (for our GPT
  one shape, for AO-GPT's Bernoulli steps a handful);
- the KV cache, the token table the step reads its contents from and the step's mask are static
  (the cache is allocated once; the mask is built inside the step from its index tensors); the
  random draws happen after the step, from uniforms drawn before the loop (`aogpt.generation.streams`);
- `CapturedSteps` copies each step's planned index tensors into the static inputs of its shape's
  graph (captured on the shape's first step, after one eager warm-up run: a step run twice writes
  the same keys again, so the warm-up changes nothing) and replays it;
- the cache, the contents and the graphs are kept per model and geometry (`static_state`), so the
  next `generate` call of the same shape replays what the last one captured (a cache column is
  always written in a run before it is read, so nothing needs clearing; the adaLN tables are
  recomputed when a weight changed).

If capturing fails (an operation that cannot be captured, a driver without graph support), a one-line
warning says so and the steps run eagerly in the same static shapes, with the same results. On the
CPU there is nothing to capture: ``graphs="eager"`` runs these static-shape steps there, which is how
the tests check them (the same samples as every other path, `tests/generation/test_seeds.py`).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from aogpt.kv_cache import KVCache, PackedSlots

log = logging.getLogger(__name__)

MODES = ("auto", "off", "eager")  # the `graphs` setting: captured on a GPU; never; static shapes, run eagerly


def mode(setting: str, device: torch.device, use_cache: bool, reference: bool, gated: bool = False) -> str | None:
    """How a decoder's steps run: ``capture`` (CUDA graphs), ``eager`` (the static shapes without
    capture) or None (the plain loop: the CPU's default, a run without a KV cache, one on the
    reference decode path, which a compiled step takes, or a model with a gated pathway: its step
    splits the rows by gate, `aogpt.pathway.RowSplit`, into groups whose sizes depend on the step's
    orders, a shape a graph cannot hold and a count read back to the host, so it runs the plain loop
    in its planned layouts)."""
    if setting == "off" or not use_cache or reference or gated:
        return None
    if setting == "eager":
        return "eager"
    return "capture" if device.type == "cuda" else None


@dataclass
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]  # the static inputs the planned tensors are copied into
    out: torch.Tensor  # the static logits each replay rewrites


class CapturedSteps:
    """Runs a decoder's static-shape steps (`aogpt.generation.decoder.Step`, padded layout): replayed
    from one CUDA graph per shape when `capture`, else eagerly. `forward` is the model's
    ``forward_slots``, `tokens` the flat chain contents every step gathers its slots' tokens from."""

    def __init__(self, forward: Callable[..., torch.Tensor], cache: KVCache, tokens: torch.Tensor,
                 mask_dtype: torch.dtype, capture: bool):
        self.forward, self.cache, self.tokens, self.mask_dtype = forward, cache, tokens, mask_dtype
        self.capture = capture
        self.graphs: dict[tuple[int, int, int], _Graph] = {}
        self.pool: Any = None
        self.fallback: str | None = None  # why capturing was given up, when it was

    @staticmethod
    def inputs(step: Any) -> list[torch.Tensor]:
        where = step.cache_pos
        return [step.gather, step.pos, step.target, where.batch, where.column, where.pad, where.cols, where.limit,
                step.select]

    def run(self, inputs: list[torch.Tensor], width: int) -> torch.Tensor:
        """One step from its index tensors: the slots' tokens gathered, the mask built, the forward run."""
        gather, pos, target, batch, column, pad, cols, limit, select = inputs
        where = PackedSlots(batch, column, pad, width, cols, limit, self.cache.capacity)
        return self.forward(self.tokens[gather], pos, target, attn_mask=where.mask(self.mask_dtype),
                            cache=self.cache, cache_pos=where, select=select)

    def __call__(self, step: Any) -> torch.Tensor:
        """The step's logits (1, Q, V) for its padded selected rows (the real ones first)."""
        inputs, width = self.inputs(step), step.cache_pos.width
        if not self.capture:
            return self.run(inputs, width)
        key = (int(step.gather.shape[1]), width, int(step.select.shape[1]))
        graph = self.graphs.get(key) or self._capture(key, inputs, width)
        if graph is None:
            return self.run(inputs, width)
        for static, value in zip(graph.inputs, inputs, strict=True):
            static.copy_(value)
        graph.graph.replay()
        return graph.out

    def _capture(self, key: tuple[int, int, int], inputs: list[torch.Tensor], width: int) -> _Graph | None:
        """Capture the step of shape `key` (module docstring), or give capturing up with one line."""
        static = [x.clone() for x in inputs]
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up off the capture (lazy initialisations, workspaces)
                self.run(static, width)
            torch.cuda.current_stream().wait_stream(stream)
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()  # one pool: the graphs never replay at once
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self.run(static, width)
        except Exception as exc:  # noqa: BLE001 (any failure to capture: run as before, and say so)
            self.capture = False
            self.fallback = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            log.warning("the decode step could not be captured as a CUDA graph (%s): running it without", self.fallback)
            return None
        self.graphs[key] = _Graph(graph, static, out)
        return self.graphs[key]


@dataclass
class StaticState:
    """What a captured step reads and writes at fixed addresses, kept across `generate` calls of one
    model and geometry so that their graphs are captured once: the KV cache (with the sink row), the
    chain contents (B, n + 2) the steps gather from, and the graphs. `busy` while a sampler uses it."""

    cache: KVCache
    tokens: torch.Tensor
    runner: CapturedSteps
    weights: list[tuple[torch.Tensor, int]]
    busy: bool = False


_STATES: weakref.WeakKeyDictionary[Any, dict[tuple, StaticState]] = weakref.WeakKeyDictionary()
KEEP = 2  # geometries kept per model (each holds a KV cache)


def static_state(model: Any, batch: int, n: int, attention: str, capture: bool) -> StaticState:
    """The static state for decoding `batch` sequences of `n` positions with `model` (`StaticState`):
    the one kept for this geometry when the weights are unchanged (the cache's adaLN tables come from
    them) and no other sampler is using it, else a new one (kept for the next call)."""
    from aogpt.decode.runner import snapshot, unchanged

    key = (batch, n, attention, capture)
    kept = _STATES.setdefault(model, {})
    state = kept.get(key)
    if state is not None and not state.busy and unchanged(model, state.weights):
        return state
    cache = model.setup_cache(batch + 1, n + 1, attention)  # + the sink sequence of padding rows
    tokens = torch.full((batch, n + 2), -1, dtype=torch.long, device=cache.kv.device)
    state = StaticState(cache, tokens, CapturedSteps(model.forward_slots, cache, tokens.view(-1), cache.kv.dtype,
                                                     capture), snapshot(model))
    if key in kept and kept[key].busy:  # another sampler holds the kept one: this one is its own
        return state
    kept.pop(key, None)
    kept[key] = state
    while len(kept) > KEEP:
        kept.pop(next(iter(kept)))
    return state


__all__ = ["MODES", "CapturedSteps", "StaticState", "mode", "static_state"]
