"""The transformer behind every variant: GPT, sigma-GPT, AO-GPT and the encoder-only MDM.

One class, one forward pass (`forward_slots`); the variant only decides how the *target position*
enters (see `config.TARGET_INJECTIONS`) and whether attention is causal.

Slot layout of the decoder for a sequence x of length n read in order sigma (docs/design.md):

    slot        0          1            ...  n-1                 (n: only for generation)
    content     [None]     x[s0]             x[s(n-2)]           x[s(n-1)]
    position    0          s0 + 1            s(n-2) + 1          s(n-1) + 1
    target      s0         s1                s(n-1)              none

so slot i predicts the token at original position ``order[:, i]`` from the tokens before it in the
order. A token id < 0 marks a slot without content: the decoder's `[None]` start slot and the
encoder's `[MASK]` slots share the learned `wnonee` embedding. A target equal to ``block_size``
means "no target" and embeds to zeros, as in the reference code.

Parameter names and order follow the paper's reference code, so its released checkpoints load as
they are (`aogpt.checkpoint`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from aogpt.attention import AttentionMask, attend
from aogpt.backbone import (  # noqa: F401 (RMSNorm, LayerNorm, rms_norm: their old import path)
    MLP,
    LayerNorm,
    RMSNorm,
    _RMSNormFunction,
    apply_rotary,
    fold_affine,
    head_rms_norm,
    make_norm,
    rms_norm,
    rotary_tables,
)
from aogpt.config import ModelConfig
from aogpt.errors import AOGPTError
from aogpt.functional import token_nll
from aogpt.kv_cache import Conditions, KVCache, PackedSlots
from aogpt.orders import left_to_right_slots
from aogpt.pathway import DELTA_NAMES, DeltaLinear, freeze_source, gated_forward, linear


def sinusoids(n: int, dim: int, std: float) -> torch.Tensor:
    """Transformer sinusoids for positions 0..n-1, scaled so entries have standard deviation `std`:
    nearby positions start with similar embeddings, a head start for learning where to attend."""
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    out = torch.zeros(n, dim, dtype=torch.float64)
    out[:, 0::2] = torch.sin(pos * freq)
    out[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return (out * std * math.sqrt(2)).float()


def embed_target(table: nn.Embedding, target: torch.Tensor) -> torch.Tensor:
    """Look up target positions; the sentinel ``len(table)`` ("no target") gives zeros."""
    return F.embedding(target, F.pad(table.weight, (0, 0, 0, 1)))


class SelfAttention(nn.Module):
    """Causal (or full) self-attention with the fused projection ``c_attn`` = [q; k; v]. With
    grouped-query attention (``n_kv_head`` < ``n_head``) k and v have fewer heads, each shared by
    ``n_head / n_kv_head`` query heads (repeated before attention; the KV cache holds them repeated)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        d = cfg.n_embd
        self.n_head, self.n_kv_head = cfg.n_head, cfg.kv_heads
        self.split = (d, self.n_kv_head * cfg.head_dim, self.n_kv_head * cfg.head_dim)
        self.c_attn = linear(cfg, d, sum(self.split), cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias)
        self.c_proj = linear(cfg, d, d, cfg.bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.qk_norm = cfg.qk_norm
        self.causal = cfg.causal
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.layer_idx = layer_idx

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | AttentionMask | None, cache: KVCache | None,
                cache_pos: int | torch.Tensor | PackedSlots | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None, kernel: str = "auto") -> torch.Tensor:
        return self.resid_dropout(self.c_proj(self.mix(self.c_attn(x), attn_mask, cache, cache_pos, rope, kernel)))

    def mix(self, qkv: torch.Tensor, attn_mask: torch.Tensor | AttentionMask | None, cache: KVCache | None,
            cache_pos: int | torch.Tensor | PackedSlots | None = None,
            rope: tuple[torch.Tensor, torch.Tensor] | None = None, kernel: str = "auto") -> torch.Tensor:
        """Attention over the projected [q; k; v] (B, S, .): (B, S, d), before the output projection (the
        part of the layer where slots read each other; a gated model projects its rows apart)."""
        B, S, _ = qkv.shape
        d = self.c_proj.in_features
        q, k, v = (t.view(B, S, -1, d // self.n_head) for t in qkv.split(self.split, dim=2))
        if self.qk_norm:  # over each head's vector, as the heads move to the front
            q = head_rms_norm(q, self.q_norm.weight, self.q_norm.eps)
            k = head_rms_norm(k, self.k_norm.weight, self.k_norm.eps)
        else:
            q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.transpose(1, 2)
        if rope is not None:
            q, k = apply_rotary(q, rope), apply_rotary(k, rope)
        if self.n_kv_head != self.n_head:
            k, v = (t.repeat_interleave(self.n_head // self.n_kv_head, dim=1) for t in (k, v))
        if cache is not None:
            y = cache.attend(self.layer_idx, q, k, v, cache_pos, attn_mask)
        else:
            y = attend(q, k, v, attn_mask, causal=self.causal, dropout=self.dropout if self.training else 0.0,
                       kind=kernel)
        return y.transpose(1, 2).reshape(B, S, d)


class Block(nn.Module):
    """Pre-norm transformer block. `cond` is the block's target information: the adaLN modulation
    (shift/scale/gate for attention and MLP) for AO-GPT, an embedding added to the block input for
    the every-block / per-block injections, or None. It may also be a function of the block that
    computes it: then it runs inside the block's forward, where an FSDP2-sharded block has its
    weights gathered."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.ln_1 = make_norm(cfg, cfg.n_embd)
        self.attn = SelfAttention(cfg, layer_idx)
        self.ln_2 = make_norm(cfg, cfg.n_embd)
        self.mlp = MLP(cfg)
        self.adaptive = cfg.target == "adaln"
        self.gated = cfg.pathway == "gated"
        if self.adaptive:
            self.adaLN = nn.Sequential(nn.SiLU(), nn.Linear(cfg.target_dim, 6 * cfg.n_embd))
        if cfg.target == "per-block":
            self.wtpe = nn.Embedding(cfg.block_size, cfg.n_embd)

    def condition(self, target_embedding: torch.Tensor) -> torch.Tensor:
        """adaLN rows (..., 6d): shift, scale, gate for attention then MLP, norms' affine folded in. In a
        gated model the gates are 1 + the layer's output: all of its pathway at zero is the source's block."""
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = self.adaLN(target_embedding).chunk(6, dim=-1)
        if self.gated:
            gate_a, gate_m = 1 + gate_a, 1 + gate_m
        return torch.cat([*fold_affine(self.ln_1, shift_a, scale_a), gate_a,
                          *fold_affine(self.ln_2, shift_m, scale_m), gate_m], dim=-1)

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None, attn_mask: torch.Tensor | AttentionMask | None,
                cache: KVCache | None, cache_pos: int | torch.Tensor | PackedSlots | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None, kernel: str = "auto") -> torch.Tensor:
        if callable(cond):
            cond = cond(self)
        if not self.adaptive:
            if cond is not None:
                x = x + cond
            x = x + self.attn(self.ln_1(x), attn_mask, cache, cache_pos, rope, kernel)
            return x + self.mlp(self.ln_2(x))
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = cond if isinstance(cond, tuple) else cond.chunk(6, -1)
        h = self.ln_1.modulate(x, shift_a, scale_a)
        x = torch.addcmul(x, gate_a, self.attn(h, attn_mask, cache, cache_pos, rope, kernel))
        h = self.ln_2.modulate(x, shift_m, scale_m)
        return torch.addcmul(x, gate_m, self.mlp(h))


class FinalLayer(nn.Module):
    """AO-GPT's output norm: RMSNorm modulated (shift, scale) by the target position."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_f = make_norm(cfg, cfg.n_embd)
        self.adaLN_final = nn.Sequential(nn.SiLU(), nn.Linear(cfg.target_dim, 2 * cfg.n_embd))

    def condition(self, target_embedding: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_final(target_embedding).chunk(2, dim=-1)
        return torch.cat(fold_affine(self.ln_f, shift, scale), dim=-1)

    def forward(self, x: torch.Tensor, cond: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
        shift, scale = cond if isinstance(cond, tuple) else cond.chunk(2, dim=-1)
        return self.ln_f.modulate(x, shift, scale)


@dataclass
class Kernels:
    """How a forward is computed, never what: the attention kernel (`aogpt.attention.KERNELS`), and
    whether an any-order read is laid out by target position (`Transformer.forward`). Switching them
    changes speed and rounding only; ``Kernels.reference()`` is the plain layout with torch's SDPA."""

    attention: str = "auto"
    by_target: bool = True

    @classmethod
    def reference(cls) -> Kernels:
        return cls(attention="sdpa", by_target=False)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.kernels = Kernels()
        d, concat = cfg.n_embd, cfg.target == "input-concat"
        parts: dict[str, nn.Module] = {"wte": nn.Embedding(cfg.vocab_size, d)}
        if cfg.positions == "learned":  # rotary positions rotate queries and keys instead (`aogpt.backbone`)
            parts["wpe"] = nn.Embedding(cfg.block_size + 1, d // 2 if concat else d)
        if cfg.target in ("input", "every-block", "input-concat"):
            parts["wtpe"] = nn.Embedding(cfg.block_size, d // 2 if concat else d)
        elif cfg.target == "adaln":
            parts["wtpe"] = nn.Embedding(cfg.block_size, cfg.target_dim)
        parts["wnonee"] = nn.Embedding(1, d)
        parts["drop"] = nn.Dropout(cfg.dropout)
        parts["h"] = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        if cfg.target == "adaln":
            parts["final_layer"] = FinalLayer(cfg)
        else:
            parts["ln_f"] = make_norm(cfg, d)
        self.transformer = nn.ModuleDict(parts)
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=cfg.head_bias)
        if cfg.tie_head:
            self.lm_head.weight = self.transformer.wte.weight
        self.reset_parameters()
        if cfg.pathway == "gated":  # the source's weights never train (`aogpt.pathway`)
            freeze_source(self)

    # ------------------------------------------------------------------ setup
    @classmethod
    def empty(cls, cfg: ModelConfig, device: torch.device | str = "cpu") -> Transformer:
        """A model with uninitialised storage (no random init): for loading weights into, fast."""
        with torch.device("meta"):
            model = cls(cfg)
        model.to_empty(device=device)
        if cfg.tie_head:
            model.lm_head.weight = model.transformer.wte.weight
        return model

    def reset_parameters(self) -> None:
        """GPT-2 initialisation; residual projections scaled by 1/sqrt(2 * n_layer); adaLN-Zero."""
        std = 0.02
        for name, p in self.named_parameters():
            if name.rpartition(".")[2] in DELTA_NAMES:
                continue  # a gated pathway's deltas: `DeltaLinear.reset_delta` below
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 1:  # norm weights
                nn.init.ones_(p)
            elif "adaLN" in name:
                nn.init.zeros_(p)  # every block starts as the identity, the head as plain RMSNorm
            elif name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.config.n_layer))
            else:
                nn.init.normal_(p, 0.0, std)
        if self.config.pos_init == "sinusoidal":
            tr = self.transformer
            with torch.no_grad():
                if "wpe" in tr:
                    tr.wpe.weight[1:].copy_(sinusoids(tr.wpe.weight.shape[0] - 1, tr.wpe.weight.shape[1], std))
                tables = [tr.wtpe] if "wtpe" in tr else []
                tables += [b.wtpe for b in tr.h if hasattr(b, "wtpe")]
                for table in tables:
                    table.weight.copy_(sinusoids(*table.weight.shape, std))
        for module in self.modules():
            if isinstance(module, DeltaLinear):
                module.reset_delta()

    def target_pathway(self) -> dict[str, nn.Parameter]:
        """The parameters that carry the target position (the position a slot must predict): the
        target tables (``wtpe``) and AO-GPT's adaLN layers. Empty for a left-to-right GPT or the encoder."""
        return {name: p for name, p in self.named_parameters() if "wtpe" in name or "adaLN" in name}

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    # ------------------------------------------------------------------ forward
    def embed(self, tokens: torch.Tensor, pos: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        tr = self.transformer
        tok = tr.wte(tokens.clamp(min=0))
        tok = torch.where((tokens < 0).unsqueeze(-1), tr.wnonee.weight, tok)
        if self.config.target == "input-concat":
            here, there = tr.wpe(pos), embed_target(tr.wtpe, target)  # a (1, S) target row serves every sequence
            return tok + torch.cat([here, there.expand(*here.shape[:-1], -1)], dim=-1)
        x = tok + tr.wpe(pos) if "wpe" in tr else tok
        if self.config.target == "input" and self.config.pathway != "gated":  # gated: the pathway's rows only
            x = x + embed_target(tr.wtpe, target)
        return x

    def _adaptive(self, module: nn.Module, target: torch.Tensor, table: torch.Tensor | None = None) -> torch.Tensor:
        """`module.condition(wtpe[target])`: adaLN rows per slot. They depend on the target position
        only: from the precomputed per-position `table` when one is given (generation), else computed
        per position and gathered when there are more slots than positions, else per slot."""
        if table is not None:
            return F.embedding(target, table)
        positions = F.pad(self.transformer.wtpe.weight, (0, 0, 0, 1))  # + the zero "no target" row
        if target.numel() > positions.shape[0]:
            # one gather per part (shift, scale, gate, ...): each slot's rows come out contiguous, and
            # the backward scatters each part's gradient without first concatenating them
            table = module.condition(positions)
            parts = table.view(table.shape[0], -1, self.config.n_embd).unbind(1)
            return tuple(F.embedding(target, part) for part in parts)
        return module.condition(F.embedding(target, positions))

    @torch.no_grad()
    def conditions(self) -> Conditions | None:
        """The per-position adaLN tables of the current weights (None unless AO-GPT's adaLN): what a
        KV cache is set up with, so decode steps look the modulation up instead of computing it."""
        if self.config.target != "adaln":
            return None
        positions = F.pad(self.transformer.wtpe.weight, (0, 0, 0, 1))
        return Conditions([b.condition(positions) for b in self.transformer.h],
                          self.transformer.final_layer.condition(positions))

    def _block_conditions(self, target: torch.Tensor, conditions: Conditions | None) -> list[Any]:
        kind, blocks = self.config.target, self.transformer.h
        if kind == "adaln":
            if conditions is not None:
                return [F.embedding(target, table) for table in conditions.blocks]
            return [functools.partial(self._adaptive, target=target)] * len(blocks)  # computed by each block
        if kind == "every-block":
            shared = embed_target(self.transformer.wtpe, target)
            return [shared] * len(blocks)
        if kind == "per-block":
            return [lambda block: embed_target(block.wtpe, target)] * len(blocks)
        return [None] * len(blocks)

    def forward_slots(self, tokens: torch.Tensor, pos: torch.Tensor, target: torch.Tensor | None = None, *,
                      attn_mask: torch.Tensor | None = None, cache: KVCache | None = None,
                      cache_pos: int | torch.Tensor | PackedSlots | None = None, select: torch.Tensor | None = None,
                      conditions: Conditions | None = None, gate: torch.Tensor | None = None) -> torch.Tensor:
        """Logits for arbitrary slots: the one forward pass every caller goes through.

        tokens, pos, target: (B, S) slot contents (< 0: no content), original positions (0 = start),
        target positions (``block_size``: none). attn_mask: bool (B, 1, S, span), True = may attend;
        None means causal (decoder) or full (encoder) attention over these slots. cache: the static
        KV cache (`setup_cache`) to write this forward's keys into at `cache_pos` (an int start
        column, (B, S) columns, or `PackedSlots` for a packed (1, R) ragged step) and attend over
        (`aogpt.kv_cache`). select: (B, R) slot indices
        whose logits are wanted (the head is the costliest layer of a small model). conditions:
        precomputed adaLN tables (default: the cache's, else computed from the weights now). gate: in a
        model with a gated pathway (`aogpt.pathway`), (B, S) bool, True for the slots that do not read
        left to right (`aogpt.orders.left_to_right_slots`); None: the slots are one chain from the start
        slot, and the gate follows from their positions and targets (a cached step must pass it).
        Ignored by other models.
        """
        if target is None:
            target = torch.full_like(pos, self.config.block_size)
        if cache is not None:
            if cache_pos is None:
                raise AOGPTError("a forward with a KV cache needs cache_pos (where its keys go)", "pass cache_pos")
            conditions = conditions if conditions is not None else cache.conditions
        x = self.transformer.drop(self.embed(tokens, pos, target))
        cfg = self.config
        rope = rotary_tables(pos, cfg.head_dim, cfg.rope_theta) if cfg.positions == "rotary" else None
        kernel = self.kernels.attention
        if cfg.pathway == "gated":
            if gate is None:
                if cache is not None:
                    raise AOGPTError("a gated model's cached step needs each slot's gate",
                                     "pass gate= (aogpt.orders.left_to_right_slots)")
                gate = ~left_to_right_slots(pos.expand(tokens.shape), target.expand(tokens.shape))
            return gated_forward(self, x, target, gate.expand(tokens.shape), attn_mask, cache, cache_pos, select,
                                 conditions, rope, kernel)
        for block, cond in zip(self.transformer.h, self._block_conditions(target, conditions), strict=True):
            x = block(x, cond, attn_mask, cache, cache_pos, rope, kernel)
        if select is not None:
            x = x.gather(1, select.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
            target = target.expand(select.shape[0], -1).gather(1, select)
        if self.config.target == "adaln":
            final = self.transformer.final_layer
            x = final(x, self._adaptive(final, target, None if conditions is None else conditions.final))
        else:
            x = self.transformer.ln_f(x)
        return self.lm_head(x)

    def slots_for_order(self, idx: torch.Tensor, order: torch.Tensor, with_last_slot: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The (tokens, pos, target) slots of the decoder reading `idx` in `order` (layout above)."""
        B, n = idx.shape
        start = torch.full((B, 1), -1, dtype=idx.dtype, device=idx.device)
        zero = torch.zeros((B, 1), dtype=order.dtype, device=order.device)
        none = torch.full((B, 1), self.config.block_size, dtype=order.dtype, device=order.device)
        tokens = torch.cat([start, idx.gather(1, order)], dim=1)
        pos = torch.cat([zero, order + 1], dim=1)
        target = torch.cat([order, none], dim=1)
        if not with_last_slot:
            tokens, pos, target = tokens[:, :n], pos[:, :n], target[:, :n]
        return tokens, pos, target

    def forward(self, idx: torch.Tensor, order: torch.Tensor | None = None, *, mask: torch.Tensor | None = None,
                with_last_slot: bool = False, logits: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Decoder: read `idx` (B, n) in `order` (B, n; default left to right) in one causal pass.

        Returns logits (B, n, V), row i predicting the token at ``order[:, i]`` from the tokens at
        ``order[:, :i]`` (plus the target-less last slot if `with_last_slot`), and the per-step
        losses (B, n) = -log p(x[order[:, i]] | ...), in at least float32. Their sum over i is the
        exact negative log-likelihood of the sequence under this order. `logits=False` returns None
        for the logits (training needs the losses only; any-order reads then skip reordering them).

        Encoder-only MDM: `mask` (B, n) bool marks the hidden positions; returns logits (B, n, V) at
        every position and losses (B, n) = -log p(x_j | unmasked tokens) (meaningful where masked).
        """
        cfg = self.config
        B, n = idx.shape
        if n > cfg.block_size:
            raise AOGPTError(f"sequence length {n} exceeds the model's block size {cfg.block_size}",
                             "use shorter windows")
        if not cfg.causal:
            if mask is None or order is not None:
                raise AOGPTError("the encoder-only MDM reads a masked sequence, not an order", "pass mask=")
            pos = torch.arange(1, n + 1, device=idx.device).expand(B, n)
            logits = self.forward_slots(idx.masked_fill(mask, -1), pos)
            return logits, token_nll(logits, idx)
        if mask is not None:
            raise AOGPTError(f"variant {cfg.variant} reads an order, not a mask", "pass order=")
        if order is None:
            order = torch.arange(n, device=idx.device).expand(B, n)
        elif cfg.target == "none" and not torch.compiler.is_compiling() and not bool(
                (order == torch.arange(n, device=order.device)).all()):  # (a data-dependent check: eager only)
            raise AOGPTError(f"variant {cfg.variant} reads left to right only", "use order l2r")
        if cfg.target != "none" and self.kernels.by_target and cfg.pathway != "gated":
            rows = self.forward_by_target(idx, order, with_last_slot)
            losses = token_nll(rows[:, :n], idx).gather(1, order)  # slot t predicted the token at order[:, t]
            if not logits:
                return None, losses
            where = order if not with_last_slot else torch.cat([order, order.new_full((B, 1), n)], dim=1)
            return rows.gather(1, where.unsqueeze(-1).expand(-1, -1, rows.shape[-1])), losses
        out = self.forward_slots(*self.slots_for_order(idx, order, with_last_slot))
        return (out if logits else None), token_nll(out[:, :n], idx.gather(1, order))

    def forward_by_target(self, idx: torch.Tensor, order: torch.Tensor, with_last_slot: bool = False) -> torch.Tensor:
        """The slots of reading `idx` in `order`, laid out by the position each predicts: row p is the
        slot whose target is p (it holds the token read just before x[p], or the start token), and it
        attends to the rows read no later than itself. The same function as the slot layout of
        `slots_for_order` (the rows are a permutation of its slots and the mask follows them), but
        every sequence's targets are now 0..n-1 in that order: the target's modulation is one
        (1, n, d) row per position broadcast over the batch, instead of a gather per slot whose
        backward scatters. Returns logits (B, n, V), row p predicting x[p] (with `with_last_slot`, a
        last row n with no target, holding the last token read)."""
        B, n = idx.shape
        steps = torch.arange(n, device=idx.device)
        rank = torch.empty_like(order).scatter_(1, order, steps.expand(B, n))  # rank[b, p]: when p is read
        before = order.gather(1, (rank - 1).clamp(min=0))  # the position read just before p
        first = rank == 0
        tokens = idx.gather(1, before).masked_fill(first, -1)
        pos = (before + 1).masked_fill(first, 0)
        target = steps[None]
        if with_last_slot:
            last = order[:, -1:]
            tokens = torch.cat([tokens, idx.gather(1, last)], dim=1)
            pos = torch.cat([pos, last + 1], dim=1)
            target = torch.cat([target, target.new_full((1, 1), self.config.block_size)], dim=1)
            rank = torch.cat([rank, rank.new_full((B, 1), n)], dim=1)
        allowed = (rank[:, None, :] <= rank[:, :, None]).unsqueeze(1)  # (B, 1, rows, rows)
        return self.forward_slots(tokens, pos, target, attn_mask=AttentionMask(allowed))

    def setup_cache(self, batch: int, capacity: int | None = None, attention: str = "sdpa") -> KVCache:
        """A static KV cache for `batch` sequences of up to `capacity` slots (default: the context
        plus the start slot and one scratch column), with the adaLN tables of the current weights;
        `attention` picks the kernel decode steps use (`aogpt.kv_cache.attention`)."""
        cfg, p = self.config, next(self.parameters())
        return KVCache(cfg.n_layer, batch, cfg.n_head, capacity or cfg.block_size + 2, cfg.head_dim, p.device,
                       p.dtype, self.conditions(), attention)
