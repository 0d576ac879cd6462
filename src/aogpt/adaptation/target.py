"""Build the adapted model: the source's backbone, and a target pathway that starts changing nothing.

- AO-GPT (``target = adaln``): adaLN replaces each norm's affine part with a per-position
  modulation whose weights start at zero; the norms' own weights and biases are folded into it
  (`aogpt.model.fold_affine`), so with zero modulation every norm is the source's. The gates start
  open (their bias 1), so each block's attention and MLP add their output at full strength, as in
  the source; the final adaLN starts as the source's final norm. The target table keeps a random
  draw (std 0.02): were it zero too, no gradient would reach the zero modulation or the table.
- sigma-GPT (``target = input``): the target-position table added at the input starts at zero.

Read left to right, the adapted model therefore computes the source's logits (to float rounding),
and its KV cache is the plain causal cache of the source plus the pending-slot rule.

With a gated pathway (``pathway = "gated"``, `aogpt.pathway`) the source's weights are frozen and
the slots that read left to right never meet the pathway: read left to right the model *is* the
source, at step 0 and after any fine-tuning. The pathway (adaLN, the deltas of rank
``pathway_rank``, the target table) starts at zero, the adaLN gates included (they are 1 + the
layer's output there), except the target table and the deltas' down-projections, drawn so that
gradients reach the rest.
"""

from __future__ import annotations

import torch

from aogpt.adaptation.source import Source
from aogpt.config import model_config
from aogpt.errors import AOGPTError
from aogpt.model import Transformer
from aogpt.pathway import is_pathway


def build(source: Source, variant: str, *, target_dim: int = 128, seed: int = 0, pathway: str = "shared",
          rank: int = 0) -> Transformer:
    """`variant`'s model on `source`'s backbone, exact at step 0 (module docstring); `pathway` gated: the
    source frozen and alone on the slots that read left to right, a new pathway of delta rank `rank`
    (0: full rank) on the others."""
    cfg = model_config(variant, **source.backbone, qk_norm=False, target_dim=target_dim, pathway=pathway,
                       pathway_rank=rank)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Transformer(cfg)
    state = dict(source.state)
    if cfg.target == "adaln":  # AO-GPT's final norm lives in its final layer
        state = {k.replace("transformer.ln_f.", "transformer.final_layer.ln_f."): v for k, v in state.items()}
    expected = {k for k in model.state_dict() if k not in model.target_pathway() and not is_pathway(k)}
    if cfg.tie_head:
        expected.discard("lm_head.weight")
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise AOGPTError(f"the source's weights do not fit the rebuilt backbone (missing {missing[:3]}, "
                         f"unexpected {extra[:3]})", "report this source model: its reader is incomplete")
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, value in state.items():
            if params[name].shape != value.shape:
                raise AOGPTError(f"source weight {name} has shape {tuple(value.shape)}, the backbone "
                                 f"{tuple(params[name].shape)}", "report this source model")
            params[name].copy_(value)
        exact_start(model)
    return model


@torch.no_grad()
def exact_start(model: Transformer) -> None:
    """Put the target pathway where it changes nothing (module docstring)."""
    d = model.config.n_embd
    for name, p in model.target_pathway().items():
        if "adaLN" in name or model.config.target != "adaln":
            p.zero_()
    if model.config.target == "adaln" and model.config.pathway != "gated":  # gated: the gates are 1 + adaLN
        for block in model.transformer.h:  # rows of adaLN: shift, scale, gate (attention), then the MLP's
            bias = block.adaLN[-1].bias
            bias[2 * d:3 * d] = 1.0
            bias[5 * d:6 * d] = 1.0
