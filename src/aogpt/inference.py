"""A model prepared for generation, kept while its weights are unchanged.

`for_inference(model)` returns the model's fast decode path (`aogpt.decode.runner.prepare`: the
model's own forward, its decode-path linear layers swapped for the kernels measured fastest on this
machine, sharing every parameter), built once from the weights as they are and reused by the next
`generate` calls until a weight changes. ``path="reference"`` is the model itself (torch's own
modules and default kernels): what `aogpt bench generate` times beside the fast path, and what a
compiled step runs (inductor cannot see into oneDNN's packed weights).

Why a decode step needs its own kernels: it multiplies a few rows (one or a few slots per sequence)
by every weight matrix. On the CPU, torch's default path (MKL's sgemm) re-packs the whole weight into
its blocked layout on every call, which dominates at so few rows, and rounds a row differently with
the number of rows beside it; oneDNN with a weight packed once does neither
(`aogpt.decode.kernels`, which holds the one packer).
"""

from __future__ import annotations

import weakref
from typing import Any

from torch import nn

from aogpt import capability

Kept = tuple[list[tuple[Any, int]], Any]
_KEPT: weakref.WeakKeyDictionary[nn.Module, Kept] = weakref.WeakKeyDictionary()
PATHS = ("fast", "reference")


def packing_available(model: nn.Module) -> bool:
    """Whether this CPU packs the model's dtype for oneDNN (`aogpt.capability.can_pack`: fp32 wherever
    oneDNN is present, bf16 only where the CPU computes in bf16; an AVX2-only CPU refuses to pack
    bf16, and the fast path then chooses among the kernels it has)."""
    p = next(model.parameters())
    return p.device.type == "cpu" and capability.can_pack(p.dtype)


def for_inference(model: nn.Module, path: str = "fast") -> Any:
    """The model's decode runner (module docstring): ``fast`` where `aogpt.decode.runner.supports` the
    model (else the model itself), ``reference`` the model itself. Kept (weakly, per model) and
    reused while the weights are unchanged, so repeated `generate` calls do not prepare it again."""
    from aogpt.decode import runner

    if path != "fast" or not runner.supports(model):
        return model
    kept = _KEPT.get(model)
    if kept is not None and runner.unchanged(model, kept[0]):
        return kept[1]
    built = runner.build(model)
    _KEPT[model] = (runner.snapshot(model), built)
    return built
