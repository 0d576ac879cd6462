"""The request and response formats of `aogpt serve`: the OpenAI completions subset plus aogpt's fields.

A request (`CompletionRequest`, checked by pydantic: unknown fields and values out of range are a
400 with a one-line reason) holds one prompt or a batch of them (`prompts`); each becomes a `Plan`
(`plan_prompt`): the keyword arguments of one `aogpt.generate` call and where its completion lies.
A prompt is a prefix to continue; or, with ``suffix``, the text before a gap whose other side is
the suffix (the completion is the gap); or, when it contains ``[MASK]`` / ``[MASK:k]`` blanks, an
infilling template whose blanks are filled (the completion is then the whole text). A gap without
a length (``[MASK:?]``, or a suffix without ``max_tokens``) gets the length the model finds most
probable (`aogpt.generation.length`), chosen when the request runs. A fill-in-the-middle GPT fills
gaps from its sentinels (`aogpt.generation.fim`). A result becomes the response body
(`completion_body`) and, when streaming, one chunk per sequence and step (`Choice.step_chunk`):
OpenAI clients read ``choices[0].text``, which carries the text that became final *at the left end*
(so the concatenated chunks are the completion), while ``aogpt`` in each choice says which
positions the step revealed, their tokens and their text. A continuation ends at the tokenizer's
end-of-text token (the first one in position order), with ``finish_reason`` "stop".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from aogpt.data.fim import sentinels_of
from aogpt.errors import AOGPTError
from aogpt.families import family
from aogpt.generation.conditioning import BLANK, Conditioning, parse_template, prompt_condition
from aogpt.generation.generate import GenerationResult, text_end
from aogpt.generation.length import (
    Layout,
    candidate_lengths,
    check_model,
    has_unknown_gap,
    ids_layout,
    template_layout,
)
from aogpt.generation.reveal import Revealed

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
MAX_PROMPT_CHARS = 1_000_000  # far beyond any context; refused before it is tokenized
MAX_PROMPTS = 4096  # prompts in one request (n x prompts is held to the server's --max-samples)
MAX_LOGPROBS = 20  # most likely tokens listed per position (vLLM's default cap; OpenAI's is 5)
FIM_FIELDS = ("order", "steps", "policy", "speculative", "candidates", "threshold")

Text = Annotated[str, Field(max_length=MAX_PROMPT_CHARS)]
Ids = Annotated[list[int], Field(max_length=2**20)]


class CompletionRequest(BaseModel):
    """POST /v1/completions. OpenAI fields first; aogpt's own after (docs/serve.md)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, max_length=1000)
    prompt: Text | Ids | Annotated[list[Text], Field(max_length=MAX_PROMPTS)] | Annotated[
        list[Ids], Field(max_length=MAX_PROMPTS)] = ""
    suffix: Text | Ids | None = None
    max_tokens: int | None = Field(None, ge=0, le=1_000_000)
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=4096)
    seed: int | None = Field(None, ge=0, le=2**62)
    stream: bool = False
    stop: Annotated[str, Field(max_length=1000)] | Annotated[list[str], Field(max_length=16)] | None = None
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    user: str | None = Field(None, max_length=1000)
    # OpenAI fields accepted only with the value that changes nothing
    best_of: Literal[1] | None = None
    presence_penalty: Literal[0] = 0
    frequency_penalty: Literal[0] = 0
    logit_bias: None = None
    stream_options: dict[str, bool] | None = None
    # aogpt
    order: str | None = Field(None, max_length=200)
    steps: int | None = Field(None, ge=1, le=1_000_000)
    policy: Literal["bernoulli", "count"] | None = None
    schedule: Literal["linear", "cosine"] = "linear"
    speculative: int | Literal["auto"] | None = None
    candidates: int | None = Field(None, ge=1, le=1_000_000)
    threshold: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=2**31)
    ignore_eos: bool = False  # keep a continuation's text past its end-of-text token (vLLM's name)
    timeout: float | None = Field(None, gt=0, le=86_400)  # seconds: this request's deadline (at most the server's)


def is_template(prompt: Any) -> bool:
    return isinstance(prompt, str) and BLANK.search(prompt) is not None


def has_suffix(req: CompletionRequest) -> bool:
    """Whether the request has text after its gap (an empty suffix, as OpenAI reads it, is none)."""
    return req.suffix is not None and len(req.suffix) > 0


def prompts(req: CompletionRequest) -> list[str | list[int]]:
    """The request's prompts: a batch (a list of strings or of id lists) or the one prompt."""
    p = req.prompt
    if isinstance(p, list) and p and isinstance(p[0], (str, list)):
        return list(p)
    return [p]


@dataclass
class Plan:
    """One prompt of a request, ready to run: `kwargs` of its `generate` call (``condition`` None
    while a gap's length is open: `layout` gives it for each length), where its completion starts
    (`first`) and the tokens of the suffix after it (`suffix_tokens`), whether a
    fill-in-the-middle model fills it (`fim`), the end-of-text id that ends it (`eot`), and what
    the response lists (`echo`, `logprobs`)."""

    kwargs: dict[str, Any]
    first: int
    layout: Layout | None = None
    fim: bool = False
    eot: int | None = None
    echo: bool = False
    logprobs: int | None = None
    suffix_tokens: int = 0

    @property
    def condition(self) -> Any:
        return self.kwargs.get("condition")

    @property
    def generates(self) -> bool:
        """False for an echoed prompt with max_tokens 0: it is scored, nothing is generated."""
        cond = self.condition
        return cond is None or cond.positions.numel() < cond.length

    @property
    def custom(self) -> bool:
        """Whether the request needs more than one plain `generate` call (`aogpt.serve.openai.complete`)."""
        return self.layout is not None or self.fim or self.echo or self.logprobs is not None or not self.generates


def _encode(text: str | list[int], tokenizer: Any, what: str) -> list[int]:
    if isinstance(text, list):
        return list(text)
    if text and tokenizer is None:
        raise AOGPTError(f"this model has no tokenizer, so the {what} must be token ids", "send a list of ids")
    return list(tokenizer.encode(text)) if text else []


def _check(req: CompletionRequest, config: Any, prompt: Any, max_samples: int, count: int) -> None:
    """Refuse what the request cannot mean (one line each), before anything is tokenized."""
    total = req.n * count
    if total > max_samples:
        what = f"n = {req.n}" if count == 1 else f"n x prompts = {req.n} x {count} = {total}"
        raise AOGPTError(f"{what} is more than this server's {max_samples} samples per request",
                         f"ask for at most {max_samples}, or start the server with a larger --max-samples")
    template = is_template(prompt)
    if req.stream and (count > 1 or req.echo or req.logprobs is not None):
        raise AOGPTError("a stream carries one prompt, without echo or logprobs",
                         "send those requests without stream")
    if req.echo and (template or has_suffix(req)):
        raise AOGPTError("echo returns a prompt followed by its continuation, but a template's completion is its "
                         "whole text and a suffix's is the gap", "drop echo for templates and suffixes")
    if has_suffix(req) and template:
        raise AOGPTError("a prompt with [MASK] blanks is a template and takes no suffix",
                         "put the text after the gap into the template, or send a prompt without blanks")
    fam = family(config.variant)
    if (req.echo or req.logprobs is not None) and not (fam.causal and fam.one_pass_nll):
        raise AOGPTError(f"a {config.variant} model has no exact log-probabilities (echo and logprobs need them)",
                         "use a decoder (gpt, sigma, aogpt), or drop echo and logprobs")


def plan_prompt(req: CompletionRequest, prompt: str | list[int], config: Any, tokenizer: Any, seed: int,
                count: int = 1, max_samples: int = 16) -> Plan:
    """The `Plan` of one of the request's `count` prompts (module docstring). Raises `AOGPTError` for
    what the model or the server's limits refuse."""
    _check(req, config, prompt, max_samples, count)
    fim = sentinels_of(config) is not None and (is_template(prompt) or has_suffix(req))
    kwargs: dict[str, Any] = {
        "num_samples": req.n, "seed": seed, "tokenizer": tokenizer, "return_text": False,
        "top_p": req.top_p, "top_k": req.top_k,
        "temperature": req.temperature if req.temperature > 0 else None, "greedy": req.temperature == 0 or None,
    }
    if fim:
        given = [f for f in FIM_FIELDS if getattr(req, f) is not None]
        if given:
            raise AOGPTError(f"a fill-in-the-middle model fills each gap left to right after its sides ({given[0]} "
                             "does not apply)", f"drop {', '.join(given)}")
        if req.logprobs is not None:
            raise AOGPTError("logprobs of a fill-in-the-middle model's fills are not served",
                             "drop logprobs, or use an any-order model")
    else:
        kwargs.update(order=req.order, steps=req.steps, policy=req.policy, schedule=req.schedule,
                      speculative=req.speculative, candidates=req.candidates, threshold=req.threshold)
    plan = Plan(kwargs, 0, fim=fim, echo=req.echo, logprobs=req.logprobs)
    if has_suffix(req):
        _plan_suffix(plan, req, prompt, config, tokenizer)
    elif is_template(prompt):
        _plan_template(plan, req, prompt, config, tokenizer)
    else:
        _plan_prompt(plan, req, prompt, config, tokenizer)
    if plan.layout is not None:
        if fim:
            raise AOGPTError("a fill-in-the-middle model fills a gap of a given length here",
                             "give the gap a length: max_tokens with a suffix, or [MASK:k]")
        check_model(config)
        candidate_lengths(plan.layout, config)  # room for at least one token
    elif not plan.generates and not req.echo:
        raise AOGPTError("the template has no blanks to fill", "add [MASK] or [MASK:k], or set max_tokens")
    return plan


def _plan_prompt(plan: Plan, req: CompletionRequest, prompt: Any, config: Any, tokenizer: Any) -> None:
    ids = _encode(prompt, tokenizer, "prompt")
    wanted = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    if wanted < 1 and not req.echo:
        raise AOGPTError("max_tokens must be at least 1 for a prompt", "ask for 1 or more tokens")
    if len(ids) + wanted > config.block_size:
        raise AOGPTError(f"the prompt ({len(ids)} tokens) and max_tokens ({wanted}) exceed the model's "
                         f"context of {config.block_size} tokens",
                         f"shorten the prompt or ask for at most {max(config.block_size - len(ids), 0)} tokens")
    if wanted:
        plan.kwargs["condition"] = prompt_condition(ids, len(ids) + wanted, tokenizer, config)
    else:  # echo with max_tokens 0: the prompt is scored, nothing generated
        if not ids:
            raise AOGPTError("echo with max_tokens 0 needs a prompt to score", "send a prompt, or ask for tokens")
        plan.kwargs["condition"] = Conditioning(len(ids), torch.arange(len(ids)), torch.tensor(ids))
    plan.first = len(ids)
    eot = getattr(tokenizer, "eot_id", None)
    plan.eot = None if req.ignore_eos or eot is None else int(eot)


def _plan_template(plan: Plan, req: CompletionRequest, prompt: str, config: Any, tokenizer: Any) -> None:
    extra = req.max_tokens or 0
    if has_unknown_gap(prompt):
        plan.layout = template_layout(prompt, tokenizer, config, extra)
        plan.kwargs["condition"] = None
        return
    base = parse_template(prompt, tokenizer=tokenizer, length=None, config=config)
    plan.kwargs["condition"] = (base if not extra else
                                parse_template(prompt, tokenizer=tokenizer, length=base.length + extra, config=config))


def _plan_suffix(plan: Plan, req: CompletionRequest, prompt: Any, config: Any, tokenizer: Any) -> None:
    before, after = _encode(prompt, tokenizer, "prompt"), _encode(req.suffix, tokenizer, "suffix")
    plan.first, plan.suffix_tokens = len(before), len(after)
    if req.max_tokens is None:  # the gap's length is the model's to choose
        if len(before) + 1 + len(after) > config.block_size:
            raise AOGPTError(f"the prompt ({len(before)} tokens) and the suffix ({len(after)} tokens) leave no room "
                             f"for a gap in the model's context of {config.block_size} tokens",
                             "shorten the prompt or the suffix")
        plan.layout = ids_layout(before, after, config)
        plan.kwargs["condition"] = None
        return
    k = req.max_tokens
    if k < 1:
        raise AOGPTError("max_tokens (the gap between the prompt and the suffix) must be at least 1",
                         "ask for 1 or more tokens, or leave max_tokens out to let the model choose")
    if len(before) + k + len(after) > config.block_size:
        raise AOGPTError(f"the prompt ({len(before)} tokens), the gap of {k} tokens and the suffix ({len(after)} "
                         f"tokens) exceed the model's context of {config.block_size} tokens",
                         "shorten the prompt or the suffix, or ask for fewer tokens")
    plan.kwargs["condition"] = parse_template([*before, *([None] * k), *after], tokenizer=None, length=None,
                                              config=config)


def to_generate(req: CompletionRequest, config: Any, tokenizer: Any, max_samples: int) -> tuple[dict[str, Any], int]:
    """The `generate` keyword arguments of a one-prompt request whose gaps have lengths, and the
    number of known tokens that precede the completion (0 for a template: its completion is the
    whole text)."""
    seed = req.seed if req.seed is not None else draw_request_seed()
    plan = plan_prompt(req, prompts(req)[0], config, tokenizer, seed, 1, max_samples)
    if plan.layout is not None or plan.fim:
        raise AOGPTError("this request is not one generate() call", "use aogpt.serve.openai.complete")
    kwargs = dict(plan.kwargs)
    if req.seed is None:
        kwargs["seed"] = None
    return kwargs, plan.first


def draw_request_seed() -> int:
    """A seed for a request without one (the response returns it, so the answer can be replayed)."""
    return int.from_bytes(os.urandom(8), "little") >> 2


def stops(req: CompletionRequest) -> list[str]:
    found = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    return [s for s in found if s]


class Choice:
    """One sequence of a request as it fills in: its tokens by position, the step that revealed each
    (-1: known), and the text already sent to a streaming client (final text left of the first
    position still masked, held back where it could be the start of a stop string). The completion
    is positions ``first .. end - 1``; with `eot`, it ends before the first end-of-text token."""

    def __init__(self, index: int, length: int, known: np.ndarray, known_tokens: np.ndarray, first: int,
                 tokenizer: Any, stop: list[str], end: int | None = None, eot: int | None = None,
                 sample: int | None = None):
        self.index, self.first, self.tokenizer, self.stop = index, first, tokenizer, stop
        self.sample = index if sample is None else sample  # its row in its generate call's result
        self.end = length if end is None else end
        self.eot = eot
        self.tokens = np.full(length, -1, dtype=np.int64)
        self.tokens[known] = known_tokens
        self.step = np.full(length, -1, dtype=np.int64)
        self.sent = ""
        self.stopped = False
        self.shown = 0  # completion tokens the text is made of (a stop string's cut inside one included)
        self.ended_by_eot = False

    def decode(self, ids: Any) -> str:
        if self.tokenizer is None:
            return " ".join(str(int(i)) for i in ids)
        return self.tokenizer.decode([int(i) for i in ids])

    def _visible(self, final: bool) -> str:
        """Completion text that may be shown: up to the first masked position or end-of-text token,
        cut at a stop string."""
        span = self.tokens[self.first:self.end]
        masked = np.flatnonzero(span < 0)
        upto = int(masked[0]) if len(masked) else len(span)
        ends = text_end(span[:upto], 0, self.eot)
        if ends is not None:
            upto, self.ended_by_eot = ends, True
        text = self.decode(span[:upto])
        self.shown = upto
        cuts = [text.find(s) for s in self.stop if s in text]
        if cuts:
            self.stopped, cut = True, min(cuts)
            self.shown = sum(len(self.decode(span[:i])) < cut for i in range(upto)) if cut else 0
            self.ended_by_eot = False
            return text[:cut]
        self.stopped = self.ended_by_eot
        if not final and self.stop and not self.ended_by_eot and upto < len(span):
            text = text[:max(0, len(text) - max(len(s) for s in self.stop) + 1)]
        return text

    def start(self) -> dict[str, Any]:
        """The first chunk's choice: the layout (length) and the known tokens, as step 0."""
        known = np.flatnonzero(self.tokens >= 0)
        return {"index": self.index, "text": "", "finish_reason": None, "logprobs": None,
                "aogpt": {"step": 0, "length": len(self.tokens), "completion_start": self.first,
                          "completion_end": self.end, "positions": known.tolist(),
                          "tokens": self.tokens[known].tolist(),
                          "pieces": [self.decode([t]) for t in self.tokens[known]]}}

    def advance(self, revealed: Revealed, rows: np.ndarray) -> dict[str, Any]:
        """Take in this sequence's part of a step; the chunk's choice for it."""
        pos, tok = revealed.positions[rows], revealed.tokens[rows]
        self.tokens[pos] = tok
        self.step[pos] = revealed.step
        return {"index": self.index, "text": self._delta(final=False), "finish_reason": None, "logprobs": None,
                "aogpt": {"step": revealed.step, "positions": pos.tolist(), "tokens": tok.tolist(),
                          "pieces": [self.decode([t]) for t in tok]}}

    def _delta(self, final: bool) -> str:
        text = self._visible(final)
        if not text.startswith(self.sent):  # a merge changed earlier characters: send nothing more
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta

    def finish(self, tokens: np.ndarray) -> dict[str, Any]:
        """The last chunk's choice: the rest of the text, and why it ended."""
        self.tokens = tokens.copy()
        return {"index": self.index, "text": self._delta(final=True), "logprobs": None,
                "finish_reason": "stop" if self.stopped else "length"}

    def body(self, tokens: np.ndarray, steps: np.ndarray) -> dict[str, Any]:
        """The choice of a non-streamed response, with the tokens, their text and reveal steps."""
        self.tokens, self.step = tokens.copy(), steps
        text = self._visible(final=True)
        return {"index": self.index, "text": text, "logprobs": None,
                "finish_reason": "stop" if self.stopped else "length",
                "aogpt": {"tokens": self.tokens.tolist(), "pieces": [self.decode([t]) for t in self.tokens],
                          "steps": self.step.tolist(), "completion_start": self.first, "completion_end": self.end}}


def condition_of(result: GenerationResult) -> Conditioning:
    """The known positions and tokens a result was generated with (the same in every sample)."""
    positions = result.known.nonzero()[:, 0]
    return Conditioning(result.tokens.shape[1], positions, result.tokens[0, positions])


def choices_for(plan: Plan, condition: Conditioning, n_samples: int, tokenizer: Any, stop: list[str],
                offset: int = 0) -> list[Choice]:
    """The choices of one prompt's samples (numbered from `offset`) in the layout `condition`."""
    known = condition.positions.numpy()
    end = condition.length - plan.suffix_tokens
    return [Choice(offset + i, condition.length, known, condition.tokens.numpy(), plan.first, tokenizer, stop, end,
                   plan.eot, sample=i) for i in range(n_samples)]


def reveal_steps(result: GenerationResult) -> np.ndarray:
    """(N, n): the step that revealed each position (-1: known), counted as the stream counts them,
    in forwards of the sample's batch: a step in which no sequence of the batch reveals anything runs
    no forward, so the columns of `step_counts` where the batch revealed something are its forwards."""
    counts = result.step_counts.numpy()
    orders = result.orders.numpy()
    m = int(result.known.sum())
    out = np.full(result.tokens.shape, -1, dtype=np.int64)
    size = int(result.settings.get("batch_size") or len(counts))
    for start in range(0, len(counts), size):
        rows = counts[start:start + size]
        forward = np.cumsum(rows.any(axis=0))  # the forward number of each column that ran one
        for b, row in enumerate(rows, start):
            out[b, orders[b, m:]] = forward[np.repeat(np.arange(len(row)), row)]
    return out


def chunk(request_id: str, model: str, created: int, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"id": request_id, "object": "text_completion", "created": created, "model": model, "choices": choices,
            **extra}
