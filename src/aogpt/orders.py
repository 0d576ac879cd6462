"""Orders: the one vocabulary for training, evaluation, generation and the command line.

An order is a LongTensor (B, n) whose row b lists the original positions in the order they are
read or generated: ``order[b, i]`` is the position predicted at step i. Every sampler draws the
whole batch at once on the batch's device (no Python loop per sequence).

Specs (``make_order_sampler``; the same strings for `aogpt train --order`, `aogpt eval --order`
and `aogpt sample --order`):

- ``l2r``: the identity (left-to-right GPT).
- ``uniform`` (alias ``random``): uniform over all n! permutations (the any-order /
  masked-diffusion objective).
- ``mixture[:P]``: each sequence is left to right with probability P (default 0.1), else uniform
  (the AO-GPT recipe).
- ``fixed-random[:SEED]``: one permutation drawn from SEED (default 0) and kept for the whole run.
- ``blockwise[:K[:SEED]]``: blocks of K positions (default 4) left to right, and inside every block
  one fixed non-identity permutation (K = 4 without SEED uses the paper's 0->2->3->1). A last,
  shorter block uses the same permutation restricted to its positions.

Generation also accepts the *adaptive* orders ``confidence``, ``margin`` and ``entropy`` (`ADAPTIVE`,
`is_adaptive`): the model chooses the next positions while decoding, from its own distribution
(`aogpt.generation.adaptive`), so they are no permutation that could be drawn up front, and
training and evaluation refuse them.

Besides specs, generation and evaluation accept explicit orders: a permutation (n,) for every
sequence or one per sequence (N, n), checked by `check_permutation`. Whether something is left to
right is answered by `is_left_to_right`, for specs, samplers and tensors alike.
"""

from __future__ import annotations

import torch

from aogpt.errors import AOGPTError
from aogpt.validation import SEED_MAX, Range

_SEED = Range(ge=0, le=SEED_MAX, integer=True)
_BLOCK = Range(ge=2, le=2**20, integer=True)
_PROBABILITY = Range(ge=0, le=1)

ORDER_SPECS = ("l2r", "uniform", "mixture[:P]", "fixed-random[:SEED]", "blockwise[:K[:SEED]]")
ALIASES = {"random": "uniform"}  # generation's and evaluation's historical name for uniform orders
ADAPTIVE = ("confidence", "margin", "entropy")  # chosen by the model while generating


def is_adaptive(order: object) -> bool:
    """Whether `order` names an adaptive order (generation only; module docstring)."""
    return isinstance(order, str) and order in ADAPTIVE


class OrderSampler:
    """Draws a batch of orders; subclasses define `sample`."""

    spec: str = ""
    is_fixed: bool = False  # the same order every time (l2r, fixed-random, blockwise)

    def sample(self, batch: int, n: int, device: torch.device | str = "cpu",
               generator: torch.Generator | None = None) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"OrderSampler({self.spec!r})"


def identity(batch: int, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.arange(n, device=device).expand(batch, n)


def uniform(batch: int, n: int, device: torch.device | str = "cpu",
            generator: torch.Generator | None = None) -> torch.Tensor:
    """Uniform random permutations: argsort of i.i.d. uniforms (ties have probability ~0)."""
    return torch.rand(batch, n, device=device, generator=generator).argsort(dim=1)


class LeftToRight(OrderSampler):
    spec = "l2r"
    is_fixed = True

    def sample(self, batch, n, device="cpu", generator=None):
        return identity(batch, n, device)


class Uniform(OrderSampler):
    spec = "uniform"

    def sample(self, batch, n, device="cpu", generator=None):
        return uniform(batch, n, device, generator)


class Mixture(OrderSampler):
    def __init__(self, p_l2r: float = 0.1):
        if not 0.0 <= p_l2r <= 1.0:
            raise AOGPTError(f"mixture probability {p_l2r} is outside [0, 1]", "use e.g. mixture:0.1")
        self.p_l2r = p_l2r
        self.spec = f"mixture:{p_l2r:g}"

    def sample(self, batch, n, device="cpu", generator=None):
        perm = uniform(batch, n, device, generator)
        l2r = torch.rand(batch, 1, device=device, generator=generator) < self.p_l2r
        return torch.where(l2r, identity(batch, n, device), perm)


class Fixed(OrderSampler):
    """One permutation per length, computed once and repeated for every sequence and step."""

    is_fixed = True

    def __init__(self, spec: str, make):
        self.spec = spec
        self._make = make
        self._cache: dict[int, torch.Tensor] = {}

    def permutation(self, n: int) -> torch.Tensor:
        if n not in self._cache:
            self._cache[n] = self._make(n)
        return self._cache[n]

    def sample(self, batch, n, device="cpu", generator=None):
        return self.permutation(n).to(device).expand(batch, n)


def _seeded_permutation(n: int, seed: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


def block_permutation(k: int, seed: int | None) -> torch.Tensor:
    """The fixed non-identity permutation used inside every block of size k."""
    if k < 2:
        raise AOGPTError(f"blockwise block size {k} is too small", "use K >= 2, e.g. blockwise:4")
    if seed is None and k == 4:
        return torch.tensor([0, 2, 3, 1])  # the paper's example: 0 -> 2 -> 3 -> 1
    seed = 0 if seed is None else seed
    while True:  # redraw until it differs from the identity
        perm = _seeded_permutation(k, seed)
        if not torch.equal(perm, torch.arange(k)):
            return perm
        seed += 1


def blockwise_order(n: int, k: int, seed: int | None = None) -> torch.Tensor:
    inner = block_permutation(k, seed)
    parts = []
    for start in range(0, n, k):
        size = min(k, n - start)
        parts.append(start + inner[inner < size])
    return torch.cat(parts)


def _arg(spec: str, what: str, bounds: Range, text: str) -> int | float:
    """One argument of an order spec, in its range."""
    try:
        return bounds.parse(text)
    except ValueError as exc:
        raise AOGPTError(f"order {spec!r}: the {what} {exc}", f"e.g. {ORDER_EXAMPLES[spec.partition(':')[0]]}") \
            from None


ORDER_EXAMPLES = {"mixture": "mixture:0.1", "fixed-random": "fixed-random:7",
                  "blockwise": "blockwise:4 or blockwise:8:3"}


def make_order_sampler(spec: str) -> OrderSampler:
    """Parse an order spec (see the module docstring) into a sampler."""
    if isinstance(spec, OrderSampler):
        return spec
    if is_adaptive(spec):
        raise AOGPTError(f"order {spec} is chosen by the model while generating, not drawn in advance",
                         "use it to sample (aogpt sample --order " + spec + "); here use e.g. uniform or l2r")
    spec = ALIASES.get(spec, spec)
    name, _, rest = spec.partition(":")
    args = rest.split(":") if rest else []
    try:
        if name == "l2r" and not args:
            return LeftToRight()
        if name == "uniform" and not args:
            return Uniform()
        if name == "mixture" and len(args) <= 1:
            return Mixture(_arg(spec, "probability", _PROBABILITY, args[0]) if args else 0.1)
        if name == "fixed-random" and len(args) <= 1:
            seed = _arg(spec, "seed", _SEED, args[0]) if args else 0
            return Fixed(f"fixed-random:{seed}", lambda n: _seeded_permutation(n, seed))
        if name == "blockwise" and len(args) <= 2:
            k = _arg(spec, "block size", _BLOCK, args[0]) if args else 4
            seed = _arg(spec, "seed", _SEED, args[1]) if len(args) > 1 else None
            block_permutation(k, seed)  # validate now, not at the first batch
            label = f"blockwise:{k}" + (f":{seed}" if seed is not None else "")
            return Fixed(label, lambda n: blockwise_order(n, k, seed))
    except ValueError:
        pass
    raise AOGPTError(f"unknown order spec {spec!r}", f"use one of: {', '.join(ORDER_SPECS)}")


def check_permutation(order: torch.Tensor | list[int], n: int, rows: int | None = None,
                      what: str = "order") -> torch.Tensor:
    """`order` as a LongTensor on the CPU, (n,) or (rows, n), every row a permutation of 0..n-1;
    anything else is a user error."""
    try:
        t = torch.as_tensor(order, dtype=torch.long).cpu()
    except (TypeError, ValueError, RuntimeError):
        raise AOGPTError(f"the {what} is not a list of positions", "pass a permutation of the positions") from None
    shapes = f"({n},)" if rows is None else f"({n},) or ({rows}, {n})"
    if t.dim() not in (1, 2) or t.shape[-1] != n or (t.dim() == 2 and rows is not None and t.shape[0] != rows):
        raise AOGPTError(f"an {what} must have shape {shapes}, got {tuple(t.shape)}",
                         "pass a permutation of the output positions")
    if not bool((t.sort(dim=-1).values == torch.arange(n)).all()):
        raise AOGPTError(f"the given {what} is not a permutation of 0..{n - 1}", "list every position exactly once")
    return t


def is_left_to_right(order: str | OrderSampler | torch.Tensor | None) -> bool:
    """Whether `order` (a spec, a sampler, or explicit orders) always reads left to right."""
    if order is None:
        return True
    if isinstance(order, torch.Tensor):
        return bool((order == torch.arange(order.shape[-1], device=order.device)).all())
    spec = order.spec if isinstance(order, OrderSampler) else ALIASES.get(order, order)
    return spec == LeftToRight.spec
