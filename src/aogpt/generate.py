"""Fast generation for the decoder variants: static KV cache, parallel query slots, Lemma 4.1.

The chain. Every sequence is generated along a *chain order* (a permutation of its n positions):
known tokens first (prompt or infill, ascending), then the masked positions in the unmasking order
(random, left to right or user-given). Chain slot i (the model's slot layout, `aogpt.model`) holds
the token at chain position i - 1 (the start token for i = 0) and targets chain position i. Its
keys and values depend on that target, so they can be computed only once the target is decided
(DESIGN.md section 1): the last decided token is *pending*.

One step reveals k_b positions of sequence b (k_b from `aogpt.schedules`). With g_b tokens decided
and L_b slots cached, the step evaluates, in one forward over the static cache:

- catch-up slots L_b .. g_b - 1 (decided in the previous step, not yet cached), causally;
- k_b query slots: the pending slot g_b's content, each with one of the new targets. Query j is
  written at cache column g_b + j and attends to columns [0, g_b) and to itself only (paper Fig. 10).

Cache column = chain slot index, always: query 0 *is* slot g_b and stays committed; the other query
columns are scratch, overwritten by the next step's catch-ups. So a row at column `col` reads
content slot min(col, g_b), targets chain position col, and attends to {c < g_b, c <= col} | {col}.
Afterwards L_b = g_b + 1 and g_b += k_b. A sequence with k_b = 0 sits the step out. Total work is
n queries + (n - steps) catch-ups, about 2n slot evaluations, and nothing is ever concatenated.

Batches: when every sequence has the same (L, g, k) (the ``count`` policy) all rows write at one
int column (`KVCache.write_index`), and a single-slot step needs no mask at all. Otherwise rows are
padded to the longest sequence; padded rows write to columns nobody reads before they are
rewritten (or to the scratch column n) and are never selected.

``use_cache=False`` is the same step with L_b = 0: all decided slots are recomputed every step (the
benchmark's baseline and a test oracle for the cache logic).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from aogpt.errors import AOGPTError
from aogpt.sampling import SamplingConfig, sample_tokens
from aogpt.schedules import POLICIES, bernoulli_counts, check_choice, count_schedule, unmask_probabilities

__all__ = ["GenerationResult", "generate", "infill", "make_generators", "Conditioning"]


@dataclass
class GenerationResult:
    """Samples and how they were made.

    tokens: (N, n) int64. orders: (N, n) chain orders (orders[b, i] = position decided i-th; known
    positions first). step_counts: (N, T) positions revealed per step. logits: with
    ``record_logits``, (N, n, V): column i holds the logits the model gave for position orders[:, i]
    (NaN for known positions).
    """

    tokens: torch.Tensor
    orders: torch.Tensor
    step_counts: torch.Tensor
    known: torch.Tensor
    texts: list[str] | None = None
    timing: dict[str, float] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    logits: torch.Tensor | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly summary (samples, timing, settings)."""
        out: dict[str, Any] = {"tokens": self.tokens.tolist(), "timing": self.timing, "settings": self.settings}
        if self.texts is not None:
            out["samples"] = self.texts
        return out


@dataclass
class Generators:
    """Random streams: `tokens` (the model's device) draws tokens, `plan` (CPU) orders and counts."""

    seed: int
    tokens: torch.Generator
    plan: torch.Generator


def make_generators(seed: int, device: torch.device | str) -> Generators:
    """The generators `generate(seed=...)` uses: tokens from `seed` on the device, plans from seed + 1."""
    tok = torch.Generator(device=device).manual_seed(seed)
    plan = torch.Generator().manual_seed(seed + 1)
    return Generators(seed, tok, plan)


# --------------------------------------------------------------------------- conditioning
@dataclass
class Conditioning:
    """What is known before generation: output length and the given (position, token) pairs."""

    length: int
    positions: torch.Tensor  # (m,) int64, distinct
    tokens: torch.Tensor  # (m,) int64


BLANK = re.compile(r"\[MASK(?::([^\]]*))?\]")


def _check_length(n: int, config: Any, what: str) -> None:
    if not 1 <= n <= config.block_size:
        raise AOGPTError(f"{what} of {n} tokens does not fit the model's context of {config.block_size}",
                         f"use a length in 1..{config.block_size}")


def _known(n: int, pairs: list[tuple[int, int]], config: Any) -> Conditioning:
    bad = [t for _, t in pairs if not 0 <= t < config.vocab_size]
    if bad:
        raise AOGPTError(f"token ids {bad[:5]} are outside the model's vocabulary of {config.vocab_size}",
                         "use ids from the model's tokenizer")
    pos = torch.tensor([p for p, _ in pairs], dtype=torch.long)
    tok = torch.tensor([t for _, t in pairs], dtype=torch.long)
    return Conditioning(n, pos, tok)


def _encode(text: str, tokenizer: Any, what: str) -> list[int]:
    if tokenizer is None:
        raise AOGPTError(f"a text {what} needs a tokenizer", "pass tokenizer=..., or token ids")
    return list(tokenizer.encode(text)) if text else []


def prompt_condition(prompt: Any, length: int | None, tokenizer: Any, config: Any) -> Conditioning:
    """A prefix prompt (text or ids) of an output of `length` tokens (default: the context)."""
    n = config.block_size if length is None else int(length)
    _check_length(n, config, "an output length")
    if prompt is None:
        ids: list[int] = []
    elif isinstance(prompt, str):
        ids = _encode(prompt, tokenizer, "prompt")
    else:
        ids = [int(t) for t in torch.as_tensor(prompt).flatten().tolist()]
    if len(ids) >= n:
        raise AOGPTError(f"the prompt has {len(ids)} tokens, leaving nothing to generate in a length of {n}",
                         f"use a length above {len(ids)} (at most {config.block_size})")
    return _known(n, list(enumerate(ids)), config)


def parse_template(template: Any, *, tokenizer: Any, length: int | None, config: Any) -> Conditioning:
    """Text with ``[MASK]`` / ``[MASK:k]`` blanks, a {position: token} mapping, or ids with None blanks."""
    if isinstance(template, str):
        if not BLANK.search(template):
            raise AOGPTError("the infilling template has no blank",
                             "mark blanks with [MASK] or [MASK:k], or use a prompt to continue a prefix")
        slots: list[int | None] = []
        at = 0
        for mt in BLANK.finditer(template):
            slots += _encode(template[at:mt.start()], tokenizer, "template")
            arg = mt.group(1)
            if arg is not None and not (arg.isdigit() and int(arg) > 0):
                raise AOGPTError(f"bad blank {mt.group(0)!r} in the template", "write [MASK] or [MASK:k], k >= 1")
            slots += [None] * (int(arg) if arg else 1)
            at = mt.end()
        slots += _encode(template[at:], tokenizer, "template")
    elif isinstance(template, Mapping):
        if length is None:
            raise AOGPTError("a {position: token} template needs an output length", "pass length=...")
        slots = [None] * int(length)
        for p, t in template.items():
            if not 0 <= int(p) < int(length):
                raise AOGPTError(f"template position {p} is outside 0..{int(length) - 1}", "fix the position")
            slots[int(p)] = int(t)
    else:
        slots = [None if t is None else int(t) for t in template]
    n = len(slots) if length is None else int(length)
    if n < len(slots):
        raise AOGPTError(f"the template has {len(slots)} tokens, more than the length {n}", "raise the length")
    _check_length(max(n, len(slots)), config, "the template")
    slots += [None] * (n - len(slots))
    if all(t is not None for t in slots):
        raise AOGPTError("the infilling template has no blank", "leave some positions blank")
    return _known(n, [(p, t) for p, t in enumerate(slots) if t is not None], config)


# --------------------------------------------------------------------------- the decode loop
class _Chunk:
    """One batch of sequences decoded along fixed chain orders with a fixed per-step plan."""

    def __init__(self, model: torch.nn.Module, chain: torch.Tensor, known: torch.Tensor, plan: np.ndarray,
                 use_cache: bool, teacher: torch.Tensor | None, record: bool):
        B, n = chain.shape
        dev = chain.device
        m = known.numel()
        self.model, self.B, self.n, self.m, self.plan = model, B, n, m, plan
        self.use_cache, self.teacher = use_cache, teacher
        self.ar = torch.arange(n + 1, device=dev)
        # content of chain slot i is ychain[:, i] (start = -1); column n + 1 is a write sink
        self.ychain = torch.full((B, n + 2), -1, dtype=torch.long, device=dev)
        self.ychain[:, 1:m + 1] = known
        self.pos = torch.cat([torch.zeros_like(chain[:, :1]), chain + 1], dim=1)
        self.tgt = torch.cat([chain, torch.full_like(chain[:, :1], model.config.block_size)], dim=1)
        self.cache = model.new_cache(B, n + 1) if use_cache else None
        self.L = np.zeros(B, dtype=np.int64)
        self.g = np.full(B, m, dtype=np.int64)
        self.uniform = bool((plan == plan[:1]).all())
        self.logits: torch.Tensor | None = None
        if record:
            V = model.config.vocab_size
            self.logits = torch.full((B, n, V), float("nan"), device=dev, dtype=next(model.parameters()).dtype)
        self.forwards = 0
        self.slots = 0
        self.padded = 0

    def run(self, cfg: SamplingConfig, gen: torch.Generator | None,
            progress: Callable[[int], None] | None) -> torch.Tensor:
        for i in range(self.plan.shape[1]):
            k = self.plan[:, i]
            if not k.any():
                continue  # nothing revealed: no forward (pending catch-ups simply wait)
            if self.uniform:
                self._uniform_step(int(k[0]), cfg, gen)
            else:
                self._general_step(k, cfg, gen)
            if progress is not None:
                progress(int(k.sum()))
        return self.ychain[:, 1:self.n + 1]

    def _draw(self, logits: torch.Tensor, cfg: SamplingConfig, gen: torch.Generator | None,
              teacher_index: tuple[Any, Any] | None) -> torch.Tensor:
        if self.teacher is not None:
            return self.teacher[teacher_index]
        return sample_tokens(logits, cfg, gen)

    def _uniform_step(self, k: int, cfg: SamplingConfig, gen: torch.Generator | None) -> None:
        B, ar = self.B, self.ar
        L, g = (int(self.L[0]) if self.use_cache else 0), int(self.g[0])
        c = g - L
        S = c + k
        span = L + S
        cols = ar[L:span]
        content = cols.clamp(max=g)
        tokens, pos, target = self.ychain[:, content], self.pos[:, content], self.tgt[:, cols]
        mask = None
        if S > 1:
            a = ar[:span]
            mask = (((a < g) & (a <= cols[:, None])) | (a == cols[:, None]))[None, None]
        if self.cache is not None:
            self.cache.write_index, self.cache.span = L, span
        select = None if c == 0 else (c + ar[:k]).expand(B, k)
        logits = self.model.forward_slots(tokens, pos, target, attn_mask=mask, cache=self.cache, select=select)
        new = self._draw(logits.reshape(B * k, -1), cfg, gen, (slice(None), slice(g, g + k)))
        self.ychain[:, g + 1:g + 1 + k] = new.view(B, k)
        if self.logits is not None:
            self.logits[:, g:g + k] = logits
        self.forwards += 1
        self.slots += B * S
        if self.use_cache:
            self.L[:] = g + 1
        self.g += k

    def _general_step(self, k: np.ndarray, cfg: SamplingConfig, gen: torch.Generator | None) -> None:
        B, n, dev = self.B, self.n, self.ar.device
        act = k > 0
        L = self.L if self.use_cache else np.zeros_like(self.L)
        g = self.g
        c = g - L
        rows = np.where(act, c + k, 0)
        S, R = int(rows.max()), int(k.max())
        r = np.arange(S)
        cols = np.minimum(L[:, None] + r, n)  # padded rows: columns not read before rewritten, or n
        span = int(cols.max()) + 1
        cols_t = torch.from_numpy(cols).to(dev)
        g_t = torch.from_numpy(g).to(dev)[:, None, None]
        content = torch.minimum(cols_t, g_t[:, :, 0])
        tokens = self.ychain.gather(1, content)
        pos, target = self.pos.gather(1, content), self.tgt.gather(1, cols_t)
        a = self.ar[:span]
        mask = (((a < g_t) & (a <= cols_t[..., None])) | (a == cols_t[..., None]))[:, None]
        j = np.arange(R)
        valid = j < k[:, None]
        select = torch.from_numpy(np.where(valid, c[:, None] + j, 0)).to(dev)
        if self.cache is not None:
            self.cache.write_index, self.cache.span = cols_t, span
        logits = self.model.forward_slots(tokens, pos, target, attn_mask=mask, cache=self.cache, select=select)
        bi, ji = np.nonzero(valid)
        bi_t, col_t = torch.from_numpy(bi).to(dev), torch.from_numpy(g[bi] + ji).to(dev)
        rows_logits = logits[torch.from_numpy(bi).to(dev), torch.from_numpy(ji).to(dev)]
        new = self._draw(rows_logits, cfg, gen, (bi_t, col_t))
        self.ychain[bi_t, col_t + 1] = new
        if self.logits is not None:
            self.logits[bi_t, col_t] = rows_logits
        self.forwards += 1
        self.slots += int(rows.sum())
        self.padded += B * S - int(rows.sum())
        if self.use_cache:
            self.L[act] = g[act] + 1
        self.g += k


# --------------------------------------------------------------------------- plans and orders
def chain_orders(base: torch.Tensor, known_mask: torch.Tensor) -> torch.Tensor:
    """Known positions first (ascending), then the other entries of `base` (B, n) in their order."""
    B, n = base.shape
    idx = torch.arange(n, device=base.device).expand(B, n)
    key = torch.where(known_mask[base], base - n, idx)  # known: negative keys, ascending by position
    return base.gather(1, key.argsort(dim=1, stable=True))


def _base_orders(order: Any, B: int, n: int, start: int, gen: torch.Generator) -> torch.Tensor:
    if isinstance(order, str):
        if order == "random":
            return torch.rand(B, n, generator=gen).argsort(dim=1)
        return torch.arange(n).expand(B, n)
    if order.dim() == 1:
        return order.expand(B, n)
    return order[start:start + B]


def _check_order(order: Any, N: int, n: int) -> Any:
    if order is None or isinstance(order, str):
        order = order or "random"
        check_choice("order", order, ("random", "l2r"))
        return order
    t = torch.as_tensor(order, dtype=torch.long).cpu()
    if t.dim() not in (1, 2) or t.shape[-1] != n or (t.dim() == 2 and t.shape[0] != N):
        raise AOGPTError(f"an order must have shape ({n},) or ({N}, {n}), got {tuple(t.shape)}",
                         "pass a permutation of the output positions")
    if not bool((t.sort(dim=-1).values == torch.arange(n)).all()):
        raise AOGPTError("the given order is not a permutation of 0..n-1", "list every position exactly once")
    return t


def _plan(policy: str, schedule: str, steps: int, masked: int, B: int, gen: torch.Generator) -> np.ndarray:
    """(B, T) positions revealed per step."""
    if policy == "count":
        return np.tile(np.asarray(count_schedule(masked, steps, schedule), dtype=np.int64), (B, 1))
    left = torch.full((B,), masked, dtype=torch.long)
    out = []
    for p in unmask_probabilities(steps, schedule):
        k = bernoulli_counts(left, p, gen)
        out.append(k)
        left = left - k
    return torch.stack(out, dim=1).numpy()


# --------------------------------------------------------------------------- public API
def _check_model(model: torch.nn.Module) -> None:
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(model, "forward_slots"):
        raise AOGPTError("generate needs an aogpt Transformer", "load one with aogpt.load(path).model")


def generate(model: torch.nn.Module, *, num_samples: int = 1, length: int | None = None, steps: int | None = None,
             policy: str | None = None, schedule: str = "linear", order: Any = None, temperature: float = 1.0,
             top_p: float = 1.0, top_k: int = 0, greedy: bool = False, prompt: Any = None, seed: int | None = None,
             use_cache: bool = True, batch_size: int | None = None, dtype: torch.dtype = torch.float64,
             tokenizer: Any = None, return_text: bool | None = None, teacher_tokens: torch.Tensor | None = None,
             record_logits: bool = False, progress: Callable[[int], None] | None = None,
             condition: Conditioning | None = None, skip_noop: bool = True) -> GenerationResult:
    """Sample `num_samples` sequences of `length` tokens (default: the model's context).

    steps: T in 1..length (default: one per position to generate). policy: "bernoulli" (Lemma 4.1,
    default for any-order variants) or "count" (deterministic; the only one for `gpt`). schedule:
    "linear" or "cosine" time grid. order: "random" (default), "l2r", or a permutation (n,) / (N, n).
    prompt: a prefix (text, needs `tokenizer`, or ids). teacher_tokens (N, n): feed these back instead
    of sampling (tests); record_logits keeps every query's logits. See docs/generation.md.
    Encoder-only MDM models run `aogpt.encoder.EncoderChunk` (no cache; skip_noop: skip the forward
    on steps that reveal nothing, docs/encoder.md).
    """
    _check_model(model)
    if condition is None:
        condition = prompt_condition(prompt, length, tokenizer, model.config)
    elif prompt is not None:
        raise AOGPTError("pass either a prompt or an infilling template, not both", "drop one")
    n, m = condition.length, condition.positions.numel()
    masked = n - m
    is_ar = model.config.target == "none" and model.config.causal
    policy = policy or ("count" if is_ar else "bernoulli")
    check_choice("policy", policy, POLICIES)
    steps = masked if steps is None else int(steps)
    if not 1 <= steps <= n:
        raise AOGPTError(f"steps must lie in 1..{n} (the output length), got {steps}",
                         f"use e.g. --steps {masked}")
    if num_samples < 1:
        raise AOGPTError(f"num_samples must be >= 1, got {num_samples}", "ask for at least one sample")
    batch_size = 32 if batch_size is None else int(batch_size)
    if batch_size < 1:
        raise AOGPTError(f"batch size must be >= 1, got {batch_size}", "use e.g. --batch-size 8")
    batch_size = min(num_samples, batch_size)
    order = _check_order("l2r" if (order is None and is_ar) else order, num_samples, n)
    vocab_limit = getattr(tokenizer, "vocab_size", None)
    if vocab_limit is not None and vocab_limit > model.config.vocab_size:
        raise AOGPTError(f"tokenizer has {vocab_limit} ids but the model only {model.config.vocab_size}",
                         "use the tokenizer the model was trained with")
    cfg = SamplingConfig(temperature, top_p, top_k, greedy, dtype, vocab_limit).validate()
    if is_ar:
        _check_ar(policy, schedule, steps, masked, order, condition)
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little") >> 2
    device = next(model.parameters()).device
    gens = make_generators(int(seed), device)
    if teacher_tokens is not None:
        teacher_tokens = torch.as_tensor(teacher_tokens, dtype=torch.long).to(device)
        if teacher_tokens.shape != (num_samples, n):
            raise AOGPTError(f"teacher_tokens must have shape ({num_samples}, {n})", "fix its shape")

    known_mask = torch.zeros(n, dtype=torch.bool)
    known_mask[condition.positions] = True
    known_chain = condition.tokens[condition.positions.argsort()].to(device)
    tokens, orders, plans, logits = [], [], [], []
    stats = {"forwards": 0, "slot_evaluations": 0, "padded_slots": 0}
    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            for start in range(0, num_samples, batch_size):
                B = min(batch_size, num_samples - start)
                chain = chain_orders(_base_orders(order, B, n, start, gens.plan), known_mask)
                plan = _plan(policy, schedule, steps, masked, B, gens.plan)
                chain_d = chain.to(device)
                teacher = None if teacher_tokens is None else teacher_tokens[start:start + B].gather(1, chain_d)
                if model.config.causal:
                    chunk = _Chunk(model, chain_d, known_chain, plan, use_cache, teacher, record_logits)
                else:
                    from aogpt.encoder import EncoderChunk

                    chunk = EncoderChunk(model, chain_d, known_chain, plan, use_cache, teacher, record_logits,
                                         skip_noop)
                y = chunk.run(cfg, gens.tokens, progress)
                tokens.append(torch.empty_like(y).scatter_(1, chain_d, y).cpu())
                orders.append(chain)
                plans.append(torch.from_numpy(plan))
                if chunk.logits is not None:
                    logits.append(chunk.logits.cpu())
                stats["forwards"] += chunk.forwards
                stats["slot_evaluations"] += chunk.slots
                stats["padded_slots"] += chunk.padded
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    finally:
        model.train(was_training)
    seconds = time.perf_counter() - t0
    out_tokens = torch.cat(tokens)
    want_text = tokenizer is not None if return_text is None else return_text
    if want_text and tokenizer is None:
        raise AOGPTError("return_text needs a tokenizer", "pass tokenizer=... or use aogpt.load(...).generate")
    texts = [tokenizer.decode(row) for row in out_tokens] if want_text else None
    timing = {"seconds": seconds, "tokens_per_second": num_samples * masked / max(seconds, 1e-9), **stats}
    settings = {"num_samples": num_samples, "length": n, "known_tokens": m, "steps": steps, "policy": policy,
                "schedule": schedule, "order": order if isinstance(order, str) else "given", "seed": int(seed),
                "use_cache": use_cache and model.config.causal, "batch_size": batch_size,
                "variant": model.config.variant,
                **cfg.to_dict()}
    return GenerationResult(out_tokens, torch.cat(orders), torch.cat(plans), known_mask, texts, timing, settings,
                            torch.cat(logits) if logits else None)


def _check_ar(policy: str, schedule: str, steps: int, masked: int, order: Any, cond: Conditioning) -> None:
    """A left-to-right GPT has no target input: it can only reveal the next position, one per step."""
    if policy != "count":
        raise AOGPTError("variant gpt generates one token per step, left to right", "use policy count")
    if isinstance(order, str) and order != "l2r" or not isinstance(order, str) and not bool(
            (order == torch.arange(order.shape[-1])).all()):
        raise AOGPTError("variant gpt generates left to right only", "use order l2r")
    if max(count_schedule(masked, steps, schedule)) > 1:
        raise AOGPTError(f"variant gpt cannot reveal several tokens per step ({steps} steps for {masked} tokens)",
                         f"use steps {masked}")
    if not bool((cond.positions.sort().values == torch.arange(cond.positions.numel())).all()):
        raise AOGPTError("variant gpt can only continue a prefix, not fill blanks", "use an aogpt or sigma model")


def infill(model: torch.nn.Module, template: Any, *, tokenizer: Any = None, length: int | None = None,
           **kwargs: Any) -> GenerationResult:
    """Fill the blanks of `template`; known tokens are prefilled once and never changed.

    template: text with blanks ``[MASK]`` (one token) or ``[MASK:k]`` (k tokens), needs `tokenizer`;
    a {position: token} mapping (needs `length`); or a list of ids with None for blanks. `length`
    extends the output with blanks at the end. Other arguments as in `generate`.
    """
    _check_model(model)
    cond = parse_template(template, tokenizer=tokenizer, length=length, config=model.config)
    return generate(model, tokenizer=tokenizer, condition=cond, **kwargs)
