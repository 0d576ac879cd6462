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
- ``mallows:THETA``: Mallows permutations around the identity, P(sigma) = exp(-THETA * inv(sigma)) / Z,
  inv = the number of inversions (pairs read against the text's direction). THETA = 0 is uniform,
  ``inf`` (or a large THETA) is left to right; in between, "left to right with local shuffles" whose
  size shrinks like 1/THETA.
- ``infill[:L]``: a prefix read left to right, then the text after a gap, then the gap, left to right:
  the order in which an infilling is scored given both sides (`aogpt.evaluation.infill`). The gap
  holds L positions (default: one of `INFILL_SPANS`, drawn per sequence, shortened to fit) and starts
  at a uniformly drawn position, so the prefix or the suffix may be empty.
- ``SPEC*W+SPEC*W+...``: a blend: each sequence draws one of the specs with probability proportional
  to its weight (``uniform*0.75+infill*0.25``).
- ``window:W``: a sliding window over the unread positions: each step reads a position drawn
  uniformly from the W leftmost positions not yet read (all of them when fewer remain). W = 1 is
  left to right, W >= n uniform; a position is read at most W - 1 steps before its left-to-right
  turn (it may wait longer). Every order the window can reach is equally likely: its probability is
  prod_t 1 / min(W, n - t), which depends on n and W only.

Mallows and window orders (and uniform ones) are drawn *step by step*: at step t the order takes the
r_t-th leftmost position not yet read, with independent ranks r_t (`decode_ranks`). For window:W,
r_t is uniform on {0 .. min(W, n - t) - 1}. For Mallows, r_t is a truncated geometric,
P(r_t = k) proportional to exp(-THETA * k) on {0 .. n - t - 1}: the rank vector is the order's Lehmer
code, whose sum is inv(sigma), so the product of the step probabilities is exactly
exp(-THETA * inv(sigma)) / Z with Z = prod_{i=1..n} (1 - e^(-THETA i)) / (1 - e^(-THETA)). This is the
repeated-insertion method read backwards (inverting a permutation keeps its inversion count), and it
is exact: no Markov chain, no rejection.

Generation also accepts the *adaptive* orders ``confidence``, ``margin`` and ``entropy`` (`ADAPTIVE`,
`is_adaptive`): the model chooses the next positions while decoding, from its own distribution
(`aogpt.generation.adaptive`), so they are no permutation that could be drawn up front, and
training and evaluation refuse them.

Besides specs, generation and evaluation accept explicit orders: a permutation (n,) for every
sequence or one per sequence (N, n), checked by `check_permutation`. Whether something is left to
right is answered by `is_left_to_right`, for specs, samplers and tensors alike.

**Which slots read left to right** (`identity_run`, `left_to_right_slots`, `gates`): slot i of an
order reads left to right when the order so far is the identity, ``order[:i+1] == 0..i``: it holds
x[i-1] (the start token for i = 0) after reading x[0..i-1] in that order and predicts x[i], exactly
what a left-to-right model computes there. These slots form the order's leading identity run. A
model with a gated pathway (`aogpt.pathway`) computes them with its source's weights alone (gate 0)
and every other slot through the new pathway (gate 1); training, evaluation and generation all take
the gate from here.
"""

from __future__ import annotations

import math

import torch

from aogpt.errors import AOGPTError
from aogpt.validation import SEED_MAX, Range

_SEED = Range(ge=0, le=SEED_MAX, integer=True)
_BLOCK = Range(ge=2, le=2**20, integer=True)
_PROBABILITY = Range(ge=0, le=1)
DISPERSION = Range(ge=0, le=1e6)  # exp(-1e6) underflows: larger is left to right; "inf" is accepted too
_WIDTH = Range(ge=1, le=2**20, integer=True)
_WEIGHT = Range(ge=0, le=1e6)  # a blend's part: weights are normalised

ORDER_SPECS = ("l2r", "uniform", "mixture[:P]", "fixed-random[:SEED]", "blockwise[:K[:SEED]]", "mallows:THETA",
               "window:W", "infill[:L]", "SPEC*W+SPEC*W")
INFILL_SPANS = (8, 32, 64)  # the gap lengths an infilling order draws by default (and `aogpt eval --infill` scores)
ALIASES = {"random": "uniform"}  # generation's and evaluation's historical name for uniform orders
ADAPTIVE = ("confidence", "margin", "entropy")  # chosen by the model while generating


def is_adaptive(order: object) -> bool:
    """Whether `order` names an adaptive order (generation only; module docstring)."""
    return isinstance(order, str) and order in ADAPTIVE


class OrderSampler:
    """Draws a batch of orders; subclasses define `sample`."""

    spec: str = ""
    is_fixed: bool = False  # the same order every time (l2r, fixed-random, blockwise)
    left_to_right: bool = False  # always the identity (l2r, and the limits mallows:inf and window:1)

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
    left_to_right = True

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


ORDER_EXAMPLES = {"mixture": "mixture:0.1", "infill": "infill:32", "fixed-random": "fixed-random:7",
                  "blockwise": "blockwise:4 or blockwise:8:3", "mallows": "mallows:1 (0: uniform, inf: l2r)",
                  "window": "window:8"}

def decode_ranks(ranks: torch.Tensor) -> torch.Tensor:
    """Orders (B, n) from rank vectors (B, n): step t reads the ``ranks[:, t]``-th leftmost position
    not yet read (0-based; each rank must be below n - t). A rank vector is a permutation's Lehmer
    code, so this is a bijection between {0..n-1} x {0..n-2} x ... x {0} and the permutations."""
    B, n = ranks.shape
    unread = torch.ones(B, n, dtype=torch.bool, device=ranks.device)
    out = torch.empty(B, n, dtype=torch.long, device=ranks.device)
    rows = torch.arange(B, device=ranks.device)
    for t in range(n):  # n small steps, each over the whole batch at once
        nth_unread = unread.cumsum(1) == ranks[:, t:t + 1] + 1
        pick = (nth_unread & unread).to(torch.uint8).argmax(1)
        out[:, t] = pick
        unread[rows, pick] = False
    return out


def mallows_ranks(batch: int, n: int, theta: float, device: torch.device | str = "cpu",
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Independent truncated geometric ranks, P(r_t = k) proportional to exp(-theta k) on
    {0 .. n - t - 1}, by inverting the CDF in float64: r = floor(log1p(U (e^(-theta m) - 1)) / -theta)
    with m = n - t choices (-> floor(U m) as theta -> 0)."""
    u = torch.rand(batch, n, device=device, generator=generator, dtype=torch.float64)
    choices = torch.arange(n, 0, -1, device=device, dtype=torch.float64)  # m = n - t
    if theta == 0.0:
        ranks = torch.floor(u * choices)
    elif math.isinf(theta):
        ranks = torch.zeros_like(u)
    else:
        ranks = torch.floor(torch.log1p(u * torch.expm1(-theta * choices)) / -theta)
    return torch.minimum(ranks.clamp_(min=0), choices - 1).long()


def mallows_log_normalizer(n: int, theta: float) -> float:
    """log Z(n, theta) = sum_{i=1..n} log((1 - e^(-theta i)) / (1 - e^(-theta))), so that
    P(sigma) = exp(-theta inv(sigma)) / Z; log n! at theta = 0."""
    if theta == 0.0:
        return math.lgamma(n + 1)
    if math.isinf(theta):
        return 0.0
    return sum(math.log(-math.expm1(-theta * i)) - math.log(-math.expm1(-theta)) for i in range(1, n + 1))


def inversions(order: torch.Tensor) -> torch.Tensor:
    """inv(sigma) per row: pairs s < t with order[s] > order[t] (positions read against the text)."""
    return (order[..., :, None] > order[..., None, :]).triu(diagonal=1).sum((-2, -1))


class Mallows(OrderSampler):
    """Mallows permutations around the identity (module docstring): exact, step-by-step ranks."""

    def __init__(self, theta: float):
        if math.isnan(theta) or theta < 0:
            raise AOGPTError(f"Mallows dispersion {theta} must be >= 0", "use e.g. mallows:1 (0: uniform, inf: l2r)")
        self.theta = theta
        self.spec = f"mallows:{theta:g}"
        self.left_to_right = math.isinf(theta)

    def sample(self, batch, n, device="cpu", generator=None):
        return decode_ranks(mallows_ranks(batch, n, self.theta, device, generator))


class Window(OrderSampler):
    """Each step reads a uniformly drawn one of the W leftmost unread positions (module docstring)."""

    def __init__(self, width: int):
        if width < 1:
            raise AOGPTError(f"window width {width} must be at least 1", "use e.g. window:8")
        self.width = width
        self.spec = f"window:{width}"
        self.left_to_right = width == 1

    def sample(self, batch, n, device="cpu", generator=None):
        u = torch.rand(batch, n, device=device, generator=generator, dtype=torch.float64)
        choices = torch.arange(n, 0, -1, device=device, dtype=torch.float64).clamp(max=self.width)
        return decode_ranks(torch.floor(u * choices).long())


class Infill(OrderSampler):
    """A prefix left to right, the text after a gap left to right, then the gap left to right (module
    docstring): gap lengths `lengths` (one drawn per sequence, at most n), starts uniform over those
    that fit."""

    def __init__(self, length: int | None = None):
        self.lengths = INFILL_SPANS if length is None else (length,)
        self.spec = "infill" if length is None else f"infill:{length}"

    def sample(self, batch, n, device="cpu", generator=None):
        lengths = torch.tensor(self.lengths, device=device).clamp(max=n)
        pick = torch.randint(len(self.lengths), (batch, 1), device=device, generator=generator)
        gap = lengths[pick]  # (B, 1)
        start = (torch.rand(batch, 1, device=device, generator=generator) * (n - gap + 1)).long()
        p = torch.arange(n, device=device)
        inside = (p >= start) & (p < start + gap)
        return (p + n * inside).argsort(dim=1, stable=True)  # prefix, suffix, then the gap

    def gap_lengths(self, n: int) -> tuple[int, ...]:
        return tuple(min(length, n) for length in self.lengths)


class Blend(OrderSampler):
    """Each sequence reads an order of one of `parts` (samplers), drawn with probability proportional
    to its weight; every part draws a whole batch, so the streams do not depend on which rows took it."""

    def __init__(self, parts: list[tuple[OrderSampler, float]]):
        total = sum(w for _, w in parts)
        if len(parts) < 2 or total <= 0 or any(w < 0 for _, w in parts):
            raise AOGPTError("a blend of orders needs at least two specs with weights >= 0 (not all 0)",
                             "e.g. uniform*0.75+infill*0.25")
        self.parts = [(sampler, w / total) for sampler, w in parts]
        self.spec = "+".join(f"{sampler.spec}*{w:g}" for sampler, w in self.parts)
        self.left_to_right = all(sampler.left_to_right for sampler, w in self.parts if w > 0)

    def sample(self, batch, n, device="cpu", generator=None):
        u = torch.rand(batch, 1, device=device, generator=generator)
        edges = torch.tensor([w for _, w in self.parts], device=device).cumsum(0)
        which = (u > edges[:-1]).sum(dim=1)  # the part each row reads
        out = identity(batch, n, device).clone()
        for k, (sampler, _) in enumerate(self.parts):
            drawn = sampler.sample(batch, n, device, generator)
            out = torch.where((which == k)[:, None], drawn, out)
        return out


def _blend(spec: str) -> Blend:
    parts = []
    for part in spec.split("+"):
        inner, star, weight = part.strip().rpartition("*")
        if not star or not inner:
            raise AOGPTError(f"order blend {spec!r}: the part {part!r} has no weight",
                             "write SPEC*WEIGHT parts joined by +, e.g. uniform*0.75+infill*0.25")
        try:
            w = float(_WEIGHT.parse(weight))
        except ValueError:
            raise AOGPTError(f"order blend {spec!r}: the weight of {inner!r} must be a number >= 0",
                             "e.g. uniform*0.75+infill*0.25") from None
        parts.append((make_order_sampler(inner), w))
    return Blend(parts)


def make_order_sampler(spec: str) -> OrderSampler:
    """Parse an order spec (see the module docstring) into a sampler."""
    if isinstance(spec, OrderSampler):
        return spec
    if is_adaptive(spec):
        raise AOGPTError(f"order {spec} is chosen by the model while generating, not drawn in advance",
                         "use it to sample (aogpt sample --order " + spec + "); here use e.g. uniform or l2r")
    spec = ALIASES.get(spec, spec)
    if "+" in spec:
        return _blend(spec)
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
        if name == "mallows" and len(args) == 1:
            inf = args[0].strip().lower() in ("inf", "infinity")
            return Mallows(math.inf if inf else float(_arg(spec, "dispersion", DISPERSION, args[0])))
        if name == "window" and len(args) == 1:
            return Window(int(_arg(spec, "window width", _WIDTH, args[0])))
        if name == "infill" and len(args) <= 1:
            return Infill(int(_arg(spec, "gap length", _WIDTH, args[0])) if args else None)
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
    if not isinstance(order, OrderSampler):
        try:
            order = make_order_sampler(order)
        except AOGPTError:  # an adaptive or unknown name: not a left-to-right order
            return False
    return order.left_to_right


# ------------------------------------------------------------------ which slots read left to right
def identity_run(order: torch.Tensor) -> torch.Tensor:
    """(...,) the length of the leading identity run of `order` (..., n): how many of its first
    steps read positions 0, 1, 2, ... in that order (n for left to right, usually 0 for a random order)."""
    steps = torch.arange(order.shape[-1], device=order.device)
    return (order == steps).long().cumprod(dim=-1).sum(dim=-1)


def left_to_right_slots(pos: torch.Tensor, target: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
    """(B, S) bool: the slots that read left to right (module docstring), from the slot layout of
    `aogpt.model` (pos: the position of a slot's token + 1, 0 for the start slot; target: the position
    it predicts). A slot continues left to right when it predicts the position right after its
    token's (``target == pos``); it reads left to right when it does and every slot before it in its
    chain did. `context` (B, S) bool says, per slot, whether the chain before it read left to right;
    None: the slots are one chain from its start slot, in order (a forward over an order's slots)."""
    here = target == pos
    if context is None:
        return here.long().cumprod(dim=-1).bool()
    return here & context


def step_gates(run: torch.Tensor, seq: torch.Tensor, read: torch.Tensor, pos: torch.Tensor,
               target: torch.Tensor) -> torch.Tensor:
    """The gates of a decode step's slots (any shape, True: through the pathway): a slot of sequence `seq`
    has read `read` tokens of its chain (its content is chain slot `read`: a query holds the pending
    slot's), whose leading identity run is ``run[seq]`` (`identity_run` of the chain, or of its decided
    part); it reads left to right when those tokens are positions 0..read-1 in order (read <= run) and it
    continues them (`left_to_right_slots`)."""
    return ~left_to_right_slots(pos, target, read <= run[seq])


def gates(order: torch.Tensor) -> torch.Tensor:
    """(B, n) bool: True for the slots of `order` that do not read left to right (they go through a
    gated pathway), False for its leading identity run."""
    steps = torch.arange(order.shape[-1], device=order.device)
    return steps >= identity_run(order)[..., None]
