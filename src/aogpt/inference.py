"""A model prepared for generation: the fast decode path, or the reference path's pre-packed weights.

`for_inference(model)` returns the model's fast decode path (`aogpt.decode.runner.SmallStepModel`:
kernels measured on this machine, fewer operations per layer) where it supports the model, built
once from the weights as they are and reused until a weight changes. ``path="reference"`` returns
the previous decode path, described below, which `aogpt bench generate` times beside the fast one.

The reference path: the decode path's weights pre-packed for the CPU's matrix library.

A decode step multiplies a few rows (one or a few slots per sequence) by every weight matrix. On
the CPU, torch's default path (MKL's sgemm) re-packs the whole weight into its blocked layout on
every call, which dominates at so few rows: the 8192 x 256 output head of the reference
configuration takes about 1.7 ms for 8 rows here, against about 0.4 ms with oneDNN and a weight
packed once (measured on this project's 2-core AMD EPYC machine; `aogpt bench generate` shows the
effect end to end).

`for_inference(model)` returns a shallow structural copy of the model that shares every parameter
with it (nothing is copied, the user's model is not modified) and whose decode-path linear layers
(attention, MLP, output head) hold a packed copy of their weight. It is built from the weights as
they are at a `generate` call, and reused by the next calls until a weight changes; only models whose
dtype this CPU packs (`packing_available`) are packed, anything else is returned as it is.

The weight is packed for at least two rows (`MIN_ROWS_HINT`), whatever the hint: packed for one
row, oneDNN picks a layout whose kernel gives a row different bits depending on how many rows are
multiplied with it (and that is slower at two rows, the usual decode step: a catch-up and a query).
Packed for two or more, every row gets the same bits whatever the row count and whatever the hint,
which is what makes a served request's tokens equal to offline generation's (`aogpt.serve.batching`).
"""

from __future__ import annotations

import copy
import itertools
import weakref
from typing import Any

import torch
from torch import nn

from aogpt import capability
from aogpt.pathway import DeltaLinear, is_gated

DECODE_PATH = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj", "lm_head")
MIN_ROWS_HINT = 2  # packed for one row, oneDNN's kernel is not row-invariant (module docstring)


def packing_available(model: nn.Module) -> bool:
    """Whether `for_inference` packs this model: a CPU model whose dtype oneDNN packs on this CPU
    (`aogpt.capability.can_pack`: fp32 wherever oneDNN is present, bf16 only where the CPU computes
    in bf16; an AVX2-only CPU refuses to pack bf16, and its bf16 model runs plain linear layers)."""
    p = next(model.parameters())
    return p.device.type == "cpu" and capability.can_pack(p.dtype)


class PackedLinear(nn.Module):
    """A frozen linear layer computed by oneDNN from a weight packed once (same parameters)."""

    def __init__(self, linear: nn.Linear, rows_hint: int):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(),
                                                                  max(rows_hint, MIN_ROWS_HINT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


class PackedDeltaLinear(PackedLinear):
    """A gated model's linear layer (`aogpt.pathway.DeltaLinear`) with both its weights packed: the
    source's W, and W + dW for the pathway's rows (``forward(x, pathway=True)``)."""

    gated = True

    def __init__(self, linear: nn.Linear, rows_hint: int):
        super().__init__(linear, rows_hint)
        with torch.no_grad():
            self.pathway = torch.ops.mkldnn._reorder_linear_weight(linear.pathway_weight().detach().contiguous(),
                                                                   max(rows_hint, MIN_ROWS_HINT))

    def forward(self, x: torch.Tensor, pathway: bool = False) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.pathway if pathway else self.packed, self.bias, "none", [],
                                                  "")


Kept = tuple[list[tuple[torch.Tensor, int]], Any]
_KEPT: weakref.WeakKeyDictionary[nn.Module, dict[tuple[str, int], Kept]] = weakref.WeakKeyDictionary()
PATHS = ("fast", "reference")


def _unchanged(model: nn.Module, weights: list[tuple[torch.Tensor, int]]) -> bool:
    """Whether a kept copy still matches the model: every parameter still the same storage (the kept
    aliases hold the old storages alive, so a new tensor cannot reuse an address) at the same version
    (bumped by any in-place change: an optimizer step, load_state_dict)."""
    params = list(model.parameters())
    return len(params) == len(weights) and all(
        p.data_ptr() == t.data_ptr() and p.dtype == t.dtype and p._version == v
        for p, (t, v) in zip(params, weights, strict=True))


def for_inference(model: nn.Module, rows_hint: int = 8, path: str = "fast") -> Any:
    """The model's decode runner (module docstring): ``fast``, the small-step path where it supports
    the model (else the reference path); ``reference``, the model with its decode-path linear layers
    packed (`model` itself when packing does not apply; `rows_hint`: the typical number of rows per
    step, at least `MIN_ROWS_HINT`). Kept (weakly, per model) and reused while the weights are
    unchanged, so repeated `generate` calls do not prepare it again."""
    from aogpt.decode import runner

    fast = path == "fast" and runner.supports(model)
    key = ("fast", 0) if fast else ("reference", rows_hint)
    if not fast and not packing_available(model):
        return model
    kept = _KEPT.setdefault(model, {})
    if key in kept and _unchanged(model, kept[key][0]):
        return kept[key][1]
    if fast and is_gated(model):  # the source's kernels and the pathway's
        from aogpt.decode.gated import GatedStepModel

        built = runner.build(model, GatedStepModel)
    else:
        built = runner.build(model) if fast else _packed(model, rows_hint)
    kept[key] = ([(p.detach(), p._version) for p in model.parameters()], built)
    return built


def _packed(model: nn.Module, rows_hint: int) -> nn.Module:
    """A structural copy of `model` sharing its parameters, with the decode-path linear layers packed."""
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    clone = copy.deepcopy(model, shared)
    for name, module in list(clone.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and full.endswith(DECODE_PATH):
                packer = PackedDeltaLinear if isinstance(child, DeltaLinear) else PackedLinear
                setattr(module, child_name, packer(child, rows_hint))
    return clone.eval()
