"""`SmallStepModel`: a model's inference form for KV-cache decode steps, built for a few rows.

It computes exactly `Transformer.forward_slots` for a step with a cache (the same function: every
test oracle that holds for the model holds for it), with fewer and cheaper operations:

- the step is rows (R, d) from the embedding to the head, whatever its layout (a uniform (B, S)
  block or packed ragged rows): no (B, S, d) reshapes around the linear layers;
- the linear layers are the kernels `aogpt.decode.choice` measured fastest on this machine
  (`aogpt.decode.kernels`), with the MLP's GELU and the residual adds fused into the products where
  the kernel can;
- the attention scale 1/sqrt(head_dim) is folded into the query weights (or the query norm's
  weight), and q/k/v stay one (R, 3, H, D) tensor: `aogpt.kv_cache.KVCache.attend_rows` writes keys
  and values with one copy and attends with the kernel the choice measured;
- tokens without content (the start slot) read row 0 of one embedding table ([no-content; tokens]),
  so the embedding is one lookup; AO-GPT's per-layer adaLN tables are stacked into one table,
  looked up once per step for every layer and the final norm.

A forward without a cache (the recompute baseline) runs on the model itself, and models whose
blocks this path does not cover keep the reference path (`supports`: rotary positions,
grouped-query attention, SwiGLU, target embeddings added in every block).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from aogpt.backbone import LayerNorm, rms_norm
from aogpt.decode.choice import Choice, Shapes, choose
from aogpt.decode.kernels import INVARIANCE_ROWS, LinearKernel, row_invariant
from aogpt.kv_cache import KVCache

ATTENTION_SETTINGS = {"sdpa": ("sdpa", None), "explicit": ("matmul", None), "sdpa-fp32": ("sdpa", torch.float32)}


def supports(model: nn.Module) -> bool:
    """Whether the fast path computes this model's decode steps (else the reference path does): a CPU
    model (the path is built and measured for CPUs; a GPU keeps the reference path and its CUDA
    graphs) whose blocks it covers."""
    cfg = model.config
    return (next(model.parameters()).device.type == "cpu" and cfg.causal and cfg.positions == "learned"
            and cfg.target in ("none", "input", "adaln") and cfg.kv_heads == cfg.n_head
            and cfg.mlp in ("gelu", "gelu-tanh"))


class _Norm:
    """A block's pre-norm: LayerNorm or RMSNorm, with its affine part, or modulated by adaLN rows."""

    def __init__(self, norm: nn.Module):
        self.layer = isinstance(norm, LayerNorm)
        self.weight, self.bias, self.eps = norm.weight, norm.bias, norm.eps
        self.shape = (norm.weight.shape[0],)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.layer:
            return F.layer_norm(x, self.shape, self.weight, self.bias, self.eps)
        return rms_norm(x, self.weight, self.eps)

    def modulate(self, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        plain = F.layer_norm(x, self.shape, None, None, self.eps) if self.layer else rms_norm(x, None, self.eps)
        return torch.addcmul(shift, plain, scale)


class _Layer:
    """One block's prepared weights."""

    def __init__(self, block: nn.Module, kind: dict[str, str], scale: float):
        attn, mlp = block.attn, block.mlp
        self.ln_1, self.ln_2 = _Norm(block.ln_1), _Norm(block.ln_2)
        d = attn.c_proj.in_features
        w = attn.c_attn.weight.detach()
        b = None if attn.c_attn.bias is None else attn.c_attn.bias.detach()
        self.qk_norm = None
        if attn.qk_norm:  # the scale goes into the query norm's weight
            self.qk_norm = torch.stack([attn.q_norm.weight.detach() * scale, attn.k_norm.weight.detach()])[:, None]
            self.qk_eps = attn.q_norm.eps
        else:  # into the query rows of the fused projection
            w = torch.cat([w[:d] * scale, w[d:]])
            b = None if b is None else torch.cat([b[:d] * scale, b[d:]])
        self.qkv = LinearKernel(w, b, kind["qkv"])
        self.proj = LinearKernel(attn.c_proj.weight, attn.c_proj.bias, kind["proj"])
        self.fc = LinearKernel(mlp.c_fc.weight, mlp.c_fc.bias, kind["fc"])
        self.out = LinearKernel(mlp.c_proj.weight, mlp.c_proj.bias, kind["out"])
        self.gelu = mlp.gelu.approximate

    def linears(self) -> dict[str, LinearKernel]:
        return {"attn.c_attn": self.qkv, "attn.c_proj": self.proj, "mlp.c_fc": self.fc, "mlp.c_proj": self.out}


class SmallStepModel:
    """The fast decode path of `model` (module docstring). Shares the model's parameters (nothing is
    trained through it: it is built from the weights as they are, like `aogpt.inference`'s packed
    copy, and rebuilt when they change)."""

    def __init__(self, model: nn.Module, choice: Choice):
        # the model only weakly: `aogpt.inference` keeps this runner in a table keyed weakly by the model
        self._model, self.choice = weakref.ref(model), choice
        self.ragged_layout = choice.layout
        cfg = self.config = model.config
        tr = model.transformer
        self.heads, self.head_dim = cfg.n_head, cfg.head_dim
        with torch.no_grad():
            self.tokens = torch.cat([tr.wnonee.weight, tr.wte.weight]).detach()  # row 0: no content
            self.positions = tr.wpe.weight.detach() if "wpe" in tr else None
            self.targets = F.pad(tr.wtpe.weight, (0, 0, 0, 1)).detach() if cfg.target == "input" else None
            self.adaptive = cfg.target == "adaln"
            self.layers = [_Layer(block, choice.linear, cfg.head_dim ** -0.5) for block in tr.h]
            if self.adaptive:
                cond = model.conditions()
                self.cond_table = torch.cat([*cond.blocks, cond.final], dim=1).contiguous()
                self.final = _Norm(tr.final_layer.ln_f)
            else:
                self.final = _Norm(tr.ln_f)
            self.head = LinearKernel(model.lm_head.weight, model.lm_head.bias, choice.linear["head"])

    # ---------------------------------------------------------------- what the samplers use of a model
    @property
    def model(self) -> nn.Module:
        """The model this runner computes (calls without a cache run on it)."""
        model = self._model()
        if model is None:
            raise RuntimeError("the model of this decode runner no longer exists")
        return model

    def parameters(self):
        return self.model.parameters()

    def conditions(self):
        return self.model.conditions()

    def setup_cache(self, batch: int, capacity: int | None = None, attention: str = "auto") -> KVCache:
        """A KV cache whose few-query kernel and dtype are the measured choice (`attention` "auto"), or
        those an explicit kernel names (sdpa, explicit = batched products, sdpa-fp32)."""
        cfg, p = self.config, next(self.parameters())
        kernel, store = ATTENTION_SETTINGS.get(attention, (self.choice.attention, self.choice.store))
        return KVCache(cfg.n_layer, batch, cfg.n_head, capacity or cfg.block_size + 2, cfg.head_dim, p.device,
                       p.dtype, None, "sdpa", kernel, store or self.choice.store)

    def decode_linears(self) -> dict[str, LinearKernel]:
        """Every linear kernel of a step, by the module name it stands for (row-invariance checks)."""
        out = {f"transformer.h.{i}.{name}": k for i, layer in enumerate(self.layers)
               for name, k in layer.linears().items()}
        return {**out, "lm_head": self.head}

    def row_invariant(self) -> bool:
        """Whether every kernel, as a step calls it (fused GELU and residual adds included), gives a
        row the same bits whatever the number of rows (`aogpt.decode.kernels.row_invariant`)."""
        p = next(self.parameters())
        calls = []
        for layer in self.layers:
            d = layer.proj.out_features
            zeros = torch.zeros(max(INVARIANCE_ROWS), d, dtype=p.dtype, device=p.device)
            calls += [(layer.qkv, d), (lambda x, k=layer.fc, a=layer.gelu: k.gelu(x, a), d),
                      (lambda x, k=layer.proj, z=zeros: k.add(x, z[:x.shape[0]]), d),
                      (lambda x, k=layer.out, z=zeros: k.add(x, z[:x.shape[0]]), layer.out.in_features)]
        calls.append((self.head, self.head.in_features))
        return all(row_invariant(f, inp, p.dtype, p.device) for f, inp in calls)

    def weight_bytes(self) -> int:
        """Bytes of weights a step reads: every linear kernel's (the embedding rows are negligible)."""
        return sum(k.nbytes for k in self.decode_linears().values())

    # ---------------------------------------------------------------- the step
    def forward_slots(self, tokens: torch.Tensor, pos: torch.Tensor, target: torch.Tensor | None = None, *,
                      attn_mask: torch.Tensor | None = None, cache: Any = None, cache_pos: Any = None,
                      select: torch.Tensor | None = None, conditions: Any = None) -> torch.Tensor:
        """`Transformer.forward_slots` (same arguments, same result) for a step with a KV cache; any
        other call goes to the reference model."""
        if cache is None:
            return self.model.forward_slots(tokens, pos, target, attn_mask=attn_mask, cache=cache,
                                            cache_pos=cache_pos, select=select, conditions=conditions)
        B, S = tokens.shape
        cfg = self.config
        tok = tokens.reshape(-1)
        if target is None:
            target = torch.full_like(pos, cfg.block_size)
        tgt = target.expand(B, S).reshape(-1)
        x = F.embedding(tok + 1, self.tokens)
        if self.positions is not None:
            x = x + F.embedding(pos.reshape(-1), self.positions)
        if self.targets is not None:
            x = x + F.embedding(tgt, self.targets)
        cond = F.embedding(tgt, self.cond_table) if self.adaptive else None
        R, H, D = x.shape[0], self.heads, self.head_dim
        d = H * D
        for i, layer in enumerate(self.layers):
            if cond is not None:
                c = cond[:, 6 * d * i:6 * d * (i + 1)]
                h = layer.ln_1.modulate(x, c[:, :d], c[:, d:2 * d])
            else:
                h = layer.ln_1(x)
            qkv = layer.qkv(h).view(R, 3, H, D)
            if layer.qk_norm is not None:
                torch.mul(rms_norm(qkv[:, :2], None, layer.qk_eps), layer.qk_norm, out=qkv[:, :2])
            y = cache.attend_rows(i, qkv, cache_pos, attn_mask)
            if cond is not None:
                x = torch.addcmul(x, c[:, 2 * d:3 * d], layer.proj(y))
                h = layer.ln_2.modulate(x, c[:, 3 * d:4 * d], c[:, 4 * d:5 * d])
                x = torch.addcmul(x, c[:, 5 * d:], layer.out(layer.fc.gelu(h, layer.gelu)))
            else:
                x = layer.proj.add(y, x)
                x = layer.out.add(layer.fc.gelu(layer.ln_2(x), layer.gelu), x)
        Q = S
        if select is not None:  # the head only for the selected rows (select indexes each sequence's S slots)
            Q = select.shape[1]
            rows = select.reshape(-1) if B == 1 else \
                (select + torch.arange(0, B * S, S, device=select.device)[:, None]).reshape(-1)
            x = x.index_select(0, rows)
            if cond is not None:
                cond = cond[:, 6 * d * len(self.layers):].index_select(0, rows)
        elif cond is not None:
            cond = cond[:, 6 * d * len(self.layers):]
        x = self.final(x) if cond is None else self.final.modulate(x, cond[:, :d], cond[:, d:])
        return self.head(x).view(B, Q, -1)


def build(model: nn.Module, cls: type | None = None) -> SmallStepModel:
    """The fast path for `model` (it must `support` it), with the kernels `aogpt.decode.choice`
    measured for its shapes; calls without a cache run on the model itself. `cls`: the runner class
    (a gated model's: `aogpt.decode.gated.GatedStepModel`)."""
    cfg = model.config
    p = next(model.parameters())
    shapes = Shapes(cfg.n_embd, model.transformer.h[0].mlp.c_fc.out_features, cfg.vocab_size, cfg.n_head,
                    cfg.head_dim, cfg.block_size + 2)
    return (cls or SmallStepModel)(model, choose(shapes, p.dtype, p.device))


__all__ = ["SmallStepModel", "build", "supports"]
