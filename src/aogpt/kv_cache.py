"""The static KV cache for generation, and the inference tables it is set up with.

`Transformer.setup_cache(batch, capacity)` allocates one key and one value buffer per layer,
(batch, heads, capacity, head_dim), once per generation (gpt-fast style): nothing is concatenated
or copied as the cache grows. Column c holds the keys of chain slot c (docs/design.md, "The KV
cache").

Each forward says where its new keys go (`cache_pos`, gpt-fast's ``input_pos``): an int start
column shared by the batch (this forward's S slots go to columns start .. start + S - 1), or a
LongTensor (B, S) of columns per sequence. Attention then reads the leading `span` columns: those
its attention mask covers, or start + S when there is no mask. The cache keeps no cursor of its
own, so a forward never depends on what an earlier caller set.

AO-GPT's adaLN modulation depends on the target position only: at setup the per-position rows of
every block (and of the final layer) are computed once from the current weights and kept here
(`conditions`), so a decode step looks them up instead of recomputing them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Conditions:
    """Per-position adaLN rows computed from fixed weights: blocks[i] (P + 1, 6d) for block i,
    final (P + 1, 2d); row P is the "no target" sentinel."""

    blocks: list[torch.Tensor]
    final: torch.Tensor


class KVCache:
    """Static key/value buffers for every layer, plus the inference tables of the weights they were
    set up from."""

    def __init__(self, n_layer: int, batch: int, n_head: int, capacity: int, head_dim: int,
                 device: torch.device | str, dtype: torch.dtype, conditions: Conditions | None = None):
        shape = (n_layer, batch, n_head, capacity, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.batch, self.capacity = batch, capacity
        self.conditions = conditions
        self._rows = torch.arange(batch, device=device)[:, None]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, cache_pos: int | torch.Tensor,
               span: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this forward's keys/values (B, H, S, D) at `cache_pos`; return columns [0, span)."""
        kc, vc = self.k[layer], self.v[layer]
        if isinstance(cache_pos, int):
            end = cache_pos + k.shape[2]
            kc[:, :, cache_pos:end] = k
            vc[:, :, cache_pos:end] = v
        else:  # per-sequence columns: kc[b, :, cache_pos[b, s]] = k[b, :, s]
            kc[self._rows, :, cache_pos] = k.transpose(1, 2)
            vc[self._rows, :, cache_pos] = v.transpose(1, 2)
        return kc[:, :, :span], vc[:, :, :span]
