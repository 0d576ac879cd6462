"""The decoder family: left-to-right GPT, sigma-GPT and AO-GPT on one causal transformer.

All three read a sequence in an order through the slot layout of `aogpt.model` (start slot, then
the tokens in the order, each slot told the position it must predict next), so one causal forward
gives all n conditionals of an order: the exact NLL, the training loss and, with a KV cache, O(n)
generation (whose samplers are generation's: `aogpt.generation.decoder`). They differ only in
whether, and how, the target position enters the model, which decides whether orders other than
left to right are possible.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aogpt.errors import AOGPTError
from aogpt.families.base import ModelFamily
from aogpt.kv_cache import step_mask
from aogpt.orders import identity_run, step_gates
from aogpt.pathway import is_gated


@dataclass(frozen=True)
class DecoderFamily(ModelFamily):
    def train_loss(self, model, idx, order, generator):
        return model(idx, order, logits=False)[1]

    def order_nll(self, model, idx, order):
        return model(idx, order)[1]

    def conditional_logits(self, model, idx, context, targets):
        """One forward: the context slots causally, then one query slot per target holding the last
        context token (the start token if none), each attending to the context and itself only."""
        B, m = context.shape
        if not self.target_position and not bool((targets == m).all()):
            raise AOGPTError(f"variant {self.name} predicts only the next position ({m}) after a left-to-right "
                             "context", "use an any-order model (aogpt, sigma) for other targets")
        slot_tokens, slot_pos, slot_target = model.slots_for_order(idx, context, with_last_slot=True)
        R = targets.shape[1]
        tokens = torch.cat([slot_tokens[:, :m], slot_tokens[:, m:].expand(B, R)], dim=1)
        pos = torch.cat([slot_pos[:, :m], slot_pos[:, m:].expand(B, R)], dim=1)
        target = torch.cat([slot_target[:, :m], targets], dim=1)
        cols = torch.arange(m + R, device=idx.device)
        mask = step_mask(cols, m, m + R)[None, None]
        gate = None
        if is_gated(model):  # the context's slots, then every query as one more slot after all of them
            run = identity_run(context)
            read = torch.cat([cols[:m], cols.new_full((R,), m)]).expand(B, m + R)
            gate = step_gates(run, torch.arange(B, device=idx.device)[:, None].expand(B, m + R), read, pos, target)
        return model.forward_slots(tokens, pos, target, attn_mask=mask, select=(m + cols[:R]).expand(B, R),
                                   gate=gate)

    def validation_losses(self, model, idx, order):
        l2r = model(idx)[1].sum()
        return l2r, (model(idx, order)[1].sum() if self.any_order else None)


# GPT-2 blocks, left to right, tied head: the paper's AR control.
GPT = DecoderFamily(
    name="gpt", summary="left-to-right GPT-2 (the AR control)",
    architecture=dict(norm="layernorm", qk_norm=False, target="none", tie_head=True, head_bias=False),
    default_order="l2r", kv_cache=True)

# sigma-GPT exactly as the paper reproduced it (and as its released checkpoints are).
SIGMA = DecoderFamily(
    name="sigma", summary="sigma-GPT: the target position added at the input",
    architecture=dict(norm="layernorm", qk_norm=False, target="input", tie_head=True, head_bias=False),
    default_order="uniform", target_position=True, any_order=True, ensemble=True, parallel_steps=True,
    kv_cache=True, adaptive_order=True)

# AO-GPT: adaLN on a 128-wide target table, RMSNorm, QK-norm, untied head with bias; 10% L2R orders.
AOGPT = DecoderFamily(
    name="aogpt", summary="AO-GPT: the target position drives adaLN in every block",
    architecture=dict(norm="rmsnorm", qk_norm=True, target="adaln", tie_head=False, head_bias=True),
    default_order="mixture", target_position=True, any_order=True, ensemble=True, parallel_steps=True,
    kv_cache=True, adaptive_order=True)
