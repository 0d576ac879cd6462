"""Linear kernels for a few rows: the same three calls whatever computes them.

Every kernel holds one weight (out, in) and its bias, prepared once (packed, transposed or as it is),
and offers ``__call__(x)`` = x W^T + b, ``gelu(x, approximate)`` = GELU(x W^T + b) and
``add(x, residual)`` = residual + x W^T + b, on rows x (R, in). Where the library can fuse the
GELU or the residual add into the product (oneDNN's post-ops), it does; elsewhere they are one more
operation. The results are the same function; the rounding of the last bit may differ.

- ``onednn`` / ``onednn1``: `torch.ops.mkldnn._linear_pointwise` on a weight packed once for oneDNN
  for two rows / for one row (only where `aogpt.capability.can_pack` says this CPU packs the dtype).
  The row count a weight is packed for picks oneDNN's layout and kernel, and with it whether a row
  gets the same bits whatever the number of rows: on this project's Intel Xeon with AMX, packed for
  two rows a float32 weight is row-invariant and for one row it is not, while a bf16 (1024 -> 256)
  weight is row-invariant packed for one row and not for two (from 100 rows on);
- ``mkl``: ``addmm`` on a contiguous transposed copy of the weight ((in, out): MKL's fastest layout
  for few rows here), a copy of the weight's bytes;
- ``plain``: `torch.nn.functional.linear`, torch's default (float64 and anything else).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from aogpt import capability
from aogpt.backbone import FusedLinear

KINDS = ("onednn", "onednn1", "mkl", "plain")
PACK_ROWS = {"onednn": 2, "onednn1": 1}  # the row count each oneDNN kind packs its weight for


FUSED = "+fused"  # a kind's suffix: its GELU and residual add fused into the product (oneDNN's post-ops)


class LinearKernel(FusedLinear):
    """x W^T + b by `kind` for rows (..., in); see the module docstring. A oneDNN kind named with the
    `FUSED` suffix fuses the GELU and the residual add into the product (post-ops, which may change
    whether a row's bits depend on the row count); without it they are separate operations.

    It keeps the layer's own weight and bias as its parameters (shared, never copied: a model whose
    linear layers are swapped for kernels has the same parameters) and the prepared copy beside them."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kind: str):
        super().__init__()
        self.name = kind
        self.fused = kind.endswith(FUSED)
        kind = kind.removesuffix(FUSED)
        self.kind, self.weight, self.bias = kind, weight, bias
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        w = weight.detach()
        self.onednn = kind in PACK_ROWS
        if self.onednn:
            self.prepared = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS[kind])
        elif kind == "mkl":
            self.prepared = w.t().contiguous()
        else:
            self.prepared = w
        self._bias = None if bias is None else bias.detach()

    @classmethod
    def of(cls, layer: nn.Linear, kind: str) -> LinearKernel:
        return cls(layer.weight, layer.bias, kind)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kind={self.name}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.onednn:
            return torch.ops.mkldnn._linear_pointwise(x, self.prepared, self._bias, "none", [], "")
        if self.kind == "mkl":
            rows = x.reshape(-1, self.in_features)
            out = torch.mm(rows, self.prepared) if self._bias is None else torch.addmm(self._bias, rows, self.prepared)
            return out.view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.prepared, self._bias)

    def gelu(self, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        if self.fused:
            return torch.ops.mkldnn._linear_pointwise(x, self.prepared, self._bias, "gelu", [], approximate)
        return F.gelu(self(x), approximate=approximate)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self.prepared, self._bias, "add")
        if self.kind == "mkl":
            rows = x.reshape(-1, self.in_features)
            out = torch.addmm(residual.reshape(-1, self.out_features), rows, self.prepared)
            out = out if self._bias is None else out.add_(self._bias)
            return out.view(residual.shape)
        return residual + self(x)

    @property
    def nbytes(self) -> int:
        """Bytes a call reads from the weight (and bias): the step's share of the memory traffic."""
        w = self.prepared
        size = w.numel() * w.element_size() if w.layout == torch.strided else \
            self.in_features * self.out_features * w.element_size()
        return size + (0 if self._bias is None else self._bias.numel() * self._bias.element_size())


def available(dtype: torch.dtype, device: torch.device, fused: bool = False) -> list[str]:
    """The kinds this device can run for `dtype`: oneDNN only where it packs the dtype (`fused`: each
    also with its post-ops fused, `FUSED`), MKL for the CPU's float32 and bfloat16, the plain path always."""
    if device.type != "cpu":
        return ["plain"]
    kinds = []
    if capability.can_pack(dtype):
        kinds = [k + suffix for k in PACK_ROWS for suffix in ("", FUSED)[:1 + fused]]
    if dtype in (torch.float32, torch.bfloat16) and capability.usable_precision(dtype):
        kinds.append("mkl")
    return kinds + ["plain"]


INVARIANCE_ROWS = (1, 2, 5, 9, 17, 40, 100, 129)  # row counts compared: up to a full server step


def row_invariant(layer: Callable[[torch.Tensor], torch.Tensor], in_features: int, dtype: torch.dtype,
                  device: torch.device, rows: tuple[int, ...] = INVARIANCE_ROWS) -> bool:
    """Whether `layer` gives every row the same bits whatever the number of rows multiplied with it
    (random rows): what a served request's equality with offline generation rests on."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(max(rows), in_features, generator=gen).to(device=device, dtype=dtype)
    with torch.inference_mode():
        alone = torch.cat([layer(x[i:i + 1]) for i in range(max(rows))])
        return all(torch.equal(layer(x[:r]), alone[:r]) for r in rows)


__all__ = ["FUSED", "INVARIANCE_ROWS", "KINDS", "LinearKernel", "available", "row_invariant"]
