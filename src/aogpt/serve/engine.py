"""The serving engine: continuous batching of exact any-order decoding, usable without HTTP.

Each admitted request (a `Job`) runs the library's own `aogpt.generate` in a greenlet of its own
(a coroutine that can pause inside ordinary function calls), on a `SharedModel`: a stand-in for the
model whose ``forward_slots`` parks the call and hands control back to the engine. The engine's
loop, one thread, resumes every running job until each has parked its next forward (or finished),
then runs all parked calls as one forward (`aogpt.serve.batching.run_together`) and hands each job
its logits. So requests that arrive while others decode join at the next step, finished ones simply
stop calling, and no step waits for anyone. Sampling, plans, orders, speculative drafts and adaptive
choices all happen in the request's own `generate`, with its own random streams, exactly as offline:
only the forward is shared, and it is batch-invariant, so a seeded request gets the tokens
`aogpt.generate(model, seed=...)` gives, alone or among others (docs/serve.md). Greenlets rather than
threads: the jobs' Python work between forwards runs back to back in one thread, with no lock
hand-offs and no contention for the interpreter.

Admission is first come, first served under three limits (`EngineLimits`): sequences decoded at
once, tokens in flight (sequences x length over running requests) and a bounded waiting queue;
`submit` refuses a request that would overflow the queue (`Busy`, with a retry estimate) or that
comes after `drain` (`Draining`). `Job.cancel` (a client that went away) ends the job at the next
step: `Cancelled` is raised where its `generate` waits for its forward.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import greenlet
import torch

from aogpt.errors import AOGPTError
from aogpt.generation.generate import GenerationResult, generate
from aogpt.generation.reveal import Revealed
from aogpt.generation.settings import GenerationSettings
from aogpt.inference import for_inference
from aogpt.kv_cache import KVCache
from aogpt.serve.batching import ForwardCall, row_invariant, run_alone, run_together
from aogpt.validation import bounded, check_ranges

log = logging.getLogger("aogpt.serve")


class Cancelled(Exception):
    """The job was cancelled (its client went away, or the server stopped) before it finished."""


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
    sequences times their length, over the running requests; max_queue: requests waiting beyond."""

    max_sequences: int = bounded(32, ge=1, le=4096, integer=True)
    max_tokens_in_flight: int = bounded(16384, ge=1, le=2**24, integer=True)
    max_queue: int = bounded(64, ge=0, le=100_000, integer=True)

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
    GenerationResult)`` or ``("error", (status, message))``, called from the engine's thread (so they
    must not block)."""

    kwargs: dict[str, Any]
    sequences: int
    tokens: int
    on_event: Callable[[str, Any], None] = lambda kind, payload: None
    steps: bool = True  # report every step ("step" events); off, a job costs a little less per step
    id: int = field(default_factory=itertools.count(1).__next__)
    cancelled: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    result: GenerationResult | None = None
    error: tuple[int, str] | None = None
    started: float | None = None
    _engine: Engine | None = None

    def cancel(self) -> None:
        """Stop this job at its next step (nothing happens if it has finished)."""
        self.cancelled.set()
        if self._engine is not None:
            self._engine._cancel(self)


class SharedModel:
    """What a job's `generate` sees as its model: the engine's model for everything but the forward,
    which waits for the engine's next batched step."""

    def __init__(self, engine: Engine, job: Job):
        self._engine, self._job = engine, job
        self.config = engine.model.config
        self.training = False

    def parameters(self):
        return self._engine.model.parameters()

    def eval(self) -> SharedModel:
        return self

    def train(self, mode: bool = True) -> SharedModel:
        return self

    def conditions(self):
        return self._engine.conditions

    def setup_cache(self, batch: int, capacity: int | None = None, attention: str = "sdpa") -> KVCache:
        """`Transformer.setup_cache`, with the adaLN tables computed once for all requests."""
        cfg, p = self.config, next(self.parameters())
        return KVCache(cfg.n_layer, batch, cfg.n_head, capacity or cfg.block_size + 2, cfg.head_dim, p.device,
                       p.dtype, self._engine.conditions, attention)

    def forward_slots(self, tokens: torch.Tensor, pos: torch.Tensor, target: torch.Tensor | None = None, *,
                      attn_mask: torch.Tensor | None = None, cache: KVCache | None = None, cache_pos: Any = None,
                      select: torch.Tensor | None = None, conditions: Any = None) -> torch.Tensor:
        call = ForwardCall(tokens, pos, target, attn_mask, cache, cache_pos, select, conditions)
        return self._engine._forward(self._job, call)


class Engine:
    """Continuous batching over one model (module docstring). Use as a context manager, or call
    `start` and `stop`; `submit` jobs, or `run` one and wait for its result. `threads`: torch's
    intra-op threads for the whole process (None: leave them)."""

    def __init__(self, model: torch.nn.Module, limits: EngineLimits | None = None, threads: int | None = None):
        if threads:
            torch.set_num_threads(threads)
        self.model = model.eval().requires_grad_(False)
        self.limits = (limits or EngineLimits()).validate()
        self.runner = for_inference(self.model, rows_hint=self.limits.max_sequences)
        with torch.inference_mode():
            self.conditions = self.model.conditions()
        self.row_invariant = row_invariant(self.runner)
        if not self.row_invariant:
            log.warning("this machine's matrix kernels round a row differently with the number of rows: batched "
                        "requests may differ from offline generate() in rare tokens")
        self._lock = threading.Condition()  # guards the queue, the running set, the flags, and wakes the loop
        self._waiting: collections.deque[Job] = collections.deque()
        self._running: dict[Job, greenlet.greenlet] = {}
        self._parked: list[tuple[Job, ForwardCall]] = []  # the loop's own: touched only in its thread
        self._draining = self._stopping = False
        self._loop: threading.Thread | None = None
        self._hub: greenlet.greenlet | None = None  # the loop's greenlet, where parked jobs switch to
        self._job_seconds = 1.0  # running mean of a job's time, for Retry-After
        self.stats = {"steps": 0, "rows": 0, "requests": 0, "finished": 0, "cancelled": 0, "failed": 0, "refused": 0}

    # ----------------------------------------------------------------- lifecycle
    @property
    def draining(self) -> bool:
        """Whether the engine has stopped taking requests (`drain`)."""
        return self._draining

    def start(self) -> Engine:
        if self._loop is None:
            self._loop = threading.Thread(target=self._run_loop, name="aogpt-engine", daemon=True)
            self._loop.start()
        return self

    def drain(self) -> None:
        """Take no new requests; those running or waiting still finish."""
        with self._lock:
            self._draining = True

    def stop(self, timeout: float | None = None) -> None:
        """Drain, wait up to `timeout` seconds for the accepted requests, cancel what is left, stop."""
        self.drain()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while (self._running or self._waiting) and self._loop is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._lock.wait(left)
            leftover = [*self._running, *self._waiting]
        for job in leftover:
            job.cancel()
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._loop is not None:
            self._loop.join()
            self._loop = None

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop(timeout=0 if exc[0] is not None else None)

    # ----------------------------------------------------------------- requests
    def submit(self, job: Job) -> Job:
        """Queue `job` (raises `Busy` or `Draining`, or `AOGPTError` for a job larger than the limits);
        it starts at the next step the limits allow."""
        lim = self.limits
        if job.sequences > lim.max_sequences or job.tokens > lim.max_tokens_in_flight:
            raise AOGPTError(f"this request decodes {job.sequences} sequences and {job.tokens} tokens at once, more "
                             f"than this server takes ({lim.max_sequences} sequences, {lim.max_tokens_in_flight} "
                             "tokens in flight)", "lower n or max_tokens")
        with self._lock:
            if self._draining:
                raise Draining()
            must_wait = bool(self._waiting) or not self._fits(job)
            if must_wait and len(self._waiting) >= lim.max_queue:
                self.stats["refused"] += 1
                raise Busy(max(1, round(self._job_seconds * (1 + len(self._waiting)) / max(1, len(self._running)))))
            job._engine = self
            self.stats["requests"] += 1
            self._waiting.append(job)
            self._lock.notify_all()
        return job

    def run(self, timeout: float | None = None, **kwargs: Any) -> GenerationResult:
        """Submit one request with these `generate` arguments and wait for its result (Python use)."""
        job = self.submit(Job(kwargs, *job_size(kwargs, self.model.config)))
        if not job.finished.wait(timeout):
            job.cancel()
            raise TimeoutError(f"the request took longer than {timeout} s")
        if job.error is not None:
            raise AOGPTError(job.error[1], "fix the request") if job.error[0] == 400 else RuntimeError(job.error[1])
        return job.result

    def load(self) -> dict[str, int]:
        """What the engine holds now: requests running and waiting, sequences and tokens in flight."""
        with self._lock:
            return {"running": len(self._running), "waiting": len(self._waiting),
                    "sequences": sum(j.sequences for j in self._running),
                    "tokens_in_flight": sum(j.tokens for j in self._running)}

    def _fits(self, job: Job) -> bool:
        if not self._running:
            return True
        return (sum(j.sequences for j in self._running) + job.sequences <= self.limits.max_sequences
                and sum(j.tokens for j in self._running) + job.tokens <= self.limits.max_tokens_in_flight)

    def _cancel(self, job: Job) -> None:
        with self._lock:
            self._lock.notify_all()  # the loop ends it at its next step

    def _finish(self, job: Job, error: tuple[int, str] | None) -> None:
        """Record how a job ended and tell its owner (lock held)."""
        if job.finished.is_set():
            return
        if job.result is not None:
            kind = "finished"
            self._job_seconds = 0.8 * self._job_seconds + 0.2 * (time.monotonic() - (job.started or 0.0))
        elif error is not None:
            kind = "failed"
        else:
            kind = "cancelled"
            error = (503, "the request was cancelled (its client went away, or the server stopped)")
        self.stats[kind] += 1
        job.error = None if kind == "finished" else error
        job.finished.set()
        self._lock.notify_all()
        try:
            job.on_event(*(("done", job.result) if kind == "finished" else ("error", job.error)))
        except Exception:  # whoever listened has gone (a closed event loop): the engine goes on
            log.warning("request %d ended but nobody took its result:\n%s", job.id, traceback.format_exc())

    # ----------------------------------------------------------------- the loop (one thread)
    def _forward(self, job: Job, call: ForwardCall) -> torch.Tensor:
        """Called inside a job's greenlet: park the call and wait (switched out) for the step's logits."""
        if job.cancelled.is_set():
            raise Cancelled()
        self._parked.append((job, call))
        return self._hub.switch()

    def _run_job(self, job: Job) -> None:
        """A job's greenlet: its whole `generate` call."""
        error: tuple[int, str] | None = None
        try:
            def on_step(revealed: Revealed) -> None:
                job.on_event("step", revealed)

            job.result = generate(SharedModel(self, job), **job.kwargs, prepack=False, compile=False,
                                  on_step=on_step if job.steps else None)
        except Cancelled:
            pass
        except AOGPTError as exc:
            error = (400, str(exc))
        except Exception:  # a bug: the traceback goes to the server's log, never to the client
            log.error("request %d failed:\n%s", job.id, traceback.format_exc())
            error = (500, "internal error while generating (the server's log has the details)")
        with self._lock:
            self._running.pop(job, None)
            self._finish(job, error)

    def _admit(self) -> list[Job]:
        """Waiting jobs that start now, first come first served, while the limits allow; cancelled
        waiting ones are dropped."""
        started = []
        with self._lock:
            for job in [j for j in self._waiting if j.cancelled.is_set()]:
                self._waiting.remove(job)
                self._finish(job, None)
            while self._waiting and self._fits(self._waiting[0]):
                job = self._waiting.popleft()
                job.started = time.monotonic()
                self._running[job] = greenlet.greenlet(functools.partial(self._run_job, job), self._hub)
                started.append(job)
        return started

    def _idle(self) -> bool:
        """Wait for work; False once the engine is stopping and has nothing left."""
        with self._lock:
            while not self._waiting and not self._running:
                if self._stopping:
                    return False
                self._lock.wait()
            return True

    def _run_loop(self) -> None:
        self._hub = greenlet.getcurrent()
        with torch.inference_mode():
            while self._idle():
                for job in self._admit():  # each runs until it parks its first forward (or ends)
                    self._running[job].switch()
                batch, self._parked = self._parked, []
                if not batch:  # running jobs but nothing parked: cannot happen, but never spin
                    time.sleep(0.001)
                    continue
                results = self._step(batch)
                for (job, _), result in zip(batch, results, strict=True):
                    g = self._running.get(job)
                    if g is None:
                        continue
                    if job.cancelled.is_set():
                        g.throw(Cancelled())
                    elif isinstance(result, BaseException):
                        g.throw(result)
                    else:
                        g.switch(result)  # runs until its next forward is parked, or it ends

    def _step(self, batch: list[tuple[Job, ForwardCall]]) -> list[Any]:
        """Run one step's calls: those with a KV cache stacked into one forward, the others alone.
        Returns each call's logits, or the exception that its job is to see."""
        live = [i for i, (job, _) in enumerate(batch) if not job.cancelled.is_set()]
        results: list[Any] = [Cancelled()] * len(batch)
        stacked = [i for i in live if batch[i][1].cache is not None and batch[i][1].conditions is None]
        try:
            if stacked:
                for i, logits in zip(stacked, run_together(self.runner, [batch[i][1] for i in stacked],
                                                           self.conditions), strict=True):
                    results[i] = logits
            for i in live:
                if i not in stacked:
                    results[i] = run_alone(self.runner, batch[i][1])
        except Exception as exc:  # handed to the jobs, which report it
            results = [exc] * len(batch)
        self.stats["steps"] += 1
        self.stats["rows"] += sum(call.tokens.numel() for _, call in batch)
        return results
