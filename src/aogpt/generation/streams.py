"""One random stream per sequence: what a seed draws does not depend on how the work was run.

`generate(seed=...)` must give sequence i the same sample whatever runs it: with or without the KV
cache, in a batch of 1 or 64, with packed or padded rows, with any attention kernel or decode path.
A generator shared by the batch cannot promise that: the rows of a step are laid out differently
by each path (the packed step sorts sequences by width, the recompute step does not), so the same
uniforms would go to other sequences. Here every sequence has its own streams, one per purpose
(``tokens``: token draws and speculative verification; ``plan``: Lemma 4.1's per-position
Bernoulli draws and adaptive candidate subsets; ``order``: its unmasking order), keyed by the seed
and the sequence's index among all samples of the call, and each stream is consumed in an order
that depends on that sequence alone (its chain order, its own steps).

The streams are counter-based (SplitMix64, Steele et al. 2014: output c of a stream with key s is
mix(s + (c + 1) * gamma), and the keys are themselves SplitMix64 outputs of a per-purpose hash of
the seed), so a draw for any set of sequences is one vectorised computation, with no generator
object per sequence and no Python loop per row. Uniforms are float64 with 53 random bits (float32:
24 bits), in [0, 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from aogpt.seeds import draw_seed

PURPOSES = ("tokens", "plan", "order")
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function (a bijection of 64-bit words with full avalanche)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _stream(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Output `counters` of the SplitMix64 streams with states `keys` (uint64 arrays, same shape)."""
    with np.errstate(over="ignore"):
        return _mix(keys + (counters + np.uint64(1)) * _GAMMA)


def _to_unit(words: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """Uniforms in [0, 1) from 64-bit words: the top 53 bits (float64) or 24 bits (float32)."""
    if dtype == torch.float32:
        return ((words >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24))
    return (words >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


class SequenceStreams:
    """The streams of sequences ``first .. first + count - 1`` of a `generate` call with `seed`;
    sequences are addressed by their index within this batch (0 .. count - 1). `seed` may also give
    one seed per sequence of the call: sequence i then has the streams of the only sequence of a call
    with ``seeds[i]`` (independent requests decoded as one batch draw what each draws alone)."""

    def __init__(self, seed: int | Sequence[int], first: int, count: int):
        self.first, self.count = int(first), int(count)
        if isinstance(seed, (int, np.integer)):  # sequence i: (seed, i)
            seeds, index = [int(seed)] * self.count, np.arange(self.first, self.first + self.count, dtype=np.uint64)
        else:  # sequence i: (seed[i], 0)
            seeds, index = [int(s) for s in seed[self.first:self.first + self.count]], np.zeros(self.count, np.uint64)
            if len(seeds) != self.count:
                raise ValueError(f"{len(seed)} seeds for sequences up to {self.first + self.count - 1}")
        keys = {(s, p): draw_seed(s, "sequence-stream", p) for s in set(seeds) for p in PURPOSES}
        self._keys = {p: _stream(np.array([keys[s, p] for s in seeds], dtype=np.uint64), index) for p in PURPOSES}
        self._next = {p: np.zeros(self.count, dtype=np.uint64) for p in PURPOSES}

    def words(self, seqs: np.ndarray, purpose: str) -> np.ndarray:
        """One 64-bit word per entry of `seqs` (sequence indices), each the next of its sequence's
        `purpose` stream: entries of one sequence take consecutive counters in the order given."""
        seqs = np.asarray(seqs, dtype=np.int64)
        counters = self._next[purpose]
        if seqs.size == 0:
            return np.empty(0, dtype=np.uint64)
        order = np.argsort(seqs, kind="stable")
        ordered = seqs[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        rank = np.arange(len(seqs)) - np.repeat(starts, np.diff(np.r_[starts, len(seqs)]))
        offset = np.empty(len(seqs), dtype=np.uint64)
        offset[order] = rank.astype(np.uint64)
        out = _stream(self._keys[purpose][seqs], counters[seqs] + offset)
        counters += np.bincount(seqs, minlength=self.count).astype(np.uint64)
        return out

    def ahead(self, purpose: str, width: int) -> np.ndarray:
        """The next `width` uniforms (float64) of every sequence's `purpose` stream, (count, width),
        without taking them: `advance` takes those a caller used. Reading a block at once is what
        makes a long run of small draws cheap (`aogpt.generation.plan.step_counts`)."""
        counters = self._next[purpose][:, None] + np.arange(width, dtype=np.uint64)
        return _to_unit(_stream(self._keys[purpose][:, None], counters), torch.float64)

    def advance(self, purpose: str, used: np.ndarray) -> None:
        """Take `used[b]` words of sequence b's `purpose` stream (those `ahead` showed it)."""
        self._next[purpose] += np.asarray(used).astype(np.uint64)

    def uniforms(self, seqs: np.ndarray, purpose: str = "tokens", dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None) -> np.ndarray | torch.Tensor:
        """One uniform in [0, 1) per entry of `seqs` (`words`); a tensor on `device` when one is given."""
        u = _to_unit(self.words(seqs, purpose), dtype)
        return u if device is None else torch.from_numpy(u).to(device)

    def token_uniforms(self, seqs: np.ndarray, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        """The uniforms of token draws for rows belonging to sequences `seqs`, as a (R, 1) tensor."""
        return self.uniforms(seqs, "tokens", dtype, device).reshape(-1, 1)

    def generator(self, seq: int, purpose: str = "order") -> torch.Generator:
        """A CPU torch generator seeded from sequence `seq`'s `purpose` stream (for the order samplers,
        which draw with torch); each call takes the next word of that stream."""
        word = int(self.words(np.array([seq]), purpose)[0]) >> 1
        return torch.Generator().manual_seed(word)


__all__ = ["PURPOSES", "SequenceStreams"]
