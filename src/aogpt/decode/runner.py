"""The fast decode path: the model's own forward, with the kernels measured fastest on this machine.

`prepare(model, choice)` returns a structural copy of the model that shares every parameter with
it (nothing is copied, the user's model is not modified) in which

- each linear layer of a decode step (`DECODE_PATH`: the q/k/v projection, the attention output, the
  MLP's two products, the output head) is the `aogpt.decode.kernels.LinearKernel` that
  `aogpt.decode.choice` measured fastest for its shape among the row-invariant ones, with the MLP's
  GELU and the residual adds fused into the product where that kernel can
  (`aogpt.backbone.FusedLinear`); a gated model's delta layer holds two, the source's weight and
  the merged W + dW (`aogpt.decode.gated`);
- `kernels` (`aogpt.model.Kernels`) carry the measured few-query attention kernel, the dtype the KV
  cache keeps and the layout of a ragged step, which `Transformer.setup_cache` and the samplers read;
- AO-GPT's adaLN tables (`Transformer.conditions`) are computed once, from the weights the copy is
  built from, not at every `setup_cache` (milliseconds per `generate` call, and all of it overhead
  for a gated model reading left to right, whose source slots never read them).

Everything else is the model's: its `forward_slots` is the one forward every caller goes through
(training, evaluation, the recompute baseline and every KV-cache step), so every oracle that holds
for the model holds for its decode path. A model the copy does not fit (a GPU model: no kernels to
choose there; its steps are captured as CUDA graphs instead, `aogpt.decode.graphs`) runs as it is.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from typing import Any

import torch
from torch import nn

from aogpt.backbone import linear_gelu, project
from aogpt.decode.choice import DECODE_PATH, Choice, Shapes, choose
from aogpt.decode.gated import PATHWAY, GatedKernel, kernel_of
from aogpt.decode.kernels import INVARIANCE_ROWS, LinearKernel
from aogpt.decode.kernels import row_invariant as kernel_row_invariant


def snapshot(model: nn.Module) -> list[tuple[torch.Tensor, int]]:
    """The model's parameters as they are now (aliases and versions), for `unchanged`."""
    return [(p.detach(), p._version) for p in model.parameters()]


def unchanged(model: nn.Module, weights: list[tuple[torch.Tensor, int]]) -> bool:
    """Whether what was built from `weights` (a `snapshot`) still matches the model: every parameter
    still the same storage (the kept aliases hold the old storages alive, so a new tensor cannot
    reuse an address) at the same version (bumped by any in-place change: an optimizer step,
    load_state_dict)."""
    params = list(model.parameters())
    return len(params) == len(weights) and all(
        p.data_ptr() == t.data_ptr() and p.dtype == t.dtype and p._version == v
        for p, (t, v) in zip(params, weights, strict=True))


def supports(model: nn.Module) -> bool:
    """Whether `prepare` applies: a CPU model (the kernels are measured and packed for CPUs)."""
    return next(model.parameters()).device.type == "cpu"


def role_of(name: str) -> str | None:
    """The decode-path role (`aogpt.decode.choice.ROLES`) of the module named `name`, if any (a gated
    layer's merged kernel, named with the `aogpt.decode.gated.PATHWAY` suffix, has its layer's)."""
    name = name.removesuffix(PATHWAY)
    return next((role for suffix, role in DECODE_PATH.items() if name == suffix or name.endswith("." + suffix)),
                None)


def decode_linears(model: nn.Module) -> dict[str, nn.Module]:
    """Every linear layer of a decode step by its module name (an `nn.Linear` or a `LinearKernel`; a
    gated layer's two kernels by its name and that name with the `aogpt.decode.gated.PATHWAY` suffix)."""
    out: dict[str, nn.Module] = {}
    for name, m in model.named_modules():
        if not role_of(name):
            continue
        if isinstance(m, GatedKernel):
            out.update({name + suffix: k for suffix, k in m.kernels().items()})
        elif isinstance(m, (nn.Linear, LinearKernel)):
            out[name] = m
    return out


def prepare(model: nn.Module, choice: Choice) -> nn.Module:
    """The fast path of `model` with the kernels of `choice` (module docstring), in eval mode."""
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    clone = copy.deepcopy(model, shared)
    for name, module in list(clone.named_modules()):
        for child_name, child in list(module.named_children()):
            role = role_of(f"{name}.{child_name}" if name else child_name)
            if role is not None and isinstance(child, nn.Linear):
                setattr(module, child_name, kernel_of(child, choice.linear[role]))
    clone.kernels = dataclasses.replace(model.kernels, cache_attention=choice.attention, cache_store=choice.store,
                                        ragged=choice.layout)
    clone.decode_choice = choice
    tables = model.conditions()  # computed once from these weights, as the server does: every cache set up reads them
    clone.conditions = lambda: tables
    return clone.eval()


def build(model: nn.Module) -> nn.Module:
    """`prepare` with the kernels `aogpt.decode.choice` measured for this model's shapes."""
    cfg = model.config
    p = next(model.parameters())
    shapes = Shapes(cfg.n_embd, model.transformer.h[0].mlp.c_fc.out_features, cfg.vocab_size, cfg.n_head,
                    cfg.head_dim, cfg.block_size + 2)
    return prepare(model, choose(shapes, p.dtype, p.device))



def describe_kernels(runner: nn.Module) -> str:
    """The kernels a decode runner (`aogpt.inference.for_inference`'s result) measured in this process,
    in users' words; a model run as it is (the reference path, a GPU) has none of its own."""
    choice = getattr(runner, "decode_choice", None)
    return choice.describe() if choice is not None else "the model's own layers"

def row_invariant(model: nn.Module) -> bool:
    """Whether every linear layer of a decode step, called as the step calls it (the GELU and the
    residual adds fused or not; an output projection also without the add, as AO-GPT's gated
    residuals call it), gives a row the same bits whatever the number of rows
    (`aogpt.decode.kernels.row_invariant`): the premise of the server's batch invariance."""
    p = next(model.parameters())
    identity = nn.Dropout(0.0).eval()
    for name, layer in decode_linears(model).items():
        role = role_of(name)
        inp, out = layer.in_features, layer.out_features
        if role == "fc":
            approximate = getattr(model.get_submodule(name.rpartition(".")[0]).gelu, "approximate", "none")
            call: Any = lambda x, layer=layer, a=approximate: linear_gelu(layer, x, a)  # noqa: E731
        elif role in ("proj", "out"):
            zeros = torch.zeros(max(INVARIANCE_ROWS), out, dtype=p.dtype, device=p.device)
            if not kernel_row_invariant(layer, inp, p.dtype, p.device):
                return False
            call = lambda x, layer=layer, z=zeros: project(layer, x, z[:x.shape[0]], identity)  # noqa: E731
        else:
            call = layer
        if not kernel_row_invariant(call, inp, p.dtype, p.device):
            return False
    return True


def weight_bytes(model: nn.Module) -> int:
    """Bytes of weights a step reads: every decode-path linear layer's (the embedding rows are negligible;
    a gated model's step of one kind reads one of each layer's two kernels, counted once)."""
    total = 0
    for name, layer in decode_linears(model).items():
        if name.endswith(PATHWAY):
            continue
        if isinstance(layer, LinearKernel):
            total += layer.nbytes
        else:
            total += sum(t.numel() * t.element_size() for t in layer.parameters(recurse=False))
    return total


__all__ = ["build", "decode_linears", "prepare", "role_of", "row_invariant", "snapshot", "supports", "unchanged",
           "weight_bytes"]
