"""The encoder-only masked-diffusion family (MDLM/RADD style), on the decoder's own blocks.

The model is the same `Transformer` built with ``variant="encoder-mdm"``: full attention, a `[MASK]`
embedding (the `wnonee` row, used by every slot whose token id is < 0), no time input. Its slots
are simply the sequence: token x_j (or -1 if masked) at position index j + 1, no target. One forward
gives p(x_j | unmasked tokens) at every position j, order-invariant in the context (paper §4).

What lives here (docs/encoder.md):

* `masked_diffusion_loss`: the training objective (docs/design.md, "Training objectives").
  k ~ U{1..n}, a uniform subset of k positions masked, per-sequence loss
  (n/k) * sum over masked j of -log p(x_j | unmasked). Its expectation over k and the subset
  equals the AO-AR loss E_sigma sum_i -log p(x_sigma_i | x_sigma_<i).
* `order_nll`: the exact NLL of a sequence under one order (n conditionals, n forwards, batched as
  rows); `mc_bound`: one-forward unbiased estimate of the any-order bound. `ENCODER_MDM`, the
  family object, hands them to `aogpt.evaluate`, so `aogpt eval` scores encoder checkpoints.
* `validation_losses`: the trainer's periodic validation, two forwards per sequence (unbiased
  estimators of the left-to-right NLL and of the any-order loss).
* Its samplers (the reverse process, fixed or adaptive order) are generation's:
  `aogpt.generation.encoder`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
from torch import nn

from aogpt.errors import AOGPTError
from aogpt.families.base import ModelFamily, unwrap
from aogpt.functional import token_nll

__all__ = ["ENCODER_MDM", "EncoderFamily", "draw_masks", "masked_diffusion_loss", "weighted_losses", "order_nll",
           "mc_bound", "validation_losses", "l2r_cut_estimate", "any_cut_estimate", "check_encoder", "positions"]


def check_encoder(model: nn.Module) -> None:
    cfg = getattr(unwrap(model), "config", None)
    if cfg is None or cfg.causal:
        raise AOGPTError(f"variant {getattr(cfg, 'variant', type(model).__name__)} is not an encoder-only MDM",
                         "use an encoder-mdm model here, or the decoder's functions")


def positions(batch: int, n: int, device: torch.device | str) -> torch.Tensor:
    """The encoder's position indices: j + 1 for token j (index 0 is the decoder's start slot)."""
    return torch.arange(1, n + 1, device=device).expand(batch, n)


# --------------------------------------------------------------------------- training objective
def draw_masks(batch: int, n: int, generator: torch.Generator | None = None,
               device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """k ~ U{1..n} per sequence and a uniformly random subset of k positions: (mask (B, n) bool, k (B,)).

    Drawn on the generator's device (the caller's stream), returned on `device`.
    """
    gdev = generator.device if generator is not None else torch.device("cpu")
    k = torch.randint(1, n + 1, (batch,), generator=generator, device=gdev)
    rank = torch.rand(batch, n, generator=generator, device=gdev).argsort(dim=1).argsort(dim=1)
    mask = rank < k[:, None]
    dev = device if device is not None else gdev
    return mask.to(dev), k.to(dev)


def weighted_losses(losses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(n/k) * mask * loss per position (B, n), k = masked count per row: row sums are unbiased
    per-sequence AO-AR losses, the mean over all entries is the per-token loss."""
    n = mask.shape[1]
    k = mask.sum(dim=1, keepdim=True).clamp(min=1).to(losses.dtype)
    return torch.where(mask, losses, torch.zeros((), dtype=losses.dtype, device=losses.device)) * (n / k)


def masked_diffusion_loss(model: nn.Module, idx: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """The encoder's training loss (B, n); its ``.mean()`` is the per-token loss the trainer minimises.

    `model` may be DDP-wrapped: it is called as ``model(idx, mask=mask)`` so gradients synchronise.
    """
    check_encoder(model)
    B, n = idx.shape
    mask, _ = draw_masks(B, n, generator, idx.device)
    _, losses = model(idx, mask=mask)
    return weighted_losses(losses, mask)


# --------------------------------------------------------------------------- likelihoods
def _inverse(order: torch.Tensor) -> torch.Tensor:
    """rank[b, order[b, i]] = i: the step at which each position is revealed."""
    ar = torch.arange(order.shape[1], device=order.device).expand_as(order)
    return torch.empty_like(order).scatter_(1, order, ar)


def _default_budget(device: torch.device) -> int:
    return 1 << 18 if device.type == "cuda" else 1 << 15


@torch.no_grad()
def order_nll(model: nn.Module, idx: torch.Tensor, order: torch.Tensor | None = None, *,
              token_budget: int | None = None) -> torch.Tensor:
    """Exact per-step NLL (B, n) under `order` (None: left to right): step i is
    -log p(x[order[i]] | x[order[:i]]), from a forward with positions order[i:] masked.

    The B * n conditionals are rows of a batched forward, in chunks of at most `token_budget` slots;
    only each row's target position goes through the output head. Cost: n forwards per sequence.
    """
    core = unwrap(model)
    check_encoder(core)
    B, n = idx.shape
    dev = idx.device
    order = torch.arange(n, device=dev).expand(B, n) if order is None else order.to(dev)
    rank = _inverse(order)
    rows_per_chunk = max(1, (token_budget or _default_budget(dev)) // n)
    parts = []
    total = B * n
    for start in range(0, total, rows_per_chunk):
        r = torch.arange(start, min(total, start + rows_per_chunk), device=dev)
        b, i = r // n, r % n
        tokens = idx[b].masked_fill(rank[b] >= i[:, None], -1)
        target = order[b, i]
        logits = core.forward_slots(tokens, positions(len(r), n, dev), select=target[:, None])[:, 0]
        parts.append(token_nll(logits, idx[b, target]))
    return torch.cat(parts).view(B, n)


@torch.no_grad()
def mc_bound(model: nn.Module, idx: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One-forward unbiased estimate (B,) of the any-order bound E_sigma[-log p_sigma(x)] per sequence:
    (n/k) * sum over a random k-subset (k ~ U{1..n}) of -log p(x_j | rest). `aogpt eval --order random`
    averages K independent draws and reports their standard error."""
    check_encoder(model)
    B, n = idx.shape
    mask, _ = draw_masks(B, n, generator, idx.device)
    _, losses = model(idx, mask=mask)
    return weighted_losses(losses, mask).sum(dim=1)


def _content_seed(idx: torch.Tensor) -> int:
    """A seed that depends on the batch's tokens only: validation is reproducible for the same data,
    while different batches get different random cuts."""
    return zlib.crc32(idx.detach().to("cpu", torch.int64).numpy().tobytes()) + 0x5EED


def l2r_cut_estimate(model: nn.Module, idx: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
    """n * -log p(x_i | x_<i) at i = cut (B,), positions >= i masked: averaged over all i this is
    exactly the left-to-right NLL of each sequence."""
    n = idx.shape[1]
    mask = torch.arange(n, device=idx.device)[None, :] >= cut[:, None]
    _, losses = model(idx, mask=mask)
    return n * losses.gather(1, cut[:, None])[:, 0]


def any_cut_estimate(model: nn.Module, idx: torch.Tensor, order: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
    """n/(n-i) * the summed losses of positions order[i:] (masked), i = cut (B,): averaged over i and
    uniform orders this is exactly the any-order loss."""
    mask = _inverse(order.to(idx.device)) >= cut[:, None]
    _, losses = model(idx, mask=mask)
    return weighted_losses(losses, mask).sum(dim=1)


@torch.no_grad()
def validation_losses(model: nn.Module, idx: torch.Tensor, order: torch.Tensor,
                      generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Unbiased estimates of the summed (over the batch) left-to-right NLL and any-order loss, two
    forwards per sequence (the exact versions cost n forwards: `order_nll`, `aogpt eval`).

    One random cut i ~ U{0..n-1} per sequence and estimator (`l2r_cut_estimate`,
    `any_cut_estimate`); the any-order one is unbiased when `order` is uniform (the trainer's).
    Without `generator` the cuts come from a seed derived from the batch's tokens, so the same weights
    and data give the same numbers every time. `model` may be DDP-wrapped.
    """
    check_encoder(model)
    B, n = idx.shape
    gen = generator or torch.Generator().manual_seed(_content_seed(idx))
    cuts = torch.randint(0, n, (2, B), generator=gen, device=gen.device).to(idx.device)
    l2r = l2r_cut_estimate(model, idx, cuts[0]).sum()
    anyo = any_cut_estimate(model, idx, order, cuts[1]).sum()
    return l2r, anyo


@dataclass(frozen=True)
class EncoderFamily(ModelFamily):
    """Bidirectional: no KV cache, n forwards for the exact NLL of one order, T forwards to generate."""

    def train_loss(self, model, idx, order, generator):
        del order  # the encoder draws its own masks (k ~ U{1..n}, a uniform subset)
        return masked_diffusion_loss(model, idx, generator)

    def order_nll(self, model, idx, order):
        return order_nll(model, idx, order)

    def mc_bound(self, model, idx, generator):
        return mc_bound(model, idx, generator).double(), None  # masks were drawn, not orders

    def conditional_logits(self, model, idx, context, targets):
        """One bidirectional pass with every position outside the context masked."""
        B, n = idx.shape
        visible = torch.zeros_like(idx, dtype=torch.bool).scatter_(1, context, True)
        return model.forward_slots(idx.masked_fill(~visible, -1), positions(B, n, idx.device), select=targets)

    def validation_losses(self, model, idx, order):
        return validation_losses(model, idx, order)



# Encoder-only MDM (MDLM/RADD style): bidirectional, [MASK] slots, no time input.
ENCODER_MDM = EncoderFamily(
    name="encoder-mdm", summary="encoder-only masked diffusion model (MDLM/RADD style)",
    architecture=dict(norm="layernorm", qk_norm=False, target="none", tie_head=True, head_bias=False),
    default_order="uniform", causal=False, any_order=True, parallel_steps=True, one_pass_nll=False,
    adaptive_order=True)
