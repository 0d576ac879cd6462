"""Periodic validation: the mean loss per token on the same held-out windows every time.

For each set of weights (raw and EMA): the left-to-right loss, and, for families that read any
order, the any-order loss under uniform orders drawn from a generator re-seeded with
`eval_orders_seed` (the same orders every time). The losses are the family's
(`ModelFamily.validation_losses`); under DDP the batches are split over the ranks and summed.

When the data knows the bytes behind its tokens (prepared text, not random tokens), each loss also
comes as bits per byte (`bpb/l2r/<weights>`, `bpb/any/<weights>`; `aogpt.measures`), counted on
the very windows scored, so runs with different tokenizers compare.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from aogpt.config import TrainConfig
from aogpt.errors import AOGPTError
from aogpt.families import ModelFamily
from aogpt.measures import bits_per_byte
from aogpt.orders import make_order_sampler
from aogpt.train import distributed
from aogpt.train.sources import BatchSource
from aogpt.train.step import autocast


@dataclass
class Validation:
    """Scores models on the validation split: `validation({"raw": model, "ema": ema_model})`."""

    data: BatchSource
    cfg: TrainConfig
    block_size: int
    family: ModelFamily
    info: distributed.DistInfo
    device: torch.device
    amp: torch.dtype | None

    @torch.no_grad()
    def __call__(self, models: Mapping[str, nn.Module]) -> dict[str, float]:
        """`val/l2r/<weights>` (and `val/any/<weights>` for any-order families) for each model, in
        nats per token, and the same as `bpb/...` in bits per byte where the data has bytes."""
        results: dict[str, float] = {}
        byte_lengths = getattr(self.data, "token_byte_lengths", None)  # optional (`BatchSource`)
        lengths = byte_lengths() if byte_lengths is not None else None
        for weights, model in models.items():
            l2r, anyo, tokens, num_bytes = self._sums(model, lengths).tolist()
            if tokens == 0:
                raise AOGPTError("the validation split gave no batches", "prepare more validation data")
            kinds = {"l2r": l2r} | ({"any": anyo} if self.family.any_order else {})
            for kind, nats in kinds.items():
                results[f"val/{kind}/{weights}"] = nats / tokens
                if lengths is not None:
                    results[f"bpb/{kind}/{weights}"] = bits_per_byte(nats / tokens, int(tokens), int(num_bytes))
        return results

    def _sums(self, model: nn.Module, byte_lengths: torch.Tensor | None) -> torch.Tensor:
        """Summed left-to-right loss, any-order loss, token count and byte count over all ranks
        (float64)."""
        model.eval()
        sums = torch.zeros(4, dtype=torch.float64, device=self.device)  # l2r, any, tokens, bytes
        order_gen = torch.Generator(self.device).manual_seed(self.cfg.eval_orders_seed)
        batches = self.data.iter_eval_batches("val", self.cfg.batch_size, self.block_size, self.cfg.eval_batches)
        for i, idx in enumerate(batches):
            order = make_order_sampler("uniform").sample(idx.shape[0], idx.shape[1], self.device, order_gen)
            if i % self.info.world_size != self.info.rank:
                continue
            num_bytes = float(byte_lengths[idx].sum()) if byte_lengths is not None else 0.0
            idx = idx.to(self.device)
            with autocast(self.device, self.amp):
                l2r, anyo = self.family.validation_losses(model, idx, order)
                anyo = torch.zeros((), device=self.device) if anyo is None else anyo
            counts = torch.tensor([idx.numel(), num_bytes], device=self.device, dtype=torch.float64)
            sums += torch.cat([l2r.double().view(1), anyo.double().view(1), counts])
        return distributed.all_reduce_sum(sums, self.info)
