"""What OpenAI's completions fields mean for an any-order model, as the server runs and answers them.

`complete` is what the engine runs for a prompt that is more than one plain `generate` call
(`Plan.custom`): a gap of unknown length (the length first, chosen by the model's exact likelihoods,
`aogpt.generation.length`), a fill-in-the-middle model's fill (`aogpt.generation.fim`), and ``echo``
/ ``logprobs``, whose log-probabilities come from one more causal pass over the finished sequences
(`aogpt.generation.likelihood`). It runs in the request's greenlet on the engine's `SharedModel`,
so every forward it makes, the length estimate's and the scoring pass included, is batched with
the other requests' steps.

What a log-probability is here (docs/serve.md): every token's, read along the order its sequence
was made in: the given tokens (a prompt, a template's text) first, left to right, then the generated
ones in the order they were revealed. So a prompt token's is the exact log p(x_i | x_<i), the number
``aogpt harness`` and lm-evaluation-harness compute; a generated token's is log p(token | the given
tokens and the tokens revealed before it), the distribution it was drawn from when one token is
revealed per step (before temperature, top-p and top-k), and the sum over a sample is its exact
log-likelihood under that order. The first token has a value too (OpenAI's models give it null): an
aogpt decoder predicts it from its start slot.

`body` builds the response of all a request's prompts in OpenAI's layout: choice i of prompt p is
``choices[p * n + i]``; ``logprobs`` holds ``tokens``, ``token_logprobs``, ``top_logprobs`` (the
`logprobs` most likely tokens of each position, and the token itself, as OpenAI lists them) and
``text_offset``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from aogpt.generation.fim import fim_fill
from aogpt.generation.generate import GenerationResult, generate
from aogpt.generation.length import LengthChoice, choose_length
from aogpt.generation.likelihood import ChainScores, chain_logprobs
from aogpt.serve.protocol import Choice, Plan, reveal_steps


@dataclass
class Completed:
    """What `complete` returns: the generation's result, the chain log-probabilities (``echo`` /
    ``logprobs``), and the chosen length of a gap that had none."""

    result: GenerationResult
    scores: ChainScores | None = None
    gap: LengthChoice | None = None


def scored_only(condition: Any, num_samples: int, seed: int) -> GenerationResult:
    """The `GenerationResult` of a prompt that is scored and not continued (echo, max_tokens 0)."""
    n = condition.length
    tokens = condition.tokens[condition.positions.argsort()].expand(num_samples, n).clone()
    return GenerationResult(tokens, torch.arange(n).expand(num_samples, n).clone(),
                            torch.zeros(num_samples, 0, dtype=torch.long), torch.ones(n, dtype=torch.bool), None,
                            {"seconds": 0.0, "forwards": 0}, {"seed": seed, "num_samples": num_samples, "length": n})


def complete(model: Any, *, plan: Plan, announce: Callable[[str, Any], None] | None = None,
             on_step: Any = None, prepack: bool = False, compile: bool = False, **kwargs: Any) -> Completed:
    """Run one prompt's plan (module docstring) on `model` (the engine's `SharedModel`, or a model
    offline): choose the gap's length if it has none (``announce("layout", (condition, choice))``
    then), generate or fill, score. `kwargs`: the plan's `generate` arguments."""
    run = {"prepack": prepack, "compile": compile}
    gap = None
    if plan.layout is not None:
        gap = choose_length(model, plan.layout, seed=kwargs["seed"], **run)
        kwargs["condition"] = plan.layout(gap.length)
        if announce is not None:
            announce("layout", (kwargs["condition"], gap))
    if plan.fim:
        result = fim_fill(model, None, on_step=on_step, **kwargs, **run)
    elif plan.generates:
        result = generate(model, **kwargs, on_step=on_step, **run)
    else:
        result = scored_only(kwargs["condition"], kwargs["num_samples"], kwargs["seed"])
    scores = None
    if plan.echo or plan.logprobs is not None:
        scores = chain_logprobs(model, result.tokens, result.orders, top=plan.logprobs or 0)
    return Completed(result, scores, gap)


@dataclass
class Part:
    """One prompt of a request for the response: its plan, what its job returned, its choices."""

    plan: Plan
    done: GenerationResult | Completed
    choices: list[Choice]

    @property
    def result(self) -> GenerationResult:
        return self.done.result if isinstance(self.done, Completed) else self.done


def _by_position(values: torch.Tensor, orders: torch.Tensor) -> torch.Tensor:
    """Chain-step values (N, n, ...) laid out by position: out[b, orders[b, i]] = values[b, i]."""
    out = torch.empty_like(values)
    index = orders.view(*orders.shape, *([1] * (values.dim() - 2))).expand_as(values)
    return out.scatter_(1, index, values)


def logprobs_layout(choice: Choice, positions: list[int], logp: torch.Tensor, top_ids: torch.Tensor | None,
                    top_logp: torch.Tensor | None, start_text: str = "") -> dict[str, Any]:
    """OpenAI's ``logprobs`` object for `positions` of one sequence (values by position)."""
    ids = [int(choice.tokens[p]) for p in positions]
    pieces = [choice.decode([t]) for t in ids]
    values = logp[positions].tolist()
    tops = []
    for k, p in enumerate(positions):
        top: dict[str, float] = {}
        if top_ids is not None:
            for t, v in zip(top_ids[p].tolist(), top_logp[p].tolist(), strict=True):
                top.setdefault(choice.decode([t]), v)
        top.setdefault(pieces[k], values[k])  # the token itself, as OpenAI lists it
        tops.append(top)
    offsets = [len(start_text) + len(choice.decode(ids[:k])) for k in range(len(ids))]
    return {"tokens": pieces, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def _choice_body(part: Part, choice: Choice, tokens: np.ndarray, steps: np.ndarray,
                 scored: tuple[torch.Tensor, Any, Any] | None) -> dict[str, Any]:
    out = choice.body(tokens[choice.sample], steps[choice.sample])
    plan = part.plan
    if plan.echo:
        out["text"] = choice.decode(choice.tokens[:choice.first]) + out["text"]
    if scored is not None:
        logp, top_ids, top_logp = (None if t is None else t[choice.sample] for t in scored)
        shown = choice.shown + (1 if choice.ended_by_eot else 0)  # the end-of-text token that ended it is listed
        positions = list(range(0 if plan.echo else choice.first, choice.first + shown))
        out["logprobs"] = logprobs_layout(choice, positions, logp, top_ids, top_logp)
    if isinstance(part.done, Completed) and part.done.gap is not None:
        out["aogpt"]["gap"] = part.done.gap.to_dict()
    return out


def body(request_id: str, model: str, parts: list[Part], created: int | None = None) -> dict[str, Any]:
    """The response to a request whose prompts produced `parts` (module docstring)."""
    choices, prompt_tokens, completion_tokens, forwards = [], 0, 0, 0
    for part in parts:
        result = part.result
        tokens, steps = result.tokens.numpy(), reveal_steps(result)
        scored = None
        scores = part.done.scores if isinstance(part.done, Completed) else None
        if scores is not None:
            orders = result.orders
            scored = (_by_position(scores.logprobs, orders),
                      None if scores.top_ids is None else _by_position(scores.top_ids, orders),
                      None if scores.top_logprobs is None else _by_position(scores.top_logprobs, orders))
        choices += [_choice_body(part, c, tokens, steps, scored) for c in part.choices]
        known, masked = int(result.known.sum()), int((~result.known).sum())
        prompt_tokens += known
        completion_tokens += masked * len(part.choices)
        forwards += int(result.timing.get("forwards") or 0)
    first = parts[0].result
    extra = {"seed": first.settings["seed"], "settings": first.settings, "forwards": forwards}
    return {"id": request_id, "object": "text_completion", "created": created or int(time.time()), "model": model,
            "choices": choices, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                          "total_tokens": prompt_tokens + completion_tokens}, "aogpt": extra}


__all__ = ["Completed", "Part", "body", "complete", "logprobs_layout", "scored_only"]
