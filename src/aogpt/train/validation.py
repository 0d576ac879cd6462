"""Periodic validation: the mean loss per token on the same held-out windows every time.

For each set of weights (raw and EMA): the left-to-right loss, and, for families that read any
order, the any-order loss under uniform orders drawn from a generator re-seeded with
`eval_orders_seed` (the same orders every time). A run trained on one fixed order other than left
to right (``fixed-random``, ``blockwise``) is also scored in that order (``val/own/<weights>``): the
loss it actually learns, which neither of the other two measures. The losses are the family's
(`ModelFamily.validation_losses`); under DDP the batches are split over the ranks and summed.

Every call also keeps the loss of each validation batch (`Validation.per_batch`, this rank's
batches): the spread over batches gives error bars to whoever compares runs (`aogpt.reproduce`).

When the data knows the bytes behind its tokens (prepared text, not random tokens), each loss also
comes as bits per byte (`bpb/l2r/<weights>`, `bpb/any/<weights>`, `bpb/own/<weights>`;
`aogpt.measures`), counted on the very windows scored, so runs with different tokenizers compare.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from aogpt.config import TrainConfig
from aogpt.errors import AOGPTError
from aogpt.families import ModelFamily
from aogpt.measures import bits_per_byte
from aogpt.orders import is_left_to_right, make_order_sampler
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
    per_batch: dict[str, list[float]] = field(default_factory=dict)  # key -> loss per token of each batch
    tokens: int = 0  # tokens the last call scored (all ranks): the first `eval_batches` batches of the split

    @property
    def own_order(self) -> bool:
        """Whether the run's training order is one fixed order other than left to right (scored when
        one order costs one pass)."""
        sampler = make_order_sampler(self.cfg.order)
        return (self.family.any_order and self.family.one_pass_nll and sampler.is_fixed
                and not is_left_to_right(sampler))

    @torch.no_grad()
    def __call__(self, models: Mapping[str, nn.Module]) -> dict[str, float]:
        """`val/l2r/<weights>` (`val/any/<weights>` for any-order families, `val/own/<weights>` for a
        fixed training order) for each model, in nats per token, and the same as `bpb/...` in bits
        per byte where the data has bytes."""
        results: dict[str, float] = {}
        self.per_batch = {}
        kinds = ["l2r"] + (["any"] if self.family.any_order else []) + (["own"] if self.own_order else [])
        byte_lengths = getattr(self.data, "token_byte_lengths", None)  # optional (`BatchSource`)
        lengths = byte_lengths() if byte_lengths is not None else None
        for weights, model in models.items():
            sums, batches = self._sums(model, lengths)
            tokens, num_bytes = float(sums[3]), float(sums[4])
            self.tokens = int(tokens)
            if tokens == 0:
                raise AOGPTError("the validation split gave no batches", "prepare more validation data")
            column = {"l2r": 0, "any": 1, "own": 2}
            for kind in kinds:
                nats = float(sums[column[kind]]) / tokens
                results[f"val/{kind}/{weights}"] = nats
                if lengths is not None:
                    results[f"bpb/{kind}/{weights}"] = bits_per_byte(nats, int(tokens), int(num_bytes))
                self.per_batch[f"val/{kind}/{weights}"] = [b[column[kind]] / b[3] for b in batches]
        return results

    def coverage(self) -> dict[str, int]:
        """How much of the validation split the last call scored: ``val_tokens`` (and ``val_split_tokens``,
        the split's whole, where the data knows it). The summary says so, because a run's validation
        reads only its first `eval_batches` batches while `aogpt eval` reads the whole split."""
        out = {"val_tokens": self.tokens, "val_batches": self.cfg.eval_batches}
        shards = getattr(self.data, "shard_info", None)  # optional (`aogpt.data.PreparedData`)
        if shards is not None:  # whole windows of each shard, as `iter_eval_batches` reads them
            out["val_split_tokens"] = sum(int(s["tokens"]) // self.block_size * self.block_size for s in shards("val"))
        return out

    def _sums(self, model: nn.Module, byte_lengths: torch.Tensor | None) -> tuple[torch.Tensor, list[list[float]]]:
        """Summed left-to-right loss, any-order loss, own-order loss, token count and byte count over
        all ranks (float64), and the same sums for each of this rank's batches."""
        model.eval()
        sums = torch.zeros(5, dtype=torch.float64, device=self.device)  # l2r, any, own, tokens, bytes
        order_gen = torch.Generator(self.device).manual_seed(self.cfg.eval_orders_seed)
        own = make_order_sampler(self.cfg.order) if self.own_order else None
        per_batch = []
        batches = self.data.iter_eval_batches("val", self.cfg.batch_size, self.block_size, self.cfg.eval_batches)
        for i, idx in enumerate(batches):
            order = make_order_sampler("uniform").sample(idx.shape[0], idx.shape[1], self.device, order_gen)
            if i % self.info.world_size != self.info.rank:
                continue
            num_bytes = float(byte_lengths[idx].sum()) if byte_lengths is not None else 0.0
            idx = idx.to(self.device)
            zero = torch.zeros((), device=self.device)
            with autocast(self.device, self.amp):
                l2r, anyo = self.family.validation_losses(model, idx, order)
                anyo = zero if anyo is None else anyo
                own_loss = zero if own is None else self.family.order_nll(
                    model, idx, own.sample(idx.shape[0], idx.shape[1], self.device)).sum()
            counts = torch.tensor([idx.numel(), num_bytes], device=self.device, dtype=torch.float64)
            batch = torch.cat([torch.stack([l2r.double(), anyo.double(), own_loss.double()]), counts])
            per_batch.append(batch.tolist())
            sums += batch
        return distributed.all_reduce_sum(sums, self.info), per_batch
