"""Infilling, measured exactly: the likelihood of a missing span given the text on both sides.

**The cuts** (`make_cuts`). Held-out text (one token stream) is cut into windows of
``context + length + context`` tokens: ``context`` tokens of prefix, the ``length``-token span,
``context`` tokens of suffix. For each span length, `num_cuts` window starts are drawn uniformly
without replacement, with a generator seeded by ``draw_seed(seed, "infill-cuts", length, context)``,
among the starts whose window holds no end-of-text token (a window never straddles two documents).
The cuts depend only on the tokens, the seed, the length, the context and the count, never on the
model, so every model (an AO-GPT, a GPT, two checkpoints of a run) is scored on the same spans.

**The numbers are exact.** A decoder reads a sequence in an order and one causal pass gives every
conditional of that order (`aogpt.model`). Reading the window in the order *prefix, suffix, span*
makes the span's steps the conditionals p(s_i | prefix, suffix, s_<i in the span order), so the sum
of their losses is exactly -log p(span | prefix, suffix) under that factorisation, which is a
normalised distribution over spans (an autoregressive chain). Nothing is a bound (an encoder-only
MDM would give an ELBO here). The span can be read

- ``l2r``: left to right;
- ``random``: K uniform orders of the span (one per cut and draw): each is exact; their mean
  estimates the any-order average with an error bar over the K draws;
- an adaptive order (``confidence``, ``margin``, ``entropy``: `aogpt.generation.adaptive`): at
  every step the model scores each still-missing span position given the context and the span
  tokens read so far and reads the best one next. The choice uses only what has been read, never
  the token about to be scored, so the chain is still a normalised distribution and its NLL is
  exact; one forward per span token (the whole window recomputed).
- ``best``, the model's own order: of left to right and the adaptive order, the one with the lower
  NLL on `CALIBRATION_CUTS` *other* spans (`choose_order`: cuts drawn with their own seed label),
  then scored on the evaluation spans. The choice never sees the evaluation spans, so the row is
  exact, not a minimum over orders picked per span (which would not be a distribution).

Beside it, the span *given the prefix only*: the window cut after the span, read left to right
(what a GPT sees), for the same model and, via `compare`, for a left-to-right model.

**A fill-in-the-middle GPT** (`aogpt.data.fim`) is given both sides the way it was trained: the row
``PREFIX prefix SUFFIX suffix MIDDLE span END`` (PSM), read left to right in one causal pass. Its
row ``fim/psm`` is the sum of the span tokens' losses *and of the END token's*, i.e. exactly
-log p(the gap holds the span and nothing more | prefix, suffix): the model's chain of conditionals
over every possible fill (any length, closed by END) is a normalised law, and this is the probability
it gives the fill that is there. Without the END term it would be the probability that the fill
*begins* with the span. The END term is kept beside it (`InfillScores.end_nll`): what telling where
the gap closes costs. (An any-order model is told the span's length by the positions it reads;
the FIM model is not, so its number also pays for the length: it is conservative by that much.)

**Bits per byte** per span: its NLL in bits over the UTF-8 bytes of its tokens. Results are mean
bits per byte over spans with a 95% Student-t interval over spans (`aogpt.stats`), and gaps between
rows are paired over the same spans.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from aogpt.data.fim import SENTINELS, arrange, sentinels_of
from aogpt.errors import AOGPTError
from aogpt.evaluation.evaluate import conditional_logprobs
from aogpt.families import family_of, unwrap
from aogpt.generation.adaptive import candidate_scores
from aogpt.orders import ADAPTIVE
from aogpt.seeds import draw_seed
from aogpt.stats import Estimate, Measurement, difference, mean_interval

SPAN_LENGTHS = (8, 32, 64)
CONTEXT = 32  # tokens of prefix and of suffix around every span
NUM_CUTS = 64
ROWS = ("both/l2r", "both/random", "both/adaptive", "both/best", "prefix/l2r")  # what is scored, see `score_cuts`
FIM_ROW = "fim/psm"  # a fill-in-the-middle GPT given both sides (module docstring)
BOTH_SIDES = ("both/best", FIM_ROW)  # the rows given both sides that the gaps are measured against
CALIBRATION_CUTS = 16  # spans per length on which the model's own order is chosen (`choose_order`)


# ------------------------------------------------------------------------------------------- the cuts
@dataclass(frozen=True)
class Cuts:
    """`windows` (N, 2 * context + length): prefix | span | suffix, cut at `starts` of the text."""

    length: int
    context: int
    starts: np.ndarray
    windows: torch.Tensor

    @property
    def span(self) -> slice:
        return slice(self.context, self.context + self.length)

    @property
    def spans(self) -> torch.Tensor:
        return self.windows[:, self.span]


def make_cuts(tokens: np.ndarray | torch.Tensor, length: int, *, num_cuts: int = NUM_CUTS, context: int = CONTEXT,
              seed: int = 0, eot_id: int | None = None) -> Cuts:
    """The cuts of one span length (module docstring): a function of the tokens, the seed, `length`,
    `context` and `num_cuts` only. Fewer eligible windows than `num_cuts` is refused."""
    if length < 1 or context < 0 or num_cuts < 1:
        raise AOGPTError(f"infill cuts need length >= 1, context >= 0 and at least one cut, got length {length}, "
                         f"context {context}, {num_cuts} cuts", "pass positive span lengths and cut counts")
    ids = np.asarray(tokens).astype(np.int64).reshape(-1)
    width = 2 * context + length
    if len(ids) < width:
        raise AOGPTError(f"the held-out text has {len(ids)} tokens, fewer than one window of {width}",
                         "use shorter spans or less context")
    if eot_id is None:
        eligible = np.arange(len(ids) - width + 1)
    else:  # windows without an end-of-text token: a prefix count of EOTs over each window
        eot = np.concatenate([[0], np.cumsum(ids == eot_id)])
        eligible = np.flatnonzero(eot[width:] - eot[:-width] == 0)
    if len(eligible) < num_cuts:
        raise AOGPTError(f"only {len(eligible)} windows of {width} tokens lie inside one document, {num_cuts} asked",
                         "ask for fewer cuts or shorter spans")
    rng = np.random.Generator(np.random.PCG64(draw_seed(seed, "infill-cuts", length, context)))
    starts = np.sort(rng.choice(eligible, size=num_cuts, replace=False))
    windows = torch.from_numpy(np.stack([ids[s:s + width] for s in starts]))
    return Cuts(length, context, starts, windows)


# --------------------------------------------------------------------------------------- exact scores
def _context_order(B: int, context: int, length: int, device: torch.device) -> torch.Tensor:
    """Prefix then suffix positions, left to right (B, 2 * context)."""
    ctx = torch.cat([torch.arange(context), torch.arange(context + length, 2 * context + length)])
    return ctx.to(device).expand(B, -1)


@torch.inference_mode()
def span_nll(model: nn.Module, windows: torch.Tensor, context: int, length: int, span_order: torch.Tensor | None = None,
             sides: str = "both") -> torch.Tensor:
    """Exact -log p(span | context) per window (B,), float64, from one causal pass.

    sides ``both``: the window read as prefix, suffix, then the span in `span_order` ((B, length) or
    (length,) positions *within the span*; None: left to right). ``prefix``: the window cut after the
    span and read left to right (the suffix unseen; `span_order` must be None)."""
    model = unwrap(model)
    fam = family_of(model)
    idx = windows.to(next(model.parameters()).device, torch.long)
    B = idx.shape[0]
    if sides == "prefix":
        if span_order is not None:
            raise AOGPTError("the prefix-only score reads the span left to right", "drop span_order")
        losses = fam.order_nll(model, idx[:, :context + length], None)
        return losses[:, context:].double().sum(1)
    if sides != "both":
        raise AOGPTError(f"unknown sides {sides!r}", "use both or prefix")
    if not fam.any_order:
        raise AOGPTError(f"variant {fam.name} reads left to right only, so it cannot condition on a suffix",
                         "score it with the prefix only")
    inner = torch.arange(length) if span_order is None else torch.as_tensor(span_order, dtype=torch.long)
    inner = inner.to(idx.device).expand(B, length)
    order = torch.cat([_context_order(B, context, length, idx.device), context + inner], dim=1)
    return fam.order_nll(model, idx, order)[:, 2 * context:].double().sum(1)


@torch.inference_mode()
def fim_span_nll(model: nn.Module, windows: torch.Tensor, context: int, length: int,
                 mode: str = "psm") -> tuple[torch.Tensor, torch.Tensor]:
    """A fill-in-the-middle model given both sides (module docstring): (-log p(span tokens | prefix,
    suffix), -log p(END | prefix, suffix, span)) per window, (B,) each, float64, from one causal pass
    over ``PREFIX prefix SUFFIX suffix MIDDLE span END`` (`mode` spm: ``PREFIX SUFFIX suffix MIDDLE
    prefix span END``). Their sum is -log p(the gap holds exactly the span | prefix, suffix)."""
    model = unwrap(model)
    sentinels = sentinels_of(model)
    if sentinels is None:
        raise AOGPTError(f"{model.config.variant} model was not trained to fill in the middle",
                         "score it with the prefix only, or train it with --fim-rate")
    if mode not in ("psm", "spm"):
        raise AOGPTError(f"unknown fill-in-the-middle mode {mode!r}", "use psm or spm")
    idx = windows.to(next(model.parameters()).device, torch.long)
    B = idx.shape[0]
    lo = torch.full((B,), context, dtype=torch.long)
    rows = arrange(idx, lo, lo + length, torch.full((B,), mode == "spm"), sentinels)
    losses = family_of(model).order_nll(model, rows, None).double()
    first = 2 * context + SENTINELS - 1  # both layouts put the span right after MIDDLE (index 2C + 2)
    return losses[:, first:first + length].sum(1), losses[:, first + length]


@torch.inference_mode()
def adaptive_span_nll(model: nn.Module, windows: torch.Tensor, context: int, length: int,
                      policy: str = "confidence") -> tuple[torch.Tensor, torch.Tensor]:
    """Exact -log p(span | prefix, suffix) with the span read in the model's adaptive order (B,), and
    that order (B, length) (positions within the span). Step j: one forward of the context plus the
    j span tokens read so far, with one query per missing span position; the best-scoring position
    (`aogpt.generation.adaptive.candidate_scores`, ties to the lowest) is read next and its true
    token scored."""
    if policy not in ADAPTIVE:
        raise AOGPTError(f"unknown adaptive order {policy!r}", f"use one of: {', '.join(ADAPTIVE)}")
    model = unwrap(model)
    if not family_of(model).adaptive_order:
        raise AOGPTError(f"variant {model.config.variant} cannot choose its own order", "use an any-order model")
    device = next(model.parameters()).device
    idx = windows.to(device, torch.long)
    B = idx.shape[0]
    read = _context_order(B, context, length, device)
    missing = (context + torch.arange(length, device=device)).expand(B, length)
    nll = torch.zeros(B, dtype=torch.float64, device=device)
    chosen = []
    rows = torch.arange(B, device=device)
    for _ in range(length):
        logp = conditional_logprobs(model, idx, read, missing)  # (B, R, V)
        score, _conf = candidate_scores(logp, policy)
        best = score.argmax(dim=1)  # the first maximum: the lowest position
        pos = missing[rows, best]
        nll -= logp[rows, best].gather(1, idx[rows, pos][:, None])[:, 0].double()
        chosen.append(pos - context)
        read = torch.cat([read, pos[:, None]], dim=1)
        keep = torch.ones_like(missing, dtype=torch.bool)
        keep[rows, best] = False
        missing = missing[keep].view(B, -1)
    return nll, torch.stack(chosen, dim=1)


# ------------------------------------------------------------------------------------------ results
@dataclass
class InfillScores:
    """Per-span NLLs (nats) of one model on one `Cuts`, by row (`ROWS`; ``both/random``: K lists)."""

    length: int
    nll: dict[str, list[float]] = field(default_factory=dict)
    random_draws: list[list[float]] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    best_order: str | None = None  # the order of ``both/best``
    end_nll: list[float] = field(default_factory=list)  # ``fim/psm``: the END token's share of each span's NLL
    adaptive_order: str | None = None  # the adaptive order of ``both/adaptive``
    seconds: float = 0.0

    def bpb(self, row: str) -> Measurement:
        """Bits per byte per span of `row`, as a measurement over the spans (paired across rows and
        models: the same cut ids)."""
        values = [n / b / math.log(2) for n, b in zip(self.nll[row], self.bytes, strict=True)]
        return Measurement.of(values, "spans", ids=list(range(len(values))))


def calibration_cuts(tokens: np.ndarray | torch.Tensor, cuts: Cuts, seed: int = 0, eot_id: int | None = None,
                     num_cuts: int = CALIBRATION_CUTS) -> Cuts:
    """The spans on which the model's own order is chosen: like `cuts`, drawn with another seed label."""
    return make_cuts(tokens, cuts.length, num_cuts=num_cuts, context=cuts.context,
                     seed=draw_seed(seed, "infill-calibration"), eot_id=eot_id)


@torch.inference_mode()
def choose_order(model: nn.Module, calibration: Cuts, adaptive: str = "confidence", batch_size: int = 16) -> str:
    """``l2r`` or `adaptive`: the one with the lower total NLL of the calibration spans given both sides."""
    model = unwrap(model)
    C, L = calibration.context, calibration.length
    l2r = sum(float(span_nll(model, w, C, L).sum()) for w in calibration.windows.split(batch_size))
    chunks = calibration.windows.split(batch_size)
    ada = sum(float(adaptive_span_nll(model, w, C, L, adaptive)[0].sum()) for w in chunks)
    return "l2r" if l2r <= ada else adaptive


@torch.inference_mode()
def score_cuts(model: nn.Module, cuts: Cuts, *, num_orders: int = 4, best: str = "confidence", seed: int = 0,
               batch_size: int = 16, byte_lengths: torch.Tensor | np.ndarray | None = None,
               progress: Any = None, calibration: Cuts | None = None) -> InfillScores:
    """Every row a model can give on `cuts`: an any-order model all of `ROWS`, a left-to-right one
    ``prefix/l2r`` only. ``both/random`` is the mean over K drawn span orders (per span); the draws'
    own per-span NLLs are kept in `random_draws`. ``both/adaptive`` reads the span in the adaptive
    order `best`; ``both/best`` is ``both/l2r`` or ``both/adaptive``, whichever `choose_order` picks
    on `calibration` (without calibration spans: the adaptive order). progress: ``update(n)`` per batch."""
    model = unwrap(model)
    fam = family_of(model)
    fim = sentinels_of(model) is not None
    width = cuts.windows.shape[1] + (SENTINELS if fim else 0)
    if width > model.config.block_size:
        held = f" (the window and {SENTINELS} fill-in-the-middle sentinels)" if fim else ""
        raise AOGPTError(f"infill windows of {width} tokens{held} exceed the model's context of "
                         f"{model.config.block_size}", "use shorter spans or less context (--infill-context)")
    if int(cuts.windows.max()) >= model.config.vocab_size:
        raise AOGPTError("the held-out text holds ids outside the model's vocabulary",
                         "evaluate on data prepared with the model's tokenizer")
    if num_orders < 1:
        raise AOGPTError(f"the number of orders must be at least 1, got {num_orders}", "pass --num-orders K >= 1")
    t0 = time.perf_counter()
    was_training = model.training
    model.eval()
    rows = ROWS if fam.any_order else (ROWS[-1], FIM_ROW) if fim else ROWS[-1:]
    out = InfillScores(cuts.length, {r: [] for r in rows}, adaptive_order=best if fam.any_order else None)
    L, C = cuts.length, cuts.context
    gens = [torch.Generator().manual_seed(draw_seed(seed, "infill-orders", L, k)) for k in range(num_orders)]
    draws: list[list[torch.Tensor]] = [[] for _ in range(num_orders)]
    try:
        for chunk in cuts.windows.split(batch_size):
            out.nll["prefix/l2r"] += span_nll(model, chunk, C, L, sides="prefix").tolist()
            if fim:
                span, end = fim_span_nll(model, chunk, C, L)
                out.nll[FIM_ROW] += (span + end).tolist()
                out.end_nll += end.tolist()
            if fam.any_order:
                out.nll["both/l2r"] += span_nll(model, chunk, C, L).tolist()
                for k, g in enumerate(gens):
                    orders = torch.rand(chunk.shape[0], L, generator=g).argsort(dim=1)
                    draws[k].append(span_nll(model, chunk, C, L, orders).cpu())
                out.nll["both/adaptive"] += adaptive_span_nll(model, chunk, C, L, best)[0].tolist()
            if progress is not None:
                progress.update(1)
    finally:
        model.train(was_training)
    if fam.any_order:
        out.best_order = best if calibration is None else choose_order(model, calibration, best, batch_size)
        out.nll["both/best"] = list(out.nll["both/l2r" if out.best_order == "l2r" else "both/adaptive"])
        per_draw = torch.stack([torch.cat(d) for d in draws])  # (K, N)
        out.random_draws = per_draw.tolist()
        out.nll["both/random"] = per_draw.mean(0).tolist()
    if byte_lengths is not None:
        lengths = (byte_lengths.long() if isinstance(byte_lengths, torch.Tensor)
                   else torch.from_numpy(np.array(byte_lengths, dtype=np.int64)))
        out.bytes = lengths[cuts.spans.long()].sum(1).tolist()
    out.seconds = time.perf_counter() - t0
    return out


ROW_NAMES = {"both/l2r": "both sides, span left to right", "both/random": "both sides, span in K random orders",
             "both/adaptive": "both sides, span in an adaptive order", "both/best": "both sides, the model's own order",
             "prefix/l2r": "prefix only, left to right", FIM_ROW: "both sides, fill in the middle + end"}


def summarize(scores: dict[str, InfillScores]) -> list[dict[str, Any]]:
    """Rows of bits per byte over spans with 95% intervals, per model label and row; plus, for a
    span length, the paired gaps that the claims read (each model's prefix-only row, and another
    fill-in-the-middle model's row, minus the anchor: the first any-order model's best both-sides row,
    or without one the first fill-in-the-middle row). `scores`: label -> scores on the same cuts."""
    out: list[dict[str, Any]] = []
    anchor = next(((lab, s, r) for r in BOTH_SIDES for lab, s in scores.items() if r in s.nll), None)
    for label, s in scores.items():
        for row in (r for r in (*ROWS, FIM_ROW) if r in s.nll):
            est = mean_interval(s.bpb(row))
            entry: dict[str, Any] = {"model": label, "length": s.length, "row": row, "what": ROW_NAMES[row],
                                     "bpb": est.value, "bpb_ci95": [est.low, est.high], "spans": est.n,
                                     "nll_per_token": float(np.mean(s.nll[row])) / s.length}
            if row == "both/best":
                entry["order"] = s.best_order
            if row == "both/adaptive":
                entry["order"] = s.adaptive_order
            if row == "both/random" and len(s.random_draws) > 1:  # Monte-Carlo error over the K draws
                per = [float(np.sum(d)) / sum(s.bytes) / math.log(2) for d in s.random_draws]
                entry["draws_se"] = float(np.std(per, ddof=1) / math.sqrt(len(per)))
            if row == FIM_ROW:
                entry["end_bpb"] = float(np.mean([n / b / math.log(2) for n, b in zip(s.end_nll, s.bytes,
                                                                                         strict=True)]))
            if anchor is not None and row in ("prefix/l2r", FIM_ROW) and (label, row) != (anchor[0], anchor[2]):
                gap = difference(s.bpb(row), anchor[1].bpb(anchor[2]))
                how = "prefix only" if row == "prefix/l2r" else "both sides (fill in the middle)"
                ref = "own order" if anchor[2] == "both/best" else "fill in the middle"
                entry["gap_vs_both"] = _gap(gap, f"{label} {how} - {anchor[0]} both sides ({ref})")
            out.append(entry)
    return out


def _gap(e: Estimate, what: str) -> dict[str, Any]:
    return {"what": what, "bpb": e.value, "ci95": [e.low, e.high], "spans": e.n}


def evaluate_infill(model: nn.Module, tokens: np.ndarray | torch.Tensor, *, lengths: Sequence[int] = SPAN_LENGTHS,
                    num_cuts: int = NUM_CUTS, context: int = CONTEXT, num_orders: int = 4, best: str = "confidence",
                    seed: int = 0, eot_id: int | None = None, byte_lengths: Any = None,
                    compare: dict[str, nn.Module] | None = None, batch_size: int = 16) -> list[dict[str, Any]]:
    """`aogpt eval --infill` in Python: cut `tokens` (`make_cuts`), score `model` (label ``model``)
    and every model of `compare` on the same cuts (`score_cuts`) and return `summarize`'s rows for
    every span length. byte_lengths: bytes per token id (needed for bits per byte)."""
    if byte_lengths is None:
        raise AOGPTError("infill results are in bits per byte, which needs the bytes behind each token id",
                         "pass byte_lengths=tokenizer.byte_lengths()")
    rows = []
    for length in lengths:
        cuts = make_cuts(tokens, length, num_cuts=num_cuts, context=context, seed=seed, eot_id=eot_id)
        calib = calibration_cuts(tokens, cuts, seed, eot_id, min(CALIBRATION_CUTS, num_cuts))
        models = {"model": model, **(compare or {})}
        scores = {lab: score_cuts(m, cuts, num_orders=num_orders, best=best, seed=seed, batch_size=batch_size,
                                  byte_lengths=byte_lengths, calibration=calib) for lab, m in models.items()}
        rows += summarize(scores)
    return rows
