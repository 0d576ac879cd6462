"""Which sampler decodes a batch of a model: chosen from its family's capabilities.

A causal decoder (`ModelFamily.causal`) decodes with the KV-cache sampler (`aogpt.generation.decoder`),
in an adaptive order with `AdaptiveDecoderSampler` and, where it is told the target position (so a
forward can draft several positions), speculatively (`aogpt.generation.speculative`); a
bidirectional encoder runs the reverse process (`aogpt.generation.encoder`). The samplers live in
generation and the families only describe what a model is and can do, so the configs, training and
evaluation, which ask the families, do not depend on generation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from aogpt.errors import AOGPTError
from aogpt.families import ModelFamily
from aogpt.generation.adaptive import AdaptiveDecoderSampler
from aogpt.generation.decoder import DecoderSampler
from aogpt.generation.encoder import AdaptiveEncoderSampler, EncoderSampler
from aogpt.generation.settings import GenerationSettings
from aogpt.generation.speculative import SpeculativeSampler
from aogpt.generation.streams import SequenceStreams


def fixed_order_sampler(family: ModelFamily, model: nn.Module, chain: torch.Tensor, known: torch.Tensor,
                        plan: np.ndarray, settings: GenerationSettings, *, teacher: torch.Tensor | None = None,
                        record: bool = False) -> Any:
    """The sampler that decodes one batch along fixed chain orders (B, n), known positions first, with
    a per-step plan (B, T) of how many positions each step reveals; teacher (B, n) holds tokens in
    chain order."""
    if family.causal:
        return DecoderSampler(model, chain, known, plan, settings, teacher, record)
    # an encoder has no KV cache: every step is a full pass
    return EncoderSampler(model, chain, known, plan, teacher, record, settings.skip_noop)


def adaptive_sampler(family: ModelFamily, model: nn.Module, chain: torch.Tensor, known: torch.Tensor,
                     plan: np.ndarray, settings: GenerationSettings, *, streams: SequenceStreams,
                     teacher: torch.Tensor | None = None, record: bool = False) -> Any:
    """The sampler that decodes one batch in an adaptive order (`settings.plan.order`, one of
    `aogpt.orders.ADAPTIVE`): chain (B, n) starts with the known positions, the rest is chosen while
    decoding; plan (B, T) gives how many positions each step reveals at least; streams (each
    sequence's own, `aogpt.generation.streams`) draw candidate subsets and tokens; teacher (B, n)
    holds tokens by position. After `run`, the sampler's `chain` holds the chosen orders and
    `step_counts` what each step revealed."""
    cls = AdaptiveDecoderSampler if family.causal else AdaptiveEncoderSampler
    return cls(model, chain, known, plan, settings, streams, teacher, record)


def speculative_sampler(family: ModelFamily, model: nn.Module, chain: torch.Tensor, known: torch.Tensor,
                        settings: GenerationSettings, k: int | str) -> SpeculativeSampler:
    """Exact self-speculative decoding along fixed chain orders: only for decoders told the target
    position (drafts need parallel query slots)."""
    if not (family.causal and family.target_position):
        raise AOGPTError(f"variant {family.name} cannot draft several positions in one pass, so speculative "
                         "decoding does not apply", "use an aogpt or sigma model, or drop --speculative")
    return SpeculativeSampler(model, chain, known, settings, k)
