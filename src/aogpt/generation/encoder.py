"""The encoder-only MDM's samplers: the reverse process along fixed chain orders, and in an adaptive
order. `aogpt.generation.samplers` hands them encoder models (docs/encoder.md), so prompts,
infilling, unmasking policies (Lemma 4.1 Bernoulli or counts, linear/cosine), orders, seeds and the
sampling knobs are shared with the decoder's generator. The model itself, its training objective and
its likelihoods are the family's (`aogpt.families.encoder`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from aogpt.families.encoder import check_encoder, positions
from aogpt.generation.adaptive import AdaptiveSampler, AdaptiveSteps
from aogpt.generation.streams import SequenceStreams
from aogpt.sampling import SamplingConfig, sample_tokens

__all__ = ["AdaptiveEncoderSampler", "EncoderSampler"]


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
        check_encoder(model)
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

    def run(self, cfg: SamplingConfig, streams: SequenceStreams,
            progress: Callable[[int], None] | None) -> torch.Tensor:
        """Decode every planned step; returns the tokens in chain order (B, n)."""
        for t in range(self.plan.shape[1]):
            k = self.plan[:, t]
            if not k.any():
                if not self.skip_noop:  # the forward a non-skipping sampler pays; its output is unused
                    self.model.forward_slots(self.x, self.pos, select=self.pos[:, :1] - 1)
                    self._count(np.zeros_like(k))
                continue
            self._step(k, cfg, streams)
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

    def _step(self, k: np.ndarray, cfg: SamplingConfig, streams: SequenceStreams) -> None:
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
        if self.teacher is not None:
            new = self.teacher[bi_t, col_t]
        else:  # each sequence's tokens in chain order, from its own stream
            new = sample_tokens(rows, cfg, uniforms=None if cfg.greedy else streams.token_uniforms(bi, cfg.dtype, dev))
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
                 streams: SequenceStreams, teacher: torch.Tensor | None, record: bool):
        check_encoder(model)
        B, n = chain.shape
        dev = chain.device
        m = known.numel()
        self.model, self.n, self.dev = model, n, dev
        self.steps = AdaptiveSteps(chain, m, plan, settings, streams, teacher, record, model.config.vocab_size,
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
