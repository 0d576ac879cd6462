"""A gap of unknown length: the model chooses it from its own exact likelihoods.

A template ``before [MASK:?] after`` (or a prompt and a suffix with no length between them) leaves
the number of missing tokens open. For each candidate length k the text after the gap sits at
positions shifted by k, and the model gives that layout a probability: the marginal, over every
fill of the k positions (and of any other blank), of the given tokens at their positions,

    p_k = sum over fills f of p(given tokens, f)     (the tokens read left to right, exactly)

The sum has V^k terms, so it is estimated by importance sampling with the model's own both-sides
fills as the proposal q: D fills drawn given every known token (the given positions read first,
then the blanks left to right, one token per step, temperature 1, nothing cut off), and

    p_k ~ (1/D) sum_j p(given, f_j) / q(f_j | given),

each factor exact: p by one left-to-right pass over the filled sequence, q by one pass along the
order the fill was drawn in (`aogpt.generation.likelihood`). The estimate is unbiased for p_k
(its logarithm is biased low by about half the weights' relative variance, less as D grows). The
chosen length is the most probable one a posteriori under a uniform prior over the candidates
1..min(`MAX_GAP`, room in the context): argmax_k p_k. The posterior over k is reported too.

Cost: one `generate` of D fills per candidate (k forwards of D rows each) and one scoring pass of
2D rows, sum_k k + K forwards for K candidates. Every draw comes from streams seeded by the caller's
seed and k, so a choice is reproducible: `aogpt serve` answers a request with seed s by the length
`choose_length(..., seed=s)` picks and then `generate(seed=s)` on the template at that length.
How often it finds the true length, against a fixed guess: docs/generation.md ("Gaps of unknown
length"), measured by `aogpt bench gap-length`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from aogpt.errors import AOGPTError
from aogpt.families import family_of
from aogpt.generation.conditioning import BLANK, Conditioning, parse_template
from aogpt.generation.generate import generate
from aogpt.generation.likelihood import chain_logprobs
from aogpt.seeds import draw_seed

UNKNOWN = "[MASK:?]"
MAX_GAP = 32  # candidate lengths 1..32 (fewer where the context has less room)
DRAWS = 4  # proposal fills per candidate length (measured against 1 and 16 in docs/generation.md)

Layout = Callable[[int], Conditioning]
NOTHING_AFTER = ("a gap of unknown length needs text after it (its length is read from where that text fits; "
                 "with nothing after it every length fits)")


@dataclass(frozen=True)
class LengthChoice:
    """The chosen `length`, every candidate's estimated log p_k (`log_marginals`, nats) and posterior
    probability (uniform prior), and the proposal fills drawn per candidate (`draws`)."""

    length: int
    candidates: list[int]
    log_marginals: list[float]
    posterior: list[float]
    draws: int

    def to_dict(self) -> dict[str, Any]:
        return {"length": self.length, "candidates": self.candidates, "log_marginals": self.log_marginals,
                "posterior": self.posterior, "draws": self.draws}


def has_unknown_gap(template: Any) -> bool:
    return isinstance(template, str) and UNKNOWN in template


def template_layout(template: str, tokenizer: Any, config: Any, extra: int = 0) -> Layout:
    """The layouts of a text template with one ``[MASK:?]`` blank (other blanks have fixed lengths;
    `extra` blanks appended at the end): k -> the template with ``[MASK:k]`` there. The text
    around the gap is encoded the same whatever k (each piece between blanks on its own)."""
    before, found, after = template.partition(UNKNOWN)
    if not found:
        raise AOGPTError("the template has no [MASK:?] blank", "mark the gap of unknown length with [MASK:?]")
    if UNKNOWN in after:
        raise AOGPTError("the template has more than one [MASK:?] blank (only one gap may have an unknown length)",
                         "give the other gaps a length, [MASK:k]")
    if not BLANK.sub("", after):
        raise AOGPTError(NOTHING_AFTER, "put the text that follows the gap after [MASK:?], or continue a prompt")

    def layout(k: int) -> Conditioning:
        text = f"{before}[MASK:{k}]{after}"
        base = parse_template(text, tokenizer=tokenizer, length=None, config=config)
        return parse_template(text, tokenizer=tokenizer, length=base.length + extra, config=config) if extra else base

    return layout


def ids_layout(prefix: Sequence[int], suffix: Sequence[int], config: Any) -> Layout:
    """The layouts of a prefix and a suffix (ids) with k blanks between them."""
    prefix, suffix = [int(t) for t in prefix], [int(t) for t in suffix]
    if not suffix:
        raise AOGPTError(NOTHING_AFTER, "give the text that follows the gap, or continue a prompt")
    return lambda k: parse_template([*prefix, *([None] * k), *suffix], tokenizer=None, length=None, config=config)


def candidate_lengths(layout: Layout, config: Any, max_gap: int = MAX_GAP) -> list[int]:
    """1..min(max_gap, the room the context leaves beside the given text); `layout` refuses a gap of
    one token that does not fit (the conditioning's own check)."""
    base = layout(1).length - 1
    return list(range(1, min(max_gap, config.block_size - base) + 1))


def check_model(model: Any) -> None:
    fam = family_of(model)
    if not (fam.causal and fam.one_pass_nll and fam.any_order):
        raise AOGPTError(f"a {fam.name} model cannot choose a gap's length from exact likelihoods given both sides",
                         "give the gap a length ([MASK:k], or max_tokens with a suffix), or use an any-order decoder")


def log_marginal(model: Any, condition: Conditioning, draws: int, seed: int, **generate_kwargs: Any
                 ) -> tuple[float, torch.Tensor]:
    """The importance-sampling estimate of log p(the given tokens at their positions) (module
    docstring) and the D log weights it averages."""
    fills = generate(model, condition=condition, num_samples=draws, seed=seed, order="l2r", policy="count",
                     steps=None, temperature=1.0, top_p=1.0, top_k=0, greedy=False, **generate_kwargs)
    m = int(fills.known.sum())
    left_to_right = torch.arange(condition.length).expand(draws, -1)
    scores = chain_logprobs(model, torch.cat([fills.tokens, fills.tokens]),
                            torch.cat([left_to_right, fills.orders])).logprobs
    log_p = scores[:draws].sum(1)  # the whole filled sequence, left to right
    log_q = scores[draws:, m:].sum(1)  # the fill, in the order it was drawn (given tokens read first)
    weights = log_p - log_q
    return float(torch.logsumexp(weights, 0) - math.log(draws)), weights


def choose_length(model: Any, layout: Layout, *, seed: int, draws: int = DRAWS, max_gap: int = MAX_GAP,
                  candidates: Sequence[int] | None = None, **generate_kwargs: Any) -> LengthChoice:
    """The most probable gap length (module docstring). `model`: an any-order decoder (or the serving
    engine's stand-in); `layout`: k -> the conditioning with the gap k tokens long (`template_layout`,
    `ids_layout`); `generate_kwargs` go to the proposal's `generate` calls (run settings only)."""
    check_model(model)
    if draws < 1:
        raise AOGPTError(f"the length estimate needs at least one draw per length, got {draws}", "pass draws >= 1")
    config = model.config
    ks = list(candidates) if candidates is not None else candidate_lengths(layout, config, max_gap)
    logs = [log_marginal(model, layout(k), draws, draw_seed(seed, "gap-length", k), **generate_kwargs)[0] for k in ks]
    post = torch.softmax(torch.tensor(logs, dtype=torch.float64), 0)
    best = int(torch.argmax(post))
    return LengthChoice(ks[best], ks, logs, post.tolist(), draws)


__all__ = ["DRAWS", "MAX_GAP", "UNKNOWN", "LengthChoice", "candidate_lengths", "check_model", "choose_length",
           "has_unknown_gap", "ids_layout", "log_marginal", "template_layout"]
