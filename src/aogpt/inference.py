"""A model prepared for generation: the decode path's weights pre-packed for the CPU's matrix library.

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

import torch
from torch import nn

from aogpt import capability

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


_PACKED: weakref.WeakKeyDictionary[nn.Module, tuple[int, list[tuple[torch.Tensor, int]], nn.Module]] = \
    weakref.WeakKeyDictionary()


def _unchanged(model: nn.Module, rows_hint: int, kept: tuple[int, list[tuple[torch.Tensor, int]], nn.Module]) -> bool:
    """Whether a kept packed copy still matches the model: same row hint, and every parameter still
    the same storage (the kept aliases hold the old storages alive, so a new tensor cannot reuse an
    address) at the same version (bumped by any in-place change: an optimizer step, load_state_dict)."""
    hint, weights, _ = kept
    params = list(model.parameters())
    return hint == rows_hint and len(params) == len(weights) and all(
        p.data_ptr() == t.data_ptr() and p.dtype == t.dtype and p._version == v
        for p, (t, v) in zip(params, weights, strict=True))


def for_inference(model: nn.Module, rows_hint: int = 8) -> nn.Module:
    """The model with its decode-path linear layers packed (module docstring); `model` itself when
    packing does not apply. `rows_hint`: the typical number of rows per step. The packed copy is
    kept (weakly, per model) and reused while the weights are unchanged, so repeated `generate`
    calls do not pack again."""
    if not packing_available(model):
        return model
    kept = _PACKED.get(model)
    if kept is not None and _unchanged(model, rows_hint, kept):
        return kept[2]
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    clone = copy.deepcopy(model, shared)
    for name, module in list(clone.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and full.endswith(DECODE_PATH):
                setattr(module, child_name, PackedLinear(child, rows_hint))
    _PACKED[model] = (rows_hint, [(p.detach(), p._version) for p in model.parameters()], clone.eval())
    return clone
