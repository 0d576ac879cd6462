"""The fast decode path of a model with a gated pathway (`aogpt.pathway`).

A gated model is two plain models that share a KV cache: its source, for the slots that read left
to right, and the source merged with its pathway (every linear layer W + dW, the norms modulated
by the adaLN tables, the target table at the input for sigma-GPT), for the others. This runner
holds the fast path's kernels for both (`aogpt.decode.runner._Layer`, measured once by
`aogpt.decode.choice`) and computes each row of a step with its own group's kernels: a step whose
rows all read left to right costs what the source's step costs, a step whose rows all go through
the pathway what an AO-GPT of this size costs (merged weights: one product per layer and row),
and a mixed step gathers the two groups' rows around the row-wise parts (attention sees all rows,
in the step's own layout, as the model's forward does). A row's arithmetic depends only on its
group, never on which rows share its step: generation stays batch invariant bit for bit.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from aogpt.decode.choice import Choice
from aogpt.decode.kernels import INVARIANCE_ROWS, LinearKernel, row_invariant
from aogpt.decode.runner import SmallStepModel, _Layer
from aogpt.pathway import RowSplit


def _merged(block: nn.Module) -> Any:
    """A block's weights as the pathway's rows see them (W + dW), in the shape `_Layer` reads."""
    def lin(layer: Any) -> Any:
        return SimpleNamespace(weight=layer.pathway_weight(), bias=layer.bias, in_features=layer.in_features,
                               out_features=layer.out_features)

    a, m = block.attn, block.mlp
    attn = SimpleNamespace(c_attn=lin(a.c_attn), c_proj=lin(a.c_proj), qk_norm=a.qk_norm,
                           **({"q_norm": a.q_norm, "k_norm": a.k_norm} if a.qk_norm else {}))
    return SimpleNamespace(attn=attn, mlp=SimpleNamespace(c_fc=lin(m.c_fc), c_proj=lin(m.c_proj), gelu=m.gelu),
                           ln_1=block.ln_1, ln_2=block.ln_2)


class GatedStepModel(SmallStepModel):
    """`SmallStepModel` for a gated model (module docstring): ``layers`` are the source's kernels,
    ``pathway_layers`` the merged ones; a step needs its rows' gates (`aogpt.orders.step_gates`)."""

    def __init__(self, model: nn.Module, choice: Choice):
        super().__init__(model, choice)
        cfg, tr = self.config, model.transformer
        with torch.no_grad():
            self.pathway_layers = [_Layer(_merged(block), choice.linear, cfg.head_dim ** -0.5) for block in tr.h]
            self.pathway_targets, self.targets = self.targets, None  # sigma: the table is the pathway's rows'
            self.source_final = _final_norm(model)

    def decode_linears(self) -> dict[str, LinearKernel]:
        out = super().decode_linears()
        for i, layer in enumerate(self.pathway_layers):
            out.update({f"transformer.h.{i}.{name} (pathway)": k for name, k in layer.linears().items()})
        return out

    def row_invariant(self) -> bool:
        if not super().row_invariant():
            return False
        p = next(self.parameters())
        calls = []
        for layer in self.pathway_layers:  # as a step calls them: plain (AO-GPT's gated residuals) or with the add
            d = layer.proj.out_features
            zeros = torch.zeros(max(INVARIANCE_ROWS), d, dtype=p.dtype, device=p.device)
            calls += [(layer.qkv, d), (lambda x, k=layer.fc, a=layer.gelu: k.gelu(x, a), d), (layer.proj, d),
                      (layer.out, layer.out.in_features),
                      (lambda x, k=layer.proj, z=zeros: k.add(x, z[:x.shape[0]]), d),
                      (lambda x, k=layer.out, z=zeros: k.add(x, z[:x.shape[0]]), layer.out.in_features)]
        return all(row_invariant(f, inp, p.dtype, p.device) for f, inp in calls)

    def forward_slots(self, tokens: torch.Tensor, pos: torch.Tensor, target: torch.Tensor | None = None, *,
                      attn_mask: torch.Tensor | None = None, cache: Any = None, cache_pos: Any = None,
                      select: torch.Tensor | None = None, conditions: Any = None,
                      gate: torch.Tensor | None = None) -> torch.Tensor:
        """`Transformer.forward_slots` of the gated model for a step with a KV cache (and its gates); any
        other call goes to the model itself."""
        if cache is None or gate is None:
            return self.model.forward_slots(tokens, pos, target, attn_mask=attn_mask, cache=cache,
                                            cache_pos=cache_pos, select=select, conditions=conditions, gate=gate)
        B, S = tokens.shape
        cfg = self.config
        if target is None:
            target = torch.full_like(pos, cfg.block_size)
        tgt = target.expand(B, S).reshape(-1)
        split = RowSplit(gate.expand(B, S))
        x = F.embedding(tokens.reshape(-1) + 1, self.tokens)
        if self.positions is not None:
            x = x + F.embedding(pos.reshape(-1), self.positions)
        x0, x1 = split.split(x.view(B, S, -1))
        cond = None
        if x1 is not None:
            t1 = split.select(tgt.view(B, S))
            if self.pathway_targets is not None:
                x1 = x1 + F.embedding(t1, self.pathway_targets)
            if self.adaptive:
                cond = F.embedding(t1, self.cond_table)
        H, D = self.heads, self.head_dim
        d = H * D
        for i, (src, path) in enumerate(zip(self.layers, self.pathway_layers, strict=True)):
            c = None if cond is None else cond[:, 6 * d * i:6 * d * (i + 1)]
            h0 = None if x0 is None else src.qkv(src.ln_1(x0))
            h1 = None
            if x1 is not None:
                h1 = path.qkv(path.ln_1.modulate(x1, c[:, :d], c[:, d:2 * d]) if c is not None else path.ln_1(x1))
            qkv = split.rows(split.join(h0, h1)).view(-1, 3, H, D)
            if src.qk_norm is not None:  # the source's query/key norms: the same for both groups
                from aogpt.backbone import rms_norm

                torch.mul(rms_norm(qkv[:, :2], None, src.qk_eps), src.qk_norm, out=qkv[:, :2])
            y0, y1 = split.split(cache.attend_rows(i, qkv, cache_pos, attn_mask).view(B, S, -1))
            if x0 is not None:
                x0 = src.proj.add(y0, x0)
                x0 = src.out.add(src.fc.gelu(src.ln_2(x0), src.gelu), x0)
            if x1 is not None:
                if c is not None:
                    x1 = torch.addcmul(x1, c[:, 2 * d:3 * d], path.proj(y1))
                    h = path.ln_2.modulate(x1, c[:, 3 * d:4 * d], c[:, 4 * d:5 * d])
                    x1 = torch.addcmul(x1, c[:, 5 * d:], path.out(path.fc.gelu(h, path.gelu)))
                else:
                    x1 = path.proj.add(y1, x1)
                    x1 = path.out.add(path.fc.gelu(path.ln_2(x1), path.gelu), x1)
        x = split.join(x0, x1)  # (B, S, d)
        Q = S
        if select is not None:
            Q = select.shape[1]
            x = x.gather(1, select.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
            tgt, gate = tgt.view(B, S).gather(1, select), gate.expand(B, S).gather(1, select)
            split = RowSplit(gate)
        h0, h1 = split.split(x)
        if h0 is not None:
            h0 = self.source_final(h0)
        if h1 is not None:
            if self.adaptive:  # the final modulation of the pathway's rows only
                fc = F.embedding(split.select(tgt.view(B, Q)), self.cond_table[:, 6 * d * len(self.layers):])
                h1 = self.final.modulate(h1, fc[:, :d], fc[:, d:])
            else:
                h1 = self.final(h1)
        return self.head(split.rows(split.join(h0, h1))).view(B, Q, -1)


def _final_norm(model: nn.Module) -> Any:
    """The source's final norm with its affine part (AO-GPT keeps it in its final layer)."""
    from aogpt.decode.runner import _Norm

    tr = model.transformer
    return _Norm(tr.final_layer.ln_f if "final_layer" in tr else tr.ln_f)


__all__ = ["GatedStepModel"]
