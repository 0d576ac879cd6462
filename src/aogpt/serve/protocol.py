"""The request and response formats of `aogpt serve`: the OpenAI completions subset plus aogpt's fields.

A request (`CompletionRequest`, checked by pydantic: unknown fields and values out of range are a
400 with a one-line reason) becomes the keyword arguments of one `aogpt.generate` call
(`to_generate`): the prompt is a prefix, or, when it contains ``[MASK]`` / ``[MASK:k]`` blanks, an
infilling template whose blanks are filled (the completion is then the whole text). A result
becomes the response body (`completion_body`) and, when streaming, one chunk per sequence and step
(`Choice.step_chunk`): OpenAI clients read ``choices[0].text``, which carries the text that became
final *at the left end* (so the concatenated chunks are the completion), while ``aogpt`` in each
choice says which positions the step revealed, their tokens and their text.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from aogpt.errors import AOGPTError
from aogpt.generation.conditioning import BLANK, parse_template, prompt_condition
from aogpt.generation.generate import GenerationResult
from aogpt.generation.reveal import Revealed

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
MAX_PROMPT_CHARS = 1_000_000  # far beyond any context; refused before it is tokenized


class CompletionRequest(BaseModel):
    """POST /v1/completions. OpenAI fields first; aogpt's own after (docs/serve.md)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, max_length=1000)
    prompt: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)] | Annotated[list[int], Field(max_length=2**20)] = ""
    max_tokens: int | None = Field(None, ge=0, le=1_000_000)
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=4096)
    seed: int | None = Field(None, ge=0, le=2**62)
    stream: bool = False
    stop: Annotated[str, Field(max_length=1000)] | Annotated[list[str], Field(max_length=16)] | None = None
    user: str | None = Field(None, max_length=1000)
    # OpenAI fields accepted only with the value that changes nothing
    echo: Literal[False] = False
    logprobs: None = None
    best_of: Literal[1] | None = None
    suffix: None = None
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
    timeout: float | None = Field(None, gt=0, le=86_400)  # seconds: this request's deadline (at most the server's)


def is_template(prompt: Any) -> bool:
    return isinstance(prompt, str) and BLANK.search(prompt) is not None


def to_generate(req: CompletionRequest, config: Any, tokenizer: Any, max_samples: int) -> tuple[dict[str, Any], int]:
    """The `generate` keyword arguments of a request and the number of known tokens that precede the
    completion (a prompt's; 0 for a template: its completion is the whole text). Raises `AOGPTError`
    for what the model or the server's limit on samples refuses."""
    if req.n > max_samples:
        raise AOGPTError(f"n = {req.n} is more than this server's {max_samples} samples per request",
                         f"ask for at most {max_samples}, or start the server with a larger --max-samples")
    if isinstance(req.prompt, str) and req.prompt and tokenizer is None:
        raise AOGPTError("this model has no tokenizer, so the prompt must be token ids", "send a list of ids")
    if is_template(req.prompt):
        base = parse_template(req.prompt, tokenizer=tokenizer, length=None, config=config)
        extra = req.max_tokens or 0
        condition = (base if not extra else
                     parse_template(req.prompt, tokenizer=tokenizer, length=base.length + extra, config=config))
        first = 0
    else:
        ids = tokenizer.encode(req.prompt) if isinstance(req.prompt, str) else list(req.prompt)
        wanted = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
        if wanted < 1:
            raise AOGPTError("max_tokens must be at least 1 for a prompt", "ask for 1 or more tokens")
        if len(ids) + wanted > config.block_size:
            raise AOGPTError(f"the prompt ({len(ids)} tokens) and max_tokens ({wanted}) exceed the model's "
                             f"context of {config.block_size} tokens",
                             f"shorten the prompt or ask for at most {max(config.block_size - len(ids), 0)} tokens")
        condition = prompt_condition(ids, len(ids) + wanted, tokenizer, config)
        first = len(ids)
    if condition.positions.numel() >= condition.length:
        raise AOGPTError("the template has no blanks to fill", "add [MASK] or [MASK:k], or set max_tokens")
    kwargs: dict[str, Any] = {
        "condition": condition, "num_samples": req.n, "seed": req.seed, "tokenizer": tokenizer,
        "return_text": False, "order": req.order, "steps": req.steps, "policy": req.policy,
        "schedule": req.schedule, "speculative": req.speculative, "candidates": req.candidates,
        "threshold": req.threshold, "top_p": req.top_p, "top_k": req.top_k,
        "temperature": req.temperature if req.temperature > 0 else None, "greedy": req.temperature == 0 or None,
    }
    return kwargs, first


def stops(req: CompletionRequest) -> list[str]:
    found = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    return [s for s in found if s]


class Choice:
    """One sequence of a request as it fills in: its tokens by position, the step that revealed each
    (-1: known), and the text already sent to a streaming client (final text left of the first
    position still masked, held back where it could be the start of a stop string)."""

    def __init__(self, index: int, length: int, known: np.ndarray, known_tokens: np.ndarray, first: int,
                 tokenizer: Any, stop: list[str]):
        self.index, self.first, self.tokenizer, self.stop = index, first, tokenizer, stop
        self.tokens = np.full(length, -1, dtype=np.int64)
        self.tokens[known] = known_tokens
        self.step = np.full(length, -1, dtype=np.int64)
        self.sent = ""
        self.stopped = False

    def decode(self, ids: Any) -> str:
        if self.tokenizer is None:
            return " ".join(str(int(i)) for i in ids)
        return self.tokenizer.decode([int(i) for i in ids])

    def _visible(self, final: bool) -> str:
        """Completion text that may be shown: up to the first masked position, cut at a stop string."""
        masked = np.flatnonzero(self.tokens[self.first:] < 0)
        end = self.first + (int(masked[0]) if len(masked) else len(self.tokens) - self.first)
        text = self.decode(self.tokens[self.first:end])
        cuts = [text.find(s) for s in self.stop if s in text]
        if cuts:
            self.stopped = True
            return text[:min(cuts)]
        if not final and self.stop and end < len(self.tokens):
            text = text[:max(0, len(text) - max(len(s) for s in self.stop) + 1)]
        return text

    def start(self) -> dict[str, Any]:
        """The first chunk's choice: the layout (length) and the known tokens, as step 0."""
        known = np.flatnonzero(self.tokens >= 0)
        return {"index": self.index, "text": "", "finish_reason": None, "logprobs": None,
                "aogpt": {"step": 0, "length": len(self.tokens), "completion_start": self.first,
                          "positions": known.tolist(), "tokens": self.tokens[known].tolist(),
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
                          "steps": self.step.tolist(), "completion_start": self.first}}


def choices_for(result_shape: tuple[int, int], condition: Any, first: int, tokenizer: Any,
                stop: list[str]) -> list[Choice]:
    n_samples, length = result_shape
    known = condition.positions.numpy()
    return [Choice(i, length, known, condition.tokens.numpy(), first, tokenizer, stop) for i in range(n_samples)]


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


def completion_body(request_id: str, model: str, result: GenerationResult, choices: list[Choice],
                    created: int | None = None) -> dict[str, Any]:
    tokens = result.tokens.numpy()
    steps = reveal_steps(result)
    masked = int((~result.known).sum())
    known = int(result.known.sum())
    return {"id": request_id, "object": "text_completion", "created": created or int(time.time()), "model": model,
            "choices": [c.body(tokens[c.index], steps[c.index]) for c in choices],
            "usage": {"prompt_tokens": known, "completion_tokens": masked * len(choices),
                      "total_tokens": known + masked * len(choices)},
            "aogpt": {"seed": result.settings["seed"], "settings": result.settings,
                      "forwards": result.timing.get("forwards")}}


def chunk(request_id: str, model: str, created: int, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"id": request_id, "object": "text_completion", "created": created, "model": model, "choices": choices,
            **extra}
