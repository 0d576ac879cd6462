"""Infilling that reads well: how the blanks of a template are filled, chosen by measurement.

`fill(model, template, method=...)` fills blanks with one of

- an order of `generate` (``random``, ``l2r``: left to right inside each gap, gaps in text order;
  ``confidence`` / ``margin`` / ``entropy``: the model reveals its surest position first,
  `aogpt.generation.adaptive`), one token per step;
- ``best-of:D[:ORDER]``: D drafts per sample, each drawn one token per step in ORDER (default
  ``l2r``), each scored exactly by the model (`fill_nll`: -log p(fill | the known tokens), the
  blanks read left to right after the known tokens, one causal pass), and the most likely kept.
  Its law is that of the best of D independent draws (tested against enumeration).

`DEFAULT_METHOD` is what `aogpt sample --infill` uses when no order is given; docs/generation.md
("Infilling: which method") gives the measurements that chose it: the share of the filled words
that are words of the plays, on held-out spans and on the quickstart's passage.

`parse_passage` reads a passage whose hidden words are marked ``[[like this]]``: the original text
is known, so a fill can be printed beside it and the hidden span's exact bits per byte reported.
`filled_words` picks the words of a filled sample that touch a filled token (what ``--word-check``
counts for an infill: the template's own words prove nothing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from aogpt.errors import AOGPTError
from aogpt.families import family_of, unwrap
from aogpt.generation.conditioning import parse_template
from aogpt.generation.generate import GenerationResult, generate
from aogpt.measures import WORD, words
from aogpt.orders import ADAPTIVE

ORDERS = ("random", "l2r", *ADAPTIVE)
# Chosen by measurement (docs/generation.md, "Infilling: which method"): left to right inside each gap gave
# the most real words per filled word, tied with best-of:8 at an eighth of its cost; random and
# confidence orders far fewer.
DEFAULT_METHOD = "l2r"
LABELS = {"random": "a random order", "l2r": "left to right inside each gap",
          **{p: f"the model's surest position first ({p})" for p in ADAPTIVE}}
HIDDEN = re.compile(r"\[\[(.+?)\]\]", re.S)


@dataclass(frozen=True)
class Method:
    """A parsed infilling method: the order each draft is drawn in and how many drafts (1: plain)."""

    order: str
    drafts: int = 1

    @property
    def label(self) -> str:
        if self.drafts == 1:
            return LABELS[self.order]
        return f"best of {self.drafts} drafts ({LABELS[self.order]}), scored exactly by the model"


def parse_method(spec: str) -> Method:
    """``random``, ``l2r``, ``confidence``, ``margin``, ``entropy`` or ``best-of:D[:ORDER]``."""
    if spec in ORDERS:
        return Method(spec)
    head, _, rest = spec.partition(":")
    count, _, order = rest.partition(":")
    order = order or "l2r"
    if head != "best-of" or not count.isdigit() or not 1 <= int(count) <= 256 or order not in ORDERS:
        raise AOGPTError(f"unknown infilling method {spec!r}",
                         f"use one of {', '.join(ORDERS)} or best-of:D[:ORDER] with D in 1..256")
    return Method(order, int(count))


@torch.inference_mode()
def fill_nll(model: torch.nn.Module, tokens: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """Exact -log p(the blanks | the known tokens) per sequence (B,), float64: one causal pass reading
    the known positions, then the blanks left to right (the sum of the blanks' conditionals). Decoders
    only (an encoder-only MDM has no one-pass likelihood)."""
    core = unwrap(model)
    fam = family_of(core)
    if not (fam.causal and fam.one_pass_nll):
        raise AOGPTError(f"variant {fam.name} has no one-pass likelihood to score fills with",
                         "use an order as the infilling method (e.g. l2r), or a decoder")
    idx = tokens.to(next(core.parameters()).device, torch.long)
    known = known.to(idx.device, torch.bool)
    positions = torch.arange(idx.shape[1], device=idx.device)
    order = torch.cat([positions[known], positions[~known]]).expand(idx.shape[0], -1)
    losses = core(idx, order)[1]  # the decoder's per-step losses in this order
    return losses[:, int(known.sum()):].double().sum(1)


def fill(model: torch.nn.Module, template: Any, *, method: str | Method = DEFAULT_METHOD, num_samples: int = 1,
         tokenizer: Any = None, length: int | None = None, seed: int | None = None, **kwargs: Any
         ) -> GenerationResult:
    """Fill the blanks of `template` (as `aogpt.infill`) with `method` (module docstring). Other
    arguments go to `generate`; the order and the policy are the method's (one token per step). The
    result's settings name the method; for best-of, ``settings["draft_nll"]`` holds every draft's
    exact NLL (num_samples, D) and ``settings["fill_nll"]`` the kept one's."""
    m = parse_method(method) if isinstance(method, str) else method
    core = unwrap(model)
    cond = parse_template(template, tokenizer=tokenizer, length=length, config=core.config)
    if kwargs.get("order") is not None:
        raise AOGPTError("the infilling method sets the order", "pass method=ORDER instead of order=")
    kwargs = {**kwargs, "order": m.order, "policy": "count", "steps": None}
    res = generate(core, condition=cond, num_samples=num_samples * m.drafts, seed=seed, tokenizer=tokenizer,
                   **kwargs)
    if m.drafts > 1:
        res = _keep_best(core, res, num_samples, m.drafts, tokenizer)
    res.settings["order"] = m.label
    res.settings["infill_method"] = f"best-of:{m.drafts}:{m.order}" if m.drafts > 1 else m.order
    return res


def _keep_best(model: torch.nn.Module, res: GenerationResult, N: int, D: int, tokenizer: Any) -> GenerationResult:
    """Drafts (N * D rows, sample i's drafts in rows i*D .. i*D + D - 1) -> the most likely per sample
    (ties: the first draft)."""
    nll = fill_nll(model, res.tokens, res.known).cpu().view(N, D)
    best = nll.argmin(dim=1)
    rows = torch.arange(N) * D + best
    texts = None if res.texts is None else [res.texts[int(r)] for r in rows]
    settings = {**res.settings, "num_samples": N, "drafts": D, "draft_nll": nll.tolist(),
                "fill_nll": nll.gather(1, best[:, None])[:, 0].tolist()}
    return GenerationResult(res.tokens[rows], res.orders[rows], res.step_counts[rows], res.known, texts,
                            dict(res.timing), settings, None if res.logits is None else res.logits[rows])


# ------------------------------------------------------------------------------------------- passages
@dataclass(frozen=True)
class Passage:
    """A passage with hidden words: `tokens` (n,) the original ids, `hidden` (n,) bool, `template`
    the same text with each hidden run as ``[MASK:k]`` (k its tokens)."""

    text: str
    template: str
    tokens: torch.Tensor
    hidden: torch.Tensor

    @property
    def slots(self) -> list[int | None]:
        """The template as ids with None for blanks (what `fill` takes)."""
        return [None if h else int(t) for t, h in zip(self.tokens, self.hidden, strict=True)]


def parse_passage(marked: str, tokenizer: Any) -> Passage:
    """Read ``text [[hidden words]] text``: each piece is encoded on its own, so a hidden run is whole
    tokens whatever the tokenizer merges across it."""
    if tokenizer is None:
        raise AOGPTError("a passage needs a tokenizer", "load the model with its tokenizer")
    ids: list[int] = []
    hidden: list[bool] = []
    template, text, at = "", "", 0
    for mt in HIDDEN.finditer(marked):
        before = marked[at:mt.start()]
        piece = list(tokenizer.encode(before)) if before else []
        inner = list(tokenizer.encode(mt.group(1)))
        ids += piece + inner
        hidden += [False] * len(piece) + [True] * len(inner)
        template += before + f"[MASK:{len(inner)}]"
        text += before + mt.group(1)
        at = mt.end()
    if at == 0:
        raise AOGPTError("the passage hides nothing", "mark the words to hide as [[words]]")
    tail = marked[at:]
    piece = list(tokenizer.encode(tail)) if tail else []
    ids += piece
    hidden += [False] * len(piece)
    return Passage(text + tail, template + tail, torch.tensor(ids, dtype=torch.long), torch.tensor(hidden))


def filled_words(tokenizer: Any, tokens: torch.Tensor | list[int], known: torch.Tensor | list[bool]) -> list[str]:
    """The words (`aogpt.measures.words`) of a filled sequence that overlap a filled token, found on
    the decoded text by each token's character span."""
    spans, text, filled = [], "", []
    for t, k in zip(list(tokens), list(known), strict=True):
        piece = tokenizer.decode([int(t)])
        spans.append((len(text), len(text) + len(piece)))
        text += piece
        filled.append(not bool(k))
    out = []
    for mt in WORD.finditer(text):
        if words(mt.group(0)) and any(f and a < mt.end() and mt.start() < b for (a, b), f in zip(spans, filled,
                                                                                                   strict=True)):
            out.append(mt.group(0).lower())
    return out
