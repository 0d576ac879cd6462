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

from aogpt.attention import AttentionMask
from aogpt.backbone import (  # noqa: F401 (RMSNorm, LayerNorm, SelfAttention: their old import path)
    MLP,
    LayerNorm,
    RMSNorm,
    SelfAttention,
    _RMSNormFunction,
    dropping,
    fold_affine,
    make_norm,
    project,
    rotary_tables,
)
from aogpt.config import ModelConfig
from aogpt.errors import AOGPTError
from aogpt.functional import token_nll
from aogpt.kv_cache import Conditions, KVCache, PackedSlots, cache_settings
from aogpt.orders import left_to_right_slots
from aogpt.pathway import DELTA_NAMES, DeltaLinear, RowSplit, freeze_source, side


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


class Block(nn.Module):
    """Pre-norm transformer block. `cond` is the block's target information: the adaLN modulation
    (shift/scale/gate for attention and MLP) for AO-GPT, an embedding added to the block input for
    the every-block / per-block injections, or None. It may also be a function of the block that
    computes it: then it runs inside the block's forward, where an FSDP2-sharded block has its
    weights gathered.

    In a model with a gated pathway (`aogpt.pathway`) a forward passes `split`, its rows by gate: `x`
    is then the pair (the source's rows, the pathway's rows) and `cond` the pathway's rows' modulation
    (when every row is in one group, `x` is the rows as they are, in the source's shapes).
    Each group goes through the same two halves of the block as any model's rows (`_attention_input`,
    `_attention_output`), the source's with its plain norms and weights, the pathway's modulated and
    with W + dW, and the groups meet in attention only."""

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

    def _attention_input(self, x: torch.Tensor, mod: Any, pathway: bool = False) -> torch.Tensor:
        """The first half of the block up to attention: [q; k; v] of the normed (or modulated) rows."""
        h = self.ln_1(x) if mod is None else self.ln_1.modulate(x, mod[0], mod[1])
        return side(self.attn.c_attn, pathway)(h)

    def _attention_output(self, x: torch.Tensor, y: torch.Tensor, mod: Any, pathway: bool = False) -> torch.Tensor:
        """The rest of the block from attention's output `y`: the output projection and the MLP, each
        added to the residual stream (scaled by the modulation's gates when there is one)."""
        attn, mlp = self.attn, self.mlp
        proj = side(attn.c_proj, pathway)
        if mod is None:
            x = project(proj, y, x, attn.resid_dropout)
            return mlp(self.ln_2(x), residual=x, pathway=pathway)
        x = torch.addcmul(x, mod[2], project(proj, y, None, attn.resid_dropout))
        return torch.addcmul(x, mod[5], mlp(self.ln_2.modulate(x, mod[3], mod[4]), pathway=pathway))

    def forward(self, x: Any, cond: torch.Tensor | None, attn_mask: torch.Tensor | AttentionMask | None,
                cache: KVCache | None, cache_pos: int | torch.Tensor | PackedSlots | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None, kernel: str = "auto",
                split: RowSplit | None = None) -> Any:
        if callable(cond):
            cond = cond(self)
        mod = None
        if self.adaptive and cond is not None:
            mod = cond if isinstance(cond, tuple) else cond.chunk(6, -1)
        elif cond is not None:
            x = x + cond
        if split is None or split.pure is not None:  # one group: the rows as they are
            pathway = split is not None and split.pure == "pathway"
            y = self.attn.mix(self._attention_input(x, mod, pathway), attn_mask, cache, cache_pos, rope, kernel)
            return self._attention_output(x, y, mod, pathway)
        x0, x1 = x  # the source's rows (plain norms, W), the pathway's (modulated, W + dW)
        qkv = split.join(None if x0 is None else self._attention_input(x0, None),
                         None if x1 is None else self._attention_input(x1, mod, True))
        y0, y1 = split.split(self.attn.mix(qkv, attn_mask, cache, cache_pos, rope, kernel))
        return (None if x0 is None else self._attention_output(x0, y0, None),
                None if x1 is None else self._attention_output(x1, y1, mod, True))


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
    """How a forward is computed, never what: the attention kernel of a forward over its own slots
    (`aogpt.attention.KERNELS`), whether an any-order read is laid out by target position
    (`Transformer.forward`), and for KV-cache steps the few-query kernel, the dtype the cache keeps
    and the layout of a ragged step (`aogpt.kv_cache`; None: the defaults there). Switching them
    changes speed and rounding only; ``Kernels.reference()`` is the plain layout with torch's SDPA.
    The decode path (`aogpt.decode`) sets the cache's three from what it measured on the machine."""

    attention: str = "auto"
    by_target: bool = True
    cache_attention: str | None = None
    cache_store: torch.dtype | None = None
    ragged: str | None = None

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
        KV cache is set up with, so decode steps look the modulation up instead of computing it.
        Every block's table is a column slice of one table, so a step looks them all up at once."""
        if self.config.target != "adaln":
            return None
        positions = F.pad(self.transformer.wtpe.weight, (0, 0, 0, 1))
        blocks = self.transformer.h
        width = 6 * self.config.n_embd
        table = positions.new_empty(positions.shape[0], width * len(blocks))
        for i, block in enumerate(blocks):
            table[:, i * width:(i + 1) * width] = block.condition(positions)
        return Conditions([table[:, i * width:(i + 1) * width] for i in range(len(blocks))],
                          self.transformer.final_layer.condition(positions), table)

    def _block_conditions(self, target: torch.Tensor, conditions: Conditions | None) -> list[Any]:
        kind, blocks = self.config.target, self.transformer.h
        if kind == "adaln":
            if conditions is not None:  # one lookup for every block
                rows, width = F.embedding(target, conditions.table), 6 * self.config.n_embd
                return [rows[..., i * width:(i + 1) * width] for i in range(len(blocks))]
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
        x = self.embed(tokens, pos, target)
        if dropping(self.transformer.drop):
            x = self.transformer.drop(x)
        cfg = self.config
        rope = rotary_tables(pos, cfg.head_dim, cfg.rope_theta) if cfg.positions == "rotary" else None
        kernel = self.kernels.attention
        split = None
        if cfg.pathway == "gated":  # the rows apart by gate (`aogpt.pathway`); the pathway's get the target
            if gate is None:
                if cache is not None:
                    raise AOGPTError("a gated model's cached step needs each slot's gate",
                                     "pass gate= (aogpt.orders.step_gates)")
                gate = ~left_to_right_slots(pos.expand(tokens.shape), target.expand(tokens.shape))
            gate, target = gate.expand(tokens.shape), target.expand(tokens.shape)
            split = RowSplit(gate)
            x, conds = self._pathway_rows(split, x, target, conditions)
        else:
            conds = self._block_conditions(target, conditions)
        for block, cond in zip(self.transformer.h, conds, strict=True):
            x = block(x, cond, attn_mask, cache, cache_pos, rope, kernel, split)
        if split is not None and split.pure is None:
            x = split.join(*x)
        if select is not None:
            x = x.gather(1, select.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
            target = target.expand(select.shape[0], -1).gather(1, select)
            split = None if split is None else RowSplit(gate.gather(1, select), split.pure)
        return self.lm_head(self._final(x, target, conditions, split))

    def _pathway_rows(self, split: RowSplit, x: torch.Tensor, target: torch.Tensor, conditions: Conditions | None
                      ) -> tuple[Any, list[Any]]:
        """A gated model's embedded slots as (the source's rows, the pathway's rows), the target entering the
        pathway's rows only (sigma-GPT's table at the input), and the blocks' modulation of those rows
        (AO-GPT's adaLN; None for the source's, which are the source's blocks). When every row is in
        one group the slots stay as they are (a step that reads left to right is the source's step)."""
        conds: list[Any] = [None] * len(self.transformer.h)
        if split.pure == "source":
            return x, conds
        x0, x1 = (None, x) if split.pure == "pathway" else split.split(x)
        wanted = target if split.pure == "pathway" else split.select(target)
        if self.config.target == "input":
            x1 = x1 + embed_target(self.transformer.wtpe, wanted)
        else:
            conds = self._block_conditions(wanted, conditions)
        return (x1 if split.pure == "pathway" else (x0, x1)), conds

    def _final(self, x: torch.Tensor, target: torch.Tensor, conditions: Conditions | None,
               split: RowSplit | None) -> torch.Tensor:
        """The final norm before the head (AO-GPT's modulated by the target); in a gated model the
        source's rows take the source's plain norm, the pathway's the modulated one."""
        tr = self.transformer
        final = tr.final_layer if self.config.target == "adaln" else None

        def norm(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            if final is None:
                return tr.ln_f(h)
            return final(h, self._adaptive(final, t, None if conditions is None else conditions.final))

        plain = tr.ln_f if final is None else final.ln_f
        if split is None or split.pure is not None:
            return plain(x) if split is not None and split.pure == "source" else norm(x, target)
        h0, h1 = split.split(x)
        return split.join(None if h0 is None else plain(h0), None if h1 is None else norm(h1, split.select(target)))

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

    def setup_cache(self, batch: int, capacity: int | None = None, attention: str = "auto",
                    conditions: Conditions | None = None) -> KVCache:
        """A static KV cache for `batch` sequences of up to `capacity` slots (default: the context
        plus the start slot and one scratch column), with the adaLN tables of the current weights
        (or `conditions`, computed once by a caller that sets up many caches); `attention` is the
        generation's attention setting, which with this model's `kernels` decides the cache's
        kernel and dtype (`aogpt.kv_cache.cache_settings`)."""
        cfg, p = self.config, next(self.parameters())
        kernel, store = cache_settings(attention, p.device, p.dtype, self.kernels.cache_attention,
                                       self.kernels.cache_store)
        return KVCache(cfg.n_layer, batch, cfg.n_head, capacity or cfg.block_size + 2, cfg.head_dim, p.device,
                       p.dtype, conditions if conditions is not None else self.conditions(), kernel, store)
