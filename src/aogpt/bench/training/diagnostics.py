"""What holds an any-order decoder on the unigram plateau: measurements of its target pathway.

A decoder trained on uniform orders must learn, at every slot, *where* the token it predicts sits
(the target position) and look there. Until it does, the best it can do is the unigram law: the
"plateau". These functions measure, on a fixed batch, what the recipe sweep (`aogpt.bench.training.recipe`)
tracks per step to see why a run stays there or leaves:

- `modulation`: the size of AO-GPT's adaLN outputs (shift, scale, gate, for attention and MLP),
  and of their part that depends on the target position (what the block can use to find it);
- `gradients`: the norm of the gradient reaching the target tables, the adaLN weights and all weights;
- `neighbour_attention`: how sharply each layer's attention looks at the target's neighbours
  (positions within a radius of the target), as a lift over blind attention: the attention mass on
  those keys divided by their share of the visible keys. 1 is blind; a model that found the target
  looks there many times more than chance;
- `unigram_bpb`: the plateau itself, the bits per byte of the training split's unigram law on the
  held-out windows.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from aogpt.families import unwrap

MODULATION_PARTS = ("shift_attn", "scale_attn", "gate_attn", "shift_mlp", "scale_mlp", "gate_mlp")


@torch.no_grad()
def modulation(model: nn.Module) -> dict[str, float]:
    """RMS of each adaLN output over positions and channels, averaged over blocks (`<part>`), and the
    RMS of its deviation from its mean over positions (`<part>/target`: what the target position changes);
    also the target table's RMS. Empty for models without adaLN."""
    core = unwrap(model)
    tr = core.transformer
    if core.config.target != "adaln":
        return {}
    table = tr.wtpe.weight.float()
    out = {"target_table": float(table.pow(2).mean().sqrt())}
    for block in tr.h:
        for name, part in zip(MODULATION_PARTS, block.adaLN(table).float().chunk(6, dim=-1), strict=True):
            out[name] = out.get(name, 0.0) + float(part.pow(2).mean().sqrt()) / len(tr.h)
            varying = part - part.mean(0, keepdim=True)
            out[f"{name}/target"] = out.get(f"{name}/target", 0.0) + float(varying.pow(2).mean().sqrt()) / len(tr.h)
    return out


def gradients(model: nn.Module, idx: torch.Tensor, order: torch.Tensor) -> dict[str, float]:
    """Gradient norms of the mean loss of `idx` read in `order`: on the target tables (`grad/target_table`),
    the adaLN weights (`grad/modulation`) and all parameters (`grad/all`). Leaves `.grad` untouched."""
    core = unwrap(model)
    named = dict(core.named_parameters())
    loss = core(idx, order)[1].mean()
    grads = dict(zip(named, torch.autograd.grad(loss, list(named.values()), allow_unused=True), strict=True))

    def norm(names: list[str]) -> float:
        return math.sqrt(sum(float(grads[n].float().pow(2).sum()) for n in names if grads[n] is not None))

    return {"grad/target_table": norm([n for n in named if "wtpe" in n]),
            "grad/modulation": norm([n for n in named if "adaLN" in n and n.endswith("weight")]),
            "grad/all": norm(list(named))}


@torch.no_grad()
def neighbour_attention(model: nn.Module, idx: torch.Tensor, order: torch.Tensor, radius: int = 1) -> list[float]:
    """Per layer, the lift of attention on the target's neighbours (module docstring), of the head that
    looks there most, averaged over the slots that can see at least one neighbour."""
    core = unwrap(model)
    inputs: list[tuple[nn.Module, torch.Tensor]] = []
    # attention's input: what its fused projection c_attn reads (a block calls the pieces of attention, not
    # the attention module itself)
    hooks = [block.attn.c_attn.register_forward_pre_hook(
        lambda m, args, attn=block.attn: inputs.append((attn, args[0]))) for block in core.transformer.h]
    try:
        tokens, pos, target = core.slots_for_order(idx, order)
        core.forward_slots(tokens, pos, target)
    finally:
        for hook in hooks:
            hook.remove()
    B, S = tokens.shape
    content = pos - 1  # the original position of each slot's token (-1: the start slot)
    causal = torch.ones(S, S, dtype=torch.bool, device=idx.device).tril()
    near = ((content[:, None, :] - target[:, :, None]).abs() <= radius) & causal  # (B, query, key)
    share = near.sum(-1) / causal.sum(-1)
    seen = near.any(-1)
    lifts = []
    for attn, h in inputs:
        d = h.shape[-1]
        q, k, _ = (t.view(B, S, attn.n_head, -1).transpose(1, 2) for t in attn.c_attn(h).split(d, dim=2))
        if attn.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        weights = ((q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1]))
        weights = weights.masked_fill(~causal, float("-inf")).softmax(-1)
        lift = (weights * near[:, None]).sum(-1) / share[:, None].clamp(min=1e-9)  # (B, H, S)
        per_head = (lift * seen[:, None]).sum((0, 2)) / seen.sum().clamp(min=1)
        lifts.append(float(per_head.max()))
    return lifts


def unigram_bpb(data, windows: torch.Tensor) -> float:
    """Bits per byte of `windows` under the training split's unigram law (add-one smoothed): the
    level an any-order model sits at before it uses its context."""
    counts = torch.bincount(torch.as_tensor(data.split("train").astype("int64")), minlength=data.vocab_size)
    logp = torch.log((counts.double() + 1) / (counts.sum() + len(counts)))
    nats = float(-logp[windows.reshape(-1)].sum())
    return nats / float(data.token_byte_lengths()[windows].sum()) / math.log(2)
