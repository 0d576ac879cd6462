"""The fast decode path of a model with a gated pathway (`aogpt.pathway`): two kernels per linear layer.

A gated model computes the rows that read left to right with its source's weights W and the others
with W + dW (`aogpt.pathway.side` picks them; the forward is the model's own, `aogpt.model.Block`).
In the fast path (`aogpt.decode.runner.prepare`) each of its delta layers becomes a `GatedKernel`:
the source's weight and the merged weight W + dW, each prepared once as the `LinearKernel` of the
kind measured fastest for that shape (`aogpt.decode.choice`; both weights have the layer's shape).
So a step whose rows all read left to right runs the source's kernels only and costs what the
source's step costs; a step whose rows all go through the pathway runs the merged kernels, one
product per layer and row as a model of that size does (unmerged, ``W x + B (A x)`` would add two
products and an add per layer, and a full-rank delta would read a second matrix of the layer's
size); a mixed step gathers the two groups' rows around attention (`aogpt.pathway.RowSplit`). A row's
arithmetic depends on its group only, never on the rows beside it, so generation stays batch
invariant bit for bit where each kernel is row-invariant (`aogpt.decode.runner.row_invariant`
checks both).
"""

from __future__ import annotations

import torch
from torch import nn

from aogpt.decode.kernels import LinearKernel
from aogpt.pathway import DeltaLinear


class GatedKernel(LinearKernel):
    """A `DeltaLinear` prepared for decode steps: itself the source's kernel (W), called, fused and
    counted as any `LinearKernel` (so a left-to-right row pays nothing for the pathway beside it), with
    ``pathway`` beside it: the kernel of the merged W + dW (merged once from the weights as they are),
    which `pathway_linear` hands the pathway's rows (`aogpt.pathway.side`)."""

    def __init__(self, layer: DeltaLinear, kind: str):
        super().__init__(layer.weight, layer.bias, kind)
        with torch.no_grad():
            self.pathway = LinearKernel(layer.pathway_weight().detach(), layer.bias, kind)
        object.__setattr__(self, "_merged", self.pathway)  # read per row group and layer: past Module's lookup

    def pathway_linear(self) -> LinearKernel:
        return self._merged

    def kernels(self) -> dict[str, LinearKernel]:
        """Both kernels by the name `aogpt.decode.runner.decode_linears` gives them (a suffix of the layer's)."""
        return {"": self, PATHWAY: self.pathway}


PATHWAY = ":pathway"  # the suffix of a gated layer's merged kernel in `aogpt.decode.runner.decode_linears`


def kernel_of(layer: nn.Linear, kind: str) -> nn.Module:
    """The fast path's form of a decode-path linear layer: a `GatedKernel` for a gated model's delta
    layer, else the plain `LinearKernel` of `kind`."""
    if isinstance(layer, DeltaLinear):
        return GatedKernel(layer, kind)
    return LinearKernel.of(layer, kind)


__all__ = ["PATHWAY", "GatedKernel", "kernel_of"]
