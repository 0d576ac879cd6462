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
* `EncoderSampler`: the reverse-process sampler. `aogpt.generation.generate.generate` drives it for encoder
  models, so prompts, infilling, unmasking policies (Lemma 4.1 Bernoulli or counts, linear/cosine),
  orders, seeds and the sampling knobs are shared with the decoder's generator.
  `AdaptiveEncoderSampler`: the same in an adaptive order (confidence, margin, entropy).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from aogpt.errors import AOGPTError
from aogpt.families.base import ModelFamily, unwrap
from aogpt.functional import token_nll
from aogpt.generation.adaptive import AdaptiveSampler, AdaptiveSteps
from aogpt.sampling import SamplingConfig, sample_tokens

__all__ = ["ENCODER_MDM", "EncoderFamily", "draw_masks", "masked_diffusion_loss", "weighted_losses", "order_nll",
           "mc_bound", "validation_losses", "l2r_cut_estimate", "any_cut_estimate", "EncoderSampler",
           "AdaptiveEncoderSampler"]


def _check_encoder(model: nn.Module) -> None:
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
    _check_encoder(model)
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
    _check_encoder(core)
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
    _check_encoder(model)
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
    _check_encoder(model)
    B, n = idx.shape
    gen = generator or torch.Generator().manual_seed(_content_seed(idx))
    cuts = torch.randint(0, n, (2, B), generator=gen, device=gen.device).to(idx.device)
    l2r = l2r_cut_estimate(model, idx, cuts[0]).sum()
    anyo = any_cut_estimate(model, idx, order, cuts[1]).sum()
    return l2r, anyo


# --------------------------------------------------------------------------- sampling
class EncoderSampler:
    """The reverse process for one batch, driven by `aogpt.generation.generate.generate` (same interface as the
    decoder's `aogpt.generation.decoder.DecoderSampler`): chain orders (known positions first, then
    masked ones in unmasking order) and a (B, T) plan of positions revealed per step come from the
    shared plan code (`aogpt.generation.plan`).

    Step t reveals the next k_b chain positions of sequence b, each sampled independently from
    p(x_j | tokens unmasked so far): one full bidirectional forward, the head only at revealed
    positions. Since the conditionals ignore how the context was ordered and one step's tokens are
    drawn independently given the same context, this is exactly MDLM's sampler (Lemma 4.1 for the
    Bernoulli policy: which positions fire is decided before the model runs).

    No-op skipping (MDLM's ``ddpm_cache``): a step where no sequence of the batch reveals anything
    leaves the input unchanged, so its forward is skipped. Random draws happen only for revealed
    positions, so skipping never changes the samples (`skip_noop=False` runs those forwards anyway;
    the benchmark's baseline).
    """

    def __init__(self, model: nn.Module, chain: torch.Tensor, known: torch.Tensor, plan: np.ndarray,
                 teacher: torch.Tensor | None, record: bool, skip_noop: bool = True):
        _check_encoder(model)
        B, n = chain.shape
        dev = chain.device
        m = known.numel()
        self.model, self.B, self.n, self.plan = model, B, n, plan
        self.chain, self.teacher, self.skip_noop = chain, teacher, skip_noop
        self.x = torch.full((B, n), -1, dtype=torch.long, device=dev)
        if m:
            self.x.scatter_(1, chain[:, :m], known.to(dev).expand(B, m))
        self.pos = positions(B, n, dev)
        self.g = np.full(B, m, dtype=np.int64)
        self.logits: torch.Tensor | None = None
        if record:
            V = model.config.vocab_size
            self.logits = torch.full((B, n, V), float("nan"), device=dev, dtype=next(model.parameters()).dtype)
        self.forwards = 0
        self.slots = 0
        self.padded = 0

    def run(self, cfg: SamplingConfig, gen: torch.Generator | None,
            progress: Callable[[int], None] | None) -> torch.Tensor:
        """Decode every planned step; returns the tokens in chain order (B, n)."""
        for t in range(self.plan.shape[1]):
            k = self.plan[:, t]
            if not k.any():
                if not self.skip_noop:  # the forward a non-skipping sampler pays; its output is unused
                    self.model.forward_slots(self.x, self.pos, select=self.pos[:, :1] - 1)
                    self._count(np.zeros_like(k))
                continue
            self._step(k, cfg, gen)
            if progress is not None:
                progress(int(k.sum()))
        return self.x.gather(1, self.chain)

    def decided(self) -> torch.Tensor:
        """Tokens by position (B, n) decided so far, -1 where still masked (`aogpt.generation.reveal`)."""
        return self.x

    def _count(self, k: np.ndarray) -> None:
        self.forwards += 1
        self.slots += self.B * self.n
        self.padded += int((k == 0).sum()) * self.n  # rows that revealed nothing this forward

    def _step(self, k: np.ndarray, cfg: SamplingConfig, gen: torch.Generator | None) -> None:
        dev, n = self.x.device, self.n
        R = int(k.max())
        j = np.arange(R)
        valid = j < k[:, None]
        cols = np.minimum(self.g[:, None] + j, n - 1)  # chain indices revealed now (padding clamped)
        cols_t = torch.from_numpy(cols).to(dev)
        where = self.chain.gather(1, cols_t)  # their positions
        logits = self.model.forward_slots(self.x, self.pos, select=where)
        bi, ji = np.nonzero(valid)
        bi_t, ji_t = torch.from_numpy(bi).to(dev), torch.from_numpy(ji).to(dev)
        col_t = cols_t[bi_t, ji_t]
        rows = logits[bi_t, ji_t]
        new = self.teacher[bi_t, col_t] if self.teacher is not None else sample_tokens(rows, cfg, gen)
        self.x[bi_t, where[bi_t, ji_t]] = new
        if self.logits is not None:
            self.logits[bi_t, col_t] = rows
        self._count(k)
        self.g += k


class AdaptiveEncoderSampler(AdaptiveSampler):
    """The reverse process in an adaptive order (`aogpt.generation.adaptive`): each step's single
    bidirectional pass gives p(x_j | unmasked tokens) at every masked position, so scoring the
    candidates costs only their rows of the output head. Sequences with nothing to reveal in a step
    sit its forward out."""

    def __init__(self, model: nn.Module, chain: torch.Tensor, known: torch.Tensor, plan: np.ndarray, settings,
                 generator: torch.Generator | None, teacher: torch.Tensor | None, record: bool):
        _check_encoder(model)
        B, n = chain.shape
        dev = chain.device
        m = known.numel()
        self.model, self.n, self.dev = model, n, dev
        self.steps = AdaptiveSteps(chain, m, plan, settings, generator, teacher, record, model.config.vocab_size,
                                   next(model.parameters()).dtype)
        self.x = torch.full((B, n), -1, dtype=torch.long, device=dev)
        if m:
            self.x.scatter_(1, chain[:, :m], known.to(dev).expand(B, m))

    def _forward(self, active: np.ndarray, cands: list[np.ndarray]) -> torch.Tensor:
        """One bidirectional pass over the active sequences, the head only at their candidates."""
        sizes = np.array([len(c) for c in cands])
        width = int(sizes.max())
        select = np.stack([np.pad(c, (0, width - len(c)), mode="edge") for c in cands])
        rows = torch.from_numpy(active).to(self.dev)
        logits = self.model.forward_slots(self.x[rows], positions(len(active), self.n, self.dev),
                                          select=torch.from_numpy(select).to(self.dev))
        self.steps.forwards += 1
        self.steps.slots += len(active) * self.n
        return logits[torch.from_numpy(np.arange(width) < sizes[:, None]).to(self.dev)]

    def _commit(self, active, cands, picks, new) -> None:
        b_of = np.repeat(active, [len(p) for p in picks])
        pos_of = np.concatenate([c[p] for c, p in zip(cands, picks, strict=True)])
        self.x[torch.from_numpy(b_of).to(self.dev), torch.from_numpy(pos_of).to(self.dev)] = new

    def _tokens(self) -> torch.Tensor:
        return self.x.gather(1, self.chain)

    def decided(self) -> torch.Tensor:
        """Tokens by position (B, n) decided so far, -1 where still masked (`aogpt.generation.reveal`)."""
        return self.x


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

    def sampler(self, model, chain, known, plan, settings, *, teacher=None, record=False):
        # an encoder has no KV cache: every step is a full pass
        return EncoderSampler(model, chain, known, plan, teacher, record, settings.skip_noop)

    def adaptive_sampler(self, model, chain, known, plan, settings, *, generator=None, teacher=None, record=False):
        return AdaptiveEncoderSampler(model, chain, known, plan, settings, generator, teacher, record)


# Encoder-only MDM (MDLM/RADD style): bidirectional, [MASK] slots, no time input.
ENCODER_MDM = EncoderFamily(
    name="encoder-mdm", summary="encoder-only masked diffusion model (MDLM/RADD style)",
    architecture=dict(norm="layernorm", qk_norm=False, target="none", tie_head=True, head_bias=False),
    default_order="uniform", causal=False, any_order=True, parallel_steps=True, one_pass_nll=False,
    adaptive_order=True)
