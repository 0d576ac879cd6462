"""Generation: the public entry point for every model family.

`generate(model, ...)` samples sequences and `infill(model, template, ...)` fills blanks. Both take
a `GenerationSettings` (`aogpt.generation.settings`) and/or its fields as keyword shortcuts, check
everything before any work is done, draw the plan up front (`aogpt.generation.plan`) and hand each
batch to the sampler of the model's family (`aogpt.families`): the decoder's KV-cache sampler
(`aogpt.generation.decoder`) or the encoder's reverse process. See docs/generation.md.

`aogpt.generate` and `aogpt.infill` are these two functions.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from aogpt.errors import AOGPTError
from aogpt.families import family_of, unwrap
from aogpt.generation.conditioning import Conditioning, parse_template, prompt_condition
from aogpt.generation.plan import base_orders, chain_orders, resolve_order, step_counts
from aogpt.generation.reveal import Revealed, watch
from aogpt.generation.samplers import adaptive_sampler, fixed_order_sampler, speculative_sampler
from aogpt.generation.settings import DecodePlan, GenerationSettings, settings_from
from aogpt.generation.streams import SequenceStreams
from aogpt.inference import for_inference
from aogpt.memory import check_fits, generation_bytes
from aogpt.orders import is_adaptive
from aogpt.schedules import count_schedule

__all__ = ["Conditioning", "DecodePlan", "GenerationResult", "GenerationSettings", "generate", "infill", "text_end"]


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


def text_end(row: Any, start: int, eot: int | None) -> int | None:
    """Where a continuation's text ends: the position of the first end-of-text token at or after
    `start` in position order (None: none, or no `eot`). In any order but left to right, tokens
    after it may have been revealed before it; they belong to the sample, not to its text."""
    if eot is None:
        return None
    hits = np.flatnonzero(np.asarray(row)[start:] == eot)
    return start + int(hits[0]) if len(hits) else None


def _check_model(model: Any) -> torch.nn.Module:
    core = unwrap(model)
    if getattr(core, "config", None) is None or not hasattr(core, "forward_slots"):
        raise AOGPTError("generate needs an aogpt Transformer", "load one with aogpt.load(path).model")
    return core


@dataclass
class _Request:
    """Everything `generate` resolved and checked before any work: the model and its family, the
    settings, what is known, the plan's shape (steps, policy, order) and the random streams."""

    model: torch.nn.Module
    family: Any
    settings: GenerationSettings
    sampling: Any  # aogpt.sampling.SamplingConfig with the tokenizer's vocabulary limit
    num_samples: int
    batch_size: int
    length: int
    known_mask: torch.Tensor  # (n,) bool
    known_chain: torch.Tensor  # known tokens in ascending position order, on the model's device
    steps: int
    policy: str
    order_arg: Any  # the order as asked (None: random), for the report and the adaptive samplers
    order: Any  # resolved fixed order (`resolve_order`); for an adaptive order "l2r" (known positions first)
    adaptive: bool
    speculative: int | str | None  # draft length K or "auto" (`aogpt.generation.speculative`); None: off
    seed: int | list[int]  # sequence i draws from its own streams, keyed by (seed, i) or (seed[i], 0): `streams`
    teacher_tokens: torch.Tensor | None
    record_logits: bool
    on_step: Callable[[Revealed], None] | None = None

    @property
    def masked(self) -> int:
        return self.length - int(self.known_mask.sum())


@dataclass
class _Batch:
    """What one batch's sampler returned: tokens by position, its chain orders and step counts."""

    tokens: torch.Tensor
    orders: torch.Tensor
    step_counts: torch.Tensor
    logits: torch.Tensor | None
    forwards: int
    slots: int
    padded: int
    drafts: tuple[list[int], list[int]] | None = None  # speculative: (verified, accepted) by draft position


def generate(model: torch.nn.Module, *, settings: GenerationSettings | None = None, num_samples: int = 1,
             length: int | None = None, prompt: Any = None, seed: int | Sequence[int] | None = None,
             tokenizer: Any = None, return_text: bool | None = None, teacher_tokens: torch.Tensor | None = None,
             record_logits: bool = False, progress: Callable[[int], None] | None = None,
             condition: Conditioning | None = None, on_step: Callable[[Revealed], None] | None = None,
             **overrides: Any) -> GenerationResult:
    """Sample `num_samples` sequences of `length` tokens (default: the model's context).

    settings: a `GenerationSettings`; keyword shortcuts override its fields (None: keep): steps (T
    in 1..length, default one per position to generate), policy ("bernoulli": Lemma 4.1, the default
    where several tokens per step are possible; "count": deterministic), schedule ("linear" or
    "cosine"), order (an `aogpt.orders` spec, default "random", or permutations (n,) / (N, n), or
    "confidence" / "margin" / "entropy": chosen by the model while decoding, with candidates and
    threshold, `aogpt.generation.adaptive`), speculative (K or "auto": exact self-speculative
    decoding, `aogpt.generation.speculative`; replaces steps and policy),
    temperature, top_p, top_k, greedy, dtype (precision of the draw, default float64),
    batch_size (default 32), use_cache, prepack (the decode path's prepared kernels, `aogpt.inference`),
    attention (the decode attention kernel, `aogpt.attention.KERNELS`; default auto), compile
    (torch.compile the decode step), skip_noop (an encoder skips the forward of steps that reveal
    nothing, docs/encoder.md), decode_path ("fast", the default: the kernels `aogpt.decode` measured;
    "reference": the model's own layers), graphs ("auto": a GPU's decode steps captured as CUDA
    graphs, `aogpt.decode.graphs`; "off"; "eager": their static shapes without capture). Sample i
    draws from its own random streams keyed by (seed, i)
    (`aogpt.generation.streams`): the batch size, the cache and the decode path do not change it.
    `seed` may also be one seed per sample: sample i then draws what ``generate(seed=seed[i])``
    draws for its only sample (independent requests decoded as one batch, as `aogpt serve` does).
    prompt: a prefix (text, needs `tokenizer`, or ids). teacher_tokens (N, n): feed these back instead
    of sampling (tests); record_logits keeps every query's logits. on_step: called after every step
    with the positions it revealed (`aogpt.generation.reveal.Revealed`). See docs/generation.md.
    """
    want_text = tokenizer is not None if return_text is None else return_text
    if want_text and tokenizer is None:
        raise AOGPTError("return_text needs a tokenizer", "pass tokenizer=... or use aogpt.load(...).generate")
    req = _resolve(model, settings, overrides, num_samples=num_samples, length=length, prompt=prompt,
                   condition=condition, tokenizer=tokenizer, seed=seed, teacher_tokens=teacher_tokens,
                   record_logits=record_logits)
    req.on_step = on_step
    batches, seconds = _run(req, progress)
    result = _assemble(req, batches, seconds)
    if want_text:
        result.texts = [tokenizer.decode(row) for row in result.tokens]
    return result


def _resolve(model: torch.nn.Module, settings: GenerationSettings | None, overrides: dict[str, Any], *,
             num_samples: int, length: int | None, prompt: Any, condition: Conditioning | None, tokenizer: Any,
             seed: int | Sequence[int] | None, teacher_tokens: Any, record_logits: bool) -> _Request:
    """Check every argument against the model's family and resolve the defaults (known positions,
    steps, policy, order, seed), so that a mistake is reported before any forward runs."""
    model = _check_model(model)
    fam = family_of(model)
    settings = settings_from(settings, **{k: v for k, v in overrides.items() if v is not None}).validate()
    if condition is None:
        condition = prompt_condition(prompt, length, tokenizer, model.config)
    elif prompt is not None:
        raise AOGPTError("pass either a prompt or an infilling template, not both", "drop one")
    n = condition.length
    masked = n - condition.positions.numel()
    plan_cfg = settings.plan
    adaptive = is_adaptive(plan_cfg.order)  # chosen while decoding: aogpt.generation.adaptive
    policy = plan_cfg.policy or ("count" if adaptive else fam.default_policy)
    steps = masked if plan_cfg.steps is None else int(plan_cfg.steps)
    if not 1 <= steps <= n:
        raise AOGPTError(f"steps must lie in 1..{n} (the output length), got {steps}",
                         f"use e.g. --steps {masked}")
    if num_samples < 1:
        raise AOGPTError(f"num_samples must be >= 1, got {num_samples}", "ask for at least one sample")
    speculative = plan_cfg.speculative
    if speculative is not None and (teacher_tokens is not None or record_logits):
        raise AOGPTError("speculative decoding draws and verifies its own tokens", "drop teacher_tokens/record_logits")
    batch_size = min(num_samples, settings.batch_size)
    order_arg = plan_cfg.order if plan_cfg.order is not None else (None if fam.any_order else "l2r")
    order = resolve_order("l2r" if adaptive else order_arg, num_samples, n)  # adaptive: known positions first
    # ids a sampler may draw: the tokenizer's text ids (a fill-in-the-middle tokenizer's sentinels excluded)
    vocab_limit = getattr(tokenizer, "text_vocab_size", getattr(tokenizer, "vocab_size", None))
    if vocab_limit is not None and vocab_limit > model.config.vocab_size:
        raise AOGPTError(f"tokenizer has {vocab_limit} ids but the model only {model.config.vocab_size}",
                         "use the tokenizer the model was trained with")
    sampling = dataclasses.replace(settings.sampling, vocab_limit=vocab_limit).validate()
    if speculative is None:
        fam.check_generation(policy=policy, counts=lambda: count_schedule(masked, steps, plan_cfg.schedule),
                             order=order_arg if adaptive else order, known_positions=condition.positions)
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little") >> 2
    elif not isinstance(seed, (int, np.integer)):  # one seed per sample
        seed = [int(s) for s in seed]
        if len(seed) != num_samples:
            raise AOGPTError(f"seed lists {len(seed)} seeds for {num_samples} samples",
                             "give one seed per sample, or a single seed")
    device = next(model.parameters()).device
    check_fits(generation_bytes(model.config, batch_size, n, steps, num_samples, use_cache=settings.use_cache,
                                kv_cache=fam.kv_cache, record_logits=record_logits), device, "generation",
               "the batch size (--batch-size), the number of samples (-n) or the length (--length)")
    if teacher_tokens is not None:
        teacher_tokens = torch.as_tensor(teacher_tokens, dtype=torch.long).to(device)
        if teacher_tokens.shape != (num_samples, n):
            raise AOGPTError(f"teacher_tokens must have shape ({num_samples}, {n})", "fix its shape")
    known_mask = torch.zeros(n, dtype=torch.bool)
    known_mask[condition.positions] = True
    known_chain = condition.tokens[condition.positions.argsort()].to(device)
    return _Request(model, fam, settings, sampling, num_samples, batch_size, n,
                    known_mask, known_chain, steps, policy, order_arg, order, adaptive, speculative,
                    seed if isinstance(seed, list) else int(seed),
                    teacher_tokens, record_logits)


def _run(req: _Request, progress: Callable[[int], None] | None) -> tuple[list[_Batch], float]:
    """Decode every batch in inference mode (the model's training flag restored after); the batches
    and the seconds taken."""
    model = req.model
    runner = for_inference(model, path=decode_path(req.settings)) if req.settings.prepack else model
    device = next(model.parameters()).device
    batches = []
    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            for start in range(0, req.num_samples, req.batch_size):
                batches.append(_run_batch(req, runner, start, min(req.batch_size, req.num_samples - start),
                                          progress))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    finally:
        model.train(was_training)
    return batches, time.perf_counter() - t0


def decode_path(settings: GenerationSettings) -> str:
    """The decode path a generation runs on (`GenerationSettings.path`)."""
    return settings.path()


def _run_batch(req: _Request, runner: torch.nn.Module, start: int, B: int,
               progress: Callable[[int], None] | None) -> _Batch:
    """Plan batch [start, start + B) (chain orders and step counts, drawn from the plan stream) and
    run the family's sampler on it. An adaptive sampler chooses the chain while decoding and reports
    the orders and step counts it used; a fixed order's chain is the plan's; a speculative sampler
    reports how many positions each of its forwards committed."""
    fam, n = req.family, req.length
    streams = SequenceStreams(req.seed, start, B)
    chain = chain_orders(base_orders(req.order, start, B, n, streams), req.known_mask)
    if req.speculative is not None:
        chain_d = chain.to(req.known_chain.device)
        sampler = speculative_sampler(fam, runner, chain_d, req.known_chain, req.settings, req.speculative)
        y = sampler.run(req.sampling, streams, watch(sampler, start, req.on_step, progress))
        return _Batch(torch.empty_like(y).scatter_(1, chain_d, y).cpu(), chain,
                      torch.from_numpy(np.stack(sampler.revealed, axis=1)), None, sampler.forwards, sampler.slots,
                      sampler.padded, (list(sampler.proposed), list(sampler.accepted)))
    plan = step_counts(req.policy, req.settings.plan.schedule, req.steps, req.masked, B, streams)
    chain_d = chain.to(req.known_chain.device)
    teacher = None if req.teacher_tokens is None else req.teacher_tokens[start:start + B]
    if req.adaptive:  # teacher tokens by position
        sampler = adaptive_sampler(fam, runner, chain_d, req.known_chain, plan, req.settings,
                                   streams=streams, teacher=teacher, record=req.record_logits)
    else:  # teacher tokens in chain order
        sampler = fixed_order_sampler(fam, runner, chain_d, req.known_chain, plan, req.settings,
                              teacher=None if teacher is None else teacher.gather(1, chain_d),
                              record=req.record_logits)
    y = sampler.run(req.sampling, streams, watch(sampler, start, req.on_step, progress))
    if req.adaptive:
        chain_d, plan = sampler.chain, sampler.step_counts
    return _Batch(torch.empty_like(y).scatter_(1, chain_d, y).cpu(), chain_d.cpu(), torch.from_numpy(plan),
                  None if sampler.logits is None else sampler.logits.cpu(), sampler.forwards, sampler.slots,
                  sampler.padded)


def _assemble(req: _Request, batches: list[_Batch], seconds: float) -> GenerationResult:
    """The batches joined into one `GenerationResult`, with timing and the settings actually used."""
    stats = {"forwards": sum(b.forwards for b in batches), "slot_evaluations": sum(b.slots for b in batches),
             "padded_slots": sum(b.padded for b in batches)}
    timing = {"seconds": seconds, "tokens_per_second": req.num_samples * req.masked / max(seconds, 1e-9), **stats}
    if req.speculative is not None:
        timing.update(_speculation(req, batches))
    plan_cfg = req.settings.plan
    spec = req.speculative is not None
    report = {"num_samples": req.num_samples, "length": req.length, "known_tokens": int(req.known_mask.sum()),
              "steps": stats["forwards"] if spec else req.steps, "policy": "speculative" if spec else req.policy,
              "speculative": req.speculative, "schedule": plan_cfg.schedule, "order": _order_label(req.order_arg),
              **({"candidates": plan_cfg.candidates, "threshold": plan_cfg.threshold} if req.adaptive else {}),
              "seed": req.seed, "use_cache": req.settings.use_cache and req.family.kv_cache,
              "decode_path": decode_path(req.settings),
              "batch_size": req.batch_size, "variant": req.model.config.variant, **req.sampling.to_dict()}
    logits = [b.logits for b in batches if b.logits is not None]
    width = max(b.step_counts.shape[1] for b in batches)  # speculative batches may take different forwards
    counts = [torch.nn.functional.pad(b.step_counts, (0, width - b.step_counts.shape[1])) for b in batches]
    return GenerationResult(torch.cat([b.tokens for b in batches]), torch.cat([b.orders for b in batches]),
                            torch.cat(counts), req.known_mask, None, timing, report,
                            torch.cat(logits) if logits else None)


def _speculation(req: _Request, batches: list[_Batch]) -> dict[str, Any]:
    """Tokens per forward pass per sequence (a batch's forward serves all its sequences) and the
    acceptance rate of each draft position, over all batches."""
    verified: dict[str, int] = {}
    accepted: dict[str, int] = {}
    sequence_forwards = 0
    for b in batches:
        sequence_forwards += b.tokens.shape[0] * b.forwards
        proposed, took = b.drafts
        for j in range(1, len(proposed)):
            if proposed[j]:
                verified[str(j)] = verified.get(str(j), 0) + int(proposed[j])
                accepted[str(j)] = accepted.get(str(j), 0) + int(took[j])
    return {"tokens_per_forward": req.num_samples * req.masked / max(sequence_forwards, 1),
            "acceptance_by_position": {j: accepted[j] / verified[j] for j in sorted(verified, key=int)}}


def _order_label(order: Any) -> str:
    return "random" if order is None else order if isinstance(order, str) else "given"


def infill(model: torch.nn.Module, template: Any, *, tokenizer: Any = None, length: int | None = None,
           **kwargs: Any) -> GenerationResult:
    """Fill the blanks of `template`; known tokens are prefilled once and never changed.

    template: text with blanks ``[MASK]`` (one token) or ``[MASK:k]`` (k tokens), needs `tokenizer`;
    a {position: token} mapping (needs `length`); or a list of ids with None for blanks. `length`
    extends the output with blanks at the end. Other arguments as in `generate`.
    """
    core = _check_model(model)
    cond = parse_template(template, tokenizer=tokenizer, length=length, config=core.config)
    return generate(core, tokenizer=tokenizer, condition=cond, **kwargs)

