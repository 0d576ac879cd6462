"""What the serving engine is asked to do and what it refuses: a request (`Job`), the engine's limits
(`EngineLimits`), and the errors a request can end with (`Busy`, `Draining`, `Cancelled`, and the
503 reasons of a request shed for time).

A job's error is ``(status, message)``: 400 for a request the model cannot do, 500 for a bug, 503
for a request shed by the server (its queue deadline or deadline passed, the server shut down) or
whose client went away; a 503 comes with ``retry_after`` seconds.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aogpt.generation.generate import GenerationResult
from aogpt.generation.settings import GenerationSettings
from aogpt.validation import bounded, check_ranges

GONE = (503, "the request was cancelled (its client went away)")
SHUTDOWN = (503, "the server shut down before the request finished (retry on another server, or later)")


def deadline_error(seconds: float) -> tuple[int, str]:
    return (503, f"the request did not finish within its deadline of {seconds:.4g} s and was cancelled (the "
                 "server is busy: retry later, ask for fewer tokens, or give it a longer timeout)")


def queue_error(seconds: float) -> tuple[int, str]:
    return (503, f"the server is busy: the request could not start within {seconds:.4g} s (retry after the "
                 "time Retry-After says)")


class Cancelled(Exception):
    """The job was cancelled (its client went away, its deadline passed, or the server stopped)."""


class Busy(Exception):
    """The waiting queue is full: try again after `retry_after` seconds."""

    def __init__(self, retry_after: int):
        super().__init__(f"the server is busy (its queue is full); retry after {retry_after} s")
        self.retry_after = retry_after


class Draining(Exception):
    """The server is shutting down: it finishes the requests it has and takes no new ones."""

    def __init__(self):
        super().__init__("the server is shutting down and takes no new requests")


@dataclass(frozen=True)
class EngineLimits:
    """How much the engine takes on. max_sequences: sequences decoded at once (a request counts
    the samples `generate` decodes together, min(n, batch size)); max_tokens_in_flight: those
    sequences times their length, over the running requests; max_queue: requests waiting beyond.
    timeout: seconds from submission by which a job must have finished (None: no deadline; a job
    may ask for less); queue_timeout: seconds a job may wait to start (None: until its deadline);
    stall_after: seconds without progress, while there is work, after which `health` says "stuck"."""

    max_sequences: int = bounded(32, ge=1, le=4096, integer=True)
    max_tokens_in_flight: int = bounded(16384, ge=1, le=2**24, integer=True)
    max_queue: int = bounded(64, ge=0, le=100_000, integer=True)
    timeout: float | None = bounded(None, gt=0, le=86_400)
    queue_timeout: float | None = bounded(None, gt=0, le=86_400)
    stall_after: float = bounded(10.0, gt=0, le=86_400)

    def validate(self) -> EngineLimits:
        check_ranges(self, "engine limits")
        return self


def job_size(kwargs: dict[str, Any], config: Any) -> tuple[int, int]:
    """(sequences decoded at once, tokens in flight) of a `generate` call: `generate` decodes at most
    batch_size (default 32) of its samples at a time."""
    n = int(kwargs.get("num_samples", 1))
    condition = kwargs.get("condition")
    length = condition.length if condition is not None else kwargs.get("length") or config.block_size
    at_once = min(n, int(kwargs.get("batch_size") or GenerationSettings.batch_size))
    return at_once, at_once * int(length)


@dataclass(eq=False)
class Job:
    """One request: `generate` keyword arguments (the model is the engine's), its size, and where
    its events go: ``on_event("step", Revealed)`` after each step (if `steps`), then ``("done",
    GenerationResult)`` (or what `work` returns) or ``("error", (status, message))``, called from the
    engine's thread (so they must not block). `timeout`: this job's own deadline in seconds (at most
    the engine's). After `submit`, `deadline` and `queue_deadline` are its absolute times
    (`time.monotonic`); a 503 error comes with `retry_after` (seconds)."""

    kwargs: dict[str, Any]
    sequences: int
    tokens: int
    on_event: Callable[[str, Any], None] = lambda kind, payload: None
    steps: bool = True  # report every step ("step" events); off, a job costs a little less per step
    timeout: float | None = None
    work: Callable[..., Any] | None = None  # called instead of `generate`, with the same arguments (serve.openai)
    id: int = field(default_factory=itertools.count(1).__next__)
    cancelled: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    result: GenerationResult | None = None
    error: tuple[int, str] | None = None
    retry_after: int | None = None
    submitted: float | None = None
    started: float | None = None
    deadline: float | None = None
    queue_deadline: float | None = None
    reason: tuple[int, str] = GONE  # the error a cancelled job ends with
    outcome: str = "cancelled"  # how it ended, as the engine counts it: "finished", "timed_out", "expired", ...

    def cancel(self, reason: tuple[int, str] = GONE, outcome: str = "cancelled") -> None:
        """Stop this job at its next step with the error `reason` (nothing happens if it has finished
        or was cancelled already). Takes no lock: callable from any thread, a signal handler included."""
        if not self.cancelled.is_set():
            self.reason, self.outcome = reason, outcome
            self.cancelled.set()
