"""Infilling with a fill-in-the-middle GPT (`aogpt.data.fim`): each gap generated after its two sides.

A FIM model reads ``PREFIX prefix SUFFIX suffix MIDDLE`` and continues with the middle, left to right,
with the decoder's KV-cache sampler (`aogpt.generation.decoder`). `fim_fill` fills the blanks of a
template (as `aogpt.infill` takes it) gap by gap in text order:

- the prefix is everything before the gap (earlier gaps already filled), the suffix the known text
  after it up to the next gap (a FIM model is trained on one middle; later gaps are not known yet);
- a ``[MASK:k]`` gap holds exactly k tokens, as for an any-order model: the sentinels (END among them)
  are never drawn inside a gap, only the tokenizer's own ids (`Sentinels.text_limit`);
- a row longer than the context keeps the suffix's first tokens (at least half the room, all of it if
  the prefix is shorter) and the prefix's last ones.

`fim_middles` draws free-length middles instead: up to `max_tokens`, each ended where the model writes
END (text or END may be drawn, never the other sentinels): the model's own law of the fill.

`fim_fill_nll` scores the fills of a sequence exactly, gap by gap with the same sides: for each gap
-log p(the gap holds exactly these tokens | its prefix, its suffix), the span's and the END token's
losses in one causal pass (`aogpt.evaluation.infill.fim_span_nll` on one window).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from aogpt.data.fim import SENTINELS, Sentinels, psm_row, sentinels_of
from aogpt.errors import AOGPTError
from aogpt.families import unwrap
from aogpt.generation.conditioning import parse_template
from aogpt.generation.decoder import DecoderSampler
from aogpt.generation.generate import GenerationResult
from aogpt.generation.reveal import Revealed
from aogpt.generation.settings import GenerationSettings, settings_from
from aogpt.generation.streams import SequenceStreams

METHOD = "fim"
LABEL = "fill in the middle: each gap left to right after its prefix and the text after it"


def _model(model: Any) -> tuple[torch.nn.Module, Sentinels]:
    core = unwrap(model)
    sentinels = sentinels_of(core)
    if sentinels is None:
        raise AOGPTError(f"this {core.config.variant} model was not trained to fill in the middle",
                         "train it with aogpt train --fim-rate, or fill blanks with an any-order model")
    return core, sentinels


def gaps(known: torch.Tensor) -> list[tuple[int, int]]:
    """Maximal runs [start, end) of unknown positions of a (n,) bool mask, in text order."""
    out, start = [], None
    for p, k in enumerate([*known.tolist(), True]):
        if not k and start is None:
            start = p
        elif k and start is not None:
            out.append((start, p))
            start = None
    return out


def sides(tokens: torch.Tensor, known: torch.Tensor, gap: tuple[int, int], space: int
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefix (B, p) and suffix (B, s) of `gap` in `tokens` (B, n) (module docstring), cut so that
    p + s <= space."""
    a, b = gap
    nxt = next((q for q in range(b, len(known)) if not known[q]), len(known))
    prefix, suffix = tokens[:, :a], tokens[:, b:nxt]
    if space < 0:
        raise AOGPTError(f"a gap of {b - a} tokens leaves no room for its sides in a fill-in-the-middle row",
                         "use shorter gaps")
    keep_s = min(suffix.shape[1], max(space - prefix.shape[1], space // 2))
    keep_p = min(prefix.shape[1], space - keep_s)
    return prefix[:, prefix.shape[1] - keep_p:], suffix[:, :keep_s]


def room(model: torch.nn.Module, k: int) -> int:
    """Tokens of prefix and suffix a gap of k tokens leaves in the context: its scored row holds the
    four sentinels too (the same sides whether the gap is drawn or scored)."""
    return model.config.block_size - SENTINELS - k


def _rows(prefix: torch.Tensor, suffix: torch.Tensor, sentinels: Sentinels) -> torch.Tensor:
    return torch.tensor([psm_row(p, s, sentinels) for p, s in zip(prefix, suffix, strict=True)], dtype=torch.long)


def _draw(model: torch.nn.Module, rows: torch.Tensor, k: int, settings: GenerationSettings, sampling: Any,
          streams: SequenceStreams, progress: Callable[[int], None] | None,
          on_token: Callable[[int, torch.Tensor], None] | None = None) -> torch.Tensor:
    """k tokens after each row (B, m), left to right with the KV cache: (B, k); each sequence's draws
    from its own stream (`streams`), so a seed decides a sample whatever the batch size. `on_token`:
    called after each step with the index j of the token drawn and the B tokens."""
    B, m = rows.shape
    device = next(model.parameters()).device
    chain = torch.arange(m + k, device=device).expand(B, m + k)
    sampler = DecoderSampler(model, chain, rows.to(device), np.ones((B, k), dtype=np.int64), settings)
    report = progress
    if on_token is not None:
        drawn = 0

        def report(count: int) -> None:
            nonlocal drawn
            on_token(drawn, sampler.decided()[:, m + drawn].cpu())
            drawn += 1
            if progress is not None:
                progress(count)

    return sampler.run(sampling, streams, report)[:, m:].cpu()


@torch.inference_mode()
def fim_fill(model: Any, template: Any, *, tokenizer: Any = None, length: int | None = None, num_samples: int = 1,
             seed: int | None = None, settings: GenerationSettings | None = None,
             progress: Callable[[int], None] | None = None, on_step: Callable[[Revealed], None] | None = None,
             condition: Any = None, return_text: bool | None = None, **overrides: Any) -> GenerationResult:
    """Fill the blanks of `template` (text with ``[MASK:k]``, a {position: token} mapping with `length`,
    or ids with None; or a ready `condition`) with a fill-in-the-middle model (module docstring).
    Sampling settings (temperature, top_p, top_k, greedy, dtype, batch_size) as for `aogpt.generate`;
    the order is the method's. `on_step`: each drawn token as a `Revealed` step (one token of every
    sequence of the batch per step), as `aogpt.generate` reports them. Returns a `GenerationResult`
    like `aogpt.infill`'s."""
    core, sentinels = _model(model)
    settings = settings_from(settings, **{k: v for k, v in overrides.items() if v is not None}).validate()
    if settings.plan.order is not None or settings.plan.speculative is not None or settings.plan.steps is not None:
        raise AOGPTError("a fill-in-the-middle model fills each gap left to right after its sides",
                         "drop the order, steps and speculative settings")
    if num_samples < 1:
        raise AOGPTError(f"num_samples must be >= 1, got {num_samples}", "ask for at least one sample")
    cond = condition if condition is not None else parse_template(template, tokenizer=tokenizer, length=length,
                                                                  config=core.config)
    n = cond.length
    known = torch.zeros(n, dtype=torch.bool)
    known[cond.positions] = True
    base = torch.zeros(n, dtype=torch.long)
    base[cond.positions] = cond.tokens
    sampling = dataclasses.replace(settings.sampling, vocab_limit=sentinels.text_limit).validate()
    if seed is None:
        seed = int.from_bytes(np.random.default_rng().bytes(8), "little") >> 2
    was_training = core.training
    core.eval()
    t0 = time.perf_counter()
    out = []
    try:
        for start in range(0, num_samples, settings.batch_size):
            tokens = base.expand(min(settings.batch_size, num_samples - start), n).clone()
            streams = SequenceStreams(int(seed), start, tokens.shape[0])
            rows = np.arange(start, start + tokens.shape[0])
            step = 0
            for a, b in gaps(known):
                prefix, suffix = sides(tokens, known, (a, b), room(core, b - a))

                def on_token(j: int, drawn: torch.Tensor, a: int = a, rows: np.ndarray = rows) -> None:
                    nonlocal step
                    step += 1
                    on_step(Revealed(step, rows, np.full(len(rows), a + j), drawn.numpy()))

                tokens[:, a:b] = _draw(core, _rows(prefix, suffix, sentinels), b - a, settings, sampling, streams,
                                       progress, on_token if on_step is not None else None)
            out.append(tokens)
    finally:
        core.train(was_training)
    seconds = time.perf_counter() - t0
    tokens = torch.cat(out)
    masked = int((~known).sum())
    chain = torch.cat([known.nonzero()[:, 0], (~known).nonzero()[:, 0]]).expand(num_samples, n)
    report = {"num_samples": num_samples, "length": n, "known_tokens": int(known.sum()), "steps": masked,
              "policy": "count", "speculative": None, "schedule": "linear", "order": LABEL, "seed": int(seed),
              "use_cache": True, "batch_size": settings.batch_size, "variant": core.config.variant,
              "infill_method": METHOD, **sampling.to_dict()}
    batches = -(-num_samples // settings.batch_size)
    timing = {"seconds": seconds, "tokens_per_second": num_samples * masked / max(seconds, 1e-9),
              "forwards": batches * masked}  # one forward per token of a batch (the first of a gap reads its row)
    want_text = tokenizer is not None if return_text is None else return_text
    texts = [tokenizer.decode(row) for row in tokens] if want_text and tokenizer is not None else None
    return GenerationResult(tokens, chain.clone(), torch.ones(num_samples, masked, dtype=torch.long), known, texts,
                            timing, report)


@torch.inference_mode()
def fim_middles(model: Any, prefix: Any, suffix: Any, *, max_tokens: int, num_samples: int = 1,
                seed: int | None = None, settings: GenerationSettings | None = None, **overrides: Any
                ) -> list[list[int]]:
    """Free-length middles between `prefix` and `suffix` (ids): up to `max_tokens` each, cut at the
    first END the model writes (END not included); text ids or END are drawn, never another sentinel."""
    core, sentinels = _model(model)
    settings = settings_from(settings, **{k: v for k, v in overrides.items() if v is not None}).validate()
    sampling = dataclasses.replace(settings.sampling, vocab_limit=sentinels.text_limit + 1).validate()
    row = torch.tensor(psm_row(prefix, suffix, sentinels), dtype=torch.long)
    if max_tokens < 1 or len(row) + max_tokens > core.config.block_size:
        raise AOGPTError(f"the sides ({len(row)} tokens with the sentinels) and up to {max_tokens} middle tokens do "
                         f"not fit the context of {core.config.block_size}", "use shorter sides or fewer tokens")
    seed = int.from_bytes(np.random.default_rng().bytes(8), "little") >> 2 if seed is None else int(seed)
    was_training = core.training
    core.eval()
    out: list[list[int]] = []
    try:
        for start in range(0, num_samples, settings.batch_size):
            rows = row.expand(min(settings.batch_size, num_samples - start), -1)
            streams = SequenceStreams(seed, start, rows.shape[0])
            for drawn in _draw(core, rows, max_tokens, settings, sampling, streams, None).tolist():
                out.append(drawn[:drawn.index(sentinels.end)] if sentinels.end in drawn else drawn)
    finally:
        core.train(was_training)
    return out


@torch.inference_mode()
def fim_fill_nll(model: Any, tokens: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """Exact -log p(each gap holds exactly its tokens | its sides), summed over the gaps (B,) float64:
    per gap one causal pass over ``PREFIX prefix SUFFIX suffix MIDDLE gap END`` with the sides of
    `fim_fill`."""
    core, sentinels = _model(model)
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    known = torch.as_tensor(known, dtype=torch.bool)
    device = next(core.parameters()).device
    total = torch.zeros(tokens.shape[0], dtype=torch.float64)
    for a, b in gaps(known):
        prefix, suffix = sides(tokens, known, (a, b), room(core, b - a))
        rows = torch.tensor([psm_row(p, s, sentinels, middle, end=True)
                             for p, s, middle in zip(prefix, suffix, tokens[:, a:b], strict=True)], dtype=torch.long)
        losses = core(rows.to(device))[1].double().cpu()  # one causal pass, left to right
        total += losses[:, rows.shape[1] - 1 - (b - a):].sum(1)
    return total
