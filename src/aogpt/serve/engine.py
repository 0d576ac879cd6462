"""The serving engine: continuous batching of exact any-order decoding, usable without HTTP.

Each admitted request (a `Job`) runs the library's own `aogpt.generate` in a greenlet of its own
(a coroutine that can pause inside ordinary function calls), on a `SharedModel`: a stand-in for the
model whose ``forward_slots`` parks the call and hands control back to the engine. The engine's
loop, one thread, resumes every running job until each has parked its next forward (or finished),
then runs all parked calls as one forward (`aogpt.serve.batching.run_together`) and hands each job
its logits; the jobs then park their token draws (`SharedModel.draw_tokens`), which the engine makes
in one call per sampling configuration (`aogpt.serve.batching.draw_together`). So requests that
arrive while others decode join at the next step, finished ones simply stop calling, and no step
waits for anyone. Plans, orders, each draw's uniforms, speculative drafts and adaptive choices all
happen in the request's own `generate`, with its own random streams, exactly as offline: only the
forward and the draws are shared, and both are batch-invariant (row for row what each request
computes alone), so a seeded request gets the tokens `aogpt.generate(model, seed=...)` gives, alone
or among others (docs/serve.md). Greenlets rather than
threads: the jobs' Python work between forwards runs back to back in one thread, with no lock
hand-offs and no contention for the interpreter.

Admission is first come, first served under three limits (`EngineLimits`): sequences decoded at
once, tokens in flight (sequences x length over running requests) and a bounded waiting queue;
`submit` refuses a request that would overflow the queue (`Busy`, with a retry estimate) or that
comes after `drain` (`Draining`). Deadlines shed load instead of letting it wait: a job that has not
started within its queue deadline ends with 503 and a retry estimate, a running job past its
deadline is cancelled, and after `drain(timeout)` whatever is left at that deadline is cancelled.
`Job.cancel` (a client that went away) ends the job at the next step: `Cancelled` is raised where
its `generate` waits for its forward.

Nothing the engine does while holding its lock can block (a job's `on_event` is called after the
lock is released), and `load` and `health` read a snapshot without taking the lock at all, so the
HTTP side can always report on the engine, even while a step runs. `health` says whether the loop
made progress (a step, an admission or a finish) in the last `stall_after` seconds while it had work.

Memory: every request allocates its own KV cache and step tensors, of sizes that vary with the
request, and glibc's allocator keeps much of what is freed instead of returning it (the more so
with the raised thresholds of `aogpt.allocator`): under a sustained mix the server's memory crept up
for minutes (1,048 MiB after one minute, 1,200 MiB after ten, while the number of Python objects
stayed flat). So the loop hands freed memory back (`malloc_trim`) every `TRIM_EVERY` seconds, which
takes a few tens of milliseconds (docs/serve.md has the soak's figures with it).
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import functools
import logging
import threading
import time
import traceback
from typing import Any

import greenlet
import torch

from aogpt.decode.runner import describe_kernels
from aogpt.errors import AOGPTError
from aogpt.generation.generate import GenerationResult, generate
from aogpt.generation.reveal import Revealed
from aogpt.inference import for_inference
from aogpt.kv_cache import KVCache
from aogpt.sampling import SamplingConfig, sample_tokens
from aogpt.serve.batching import DrawCall, ForwardCall, draw_together, row_invariant, run_alone, run_together
from aogpt.serve.jobs import (
    GONE,
    SHUTDOWN,
    Busy,
    Cancelled,
    Draining,
    EngineLimits,
    Job,
    deadline_error,
    job_size,
    queue_error,
)

__all__ = ["GONE", "SHUTDOWN", "Busy", "Cancelled", "Draining", "Engine", "EngineLimits", "Job", "SharedModel",
           "job_size"]

log = logging.getLogger("aogpt.serve")
TRIM_EVERY = 10.0  # seconds between hand-backs of freed memory to the system (module docstring)


def _memory_trimmer() -> Any:
    """glibc's ``malloc_trim`` (returns freed heap memory to the system), or None where there is none."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError, TypeError):
        return None


class SharedModel:
    """What a job's `generate` sees as its model: the engine's model for everything but the forward,
    which waits for the engine's next batched step."""

    def __init__(self, engine: Engine, job: Job):
        self._engine, self._job = engine, job
        self.config = engine.model.config
        self.training = False
        self.kernels = engine.runner.kernels  # the decode path's measured cache kernels and layout, as offline

    def parameters(self):
        return self._engine.model.parameters()

    def eval(self) -> SharedModel:
        return self

    def train(self, mode: bool = True) -> SharedModel:
        return self

    def conditions(self):
        return self._engine.conditions

    def setup_cache(self, batch: int, capacity: int | None = None, attention: str = "auto") -> KVCache:
        """The engine's decode runner's cache (`Transformer.setup_cache`), with the adaLN tables
        computed once for all requests."""
        return self._engine.runner.setup_cache(batch, capacity, attention, conditions=self._engine.conditions)

    def forward_slots(self, tokens: torch.Tensor, pos: torch.Tensor, target: torch.Tensor | None = None, *,
                      attn_mask: torch.Tensor | None = None, cache: KVCache | None = None, cache_pos: Any = None,
                      select: torch.Tensor | None = None, conditions: Any = None,
                      gate: torch.Tensor | None = None) -> torch.Tensor:
        call = ForwardCall(tokens, pos, target, attn_mask, cache, cache_pos, select, conditions, gate=gate)
        return self._engine._park(self._job, call, self._engine._parked)

    def draw_tokens(self, logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None = None,
                    uniforms: torch.Tensor | None = None) -> torch.Tensor:
        """`aogpt.sampling.sample_tokens`, drawn with the other requests' draws of this step
        (`aogpt.serve.batching.draw_together`); one from a torch generator is drawn here."""
        if generator is not None:
            return sample_tokens(logits, cfg, generator, uniforms)
        return self._engine._park(self._job, DrawCall(logits, cfg, uniforms), self._engine._drawing)


class Engine:
    """Continuous batching over one model (module docstring). Use as a context manager, or call
    `start` and `stop`; `submit` jobs, or `run` one and wait for its result. `threads`: torch's
    intra-op threads for the whole process (None: leave them)."""

    def __init__(self, model: torch.nn.Module, limits: EngineLimits | None = None, threads: int | None = None):
        if threads:
            torch.set_num_threads(threads)
        self.model = model.eval().requires_grad_(False)
        self.limits = (limits or EngineLimits()).validate()
        self.runner = for_inference(self.model)
        with torch.inference_mode():
            self.conditions = self.model.conditions()
        self.row_invariant = row_invariant(self.runner)
        self.decode_kernels = describe_kernels(self.runner)  # measured in this process
        if not self.row_invariant:
            log.warning("this machine's matrix kernels round a row differently with the number of rows: batched "
                        "requests may differ from offline generate() in rare tokens")
        self._lock = threading.Condition()  # guards the queue, the running set, the flags, and wakes the loop
        self._waiting: collections.deque[Job] = collections.deque()
        self._running: dict[Job, greenlet.greenlet] = {}
        self._parked: list[tuple[Job, ForwardCall]] = []  # the loop's own: touched only in its thread
        self._drawing: list[tuple[Job, DrawCall]] = []  # likewise: draws waiting after a step
        self._draining = self._stopping = False
        self._drain_deadline: float | None = None
        self._loop: threading.Thread | None = None
        self._failed = False  # the loop itself died (a bug): `health` says "stopped"
        self._hub: greenlet.greenlet | None = None  # the loop's greenlet, where parked jobs switch to
        self._job_seconds = 1.0  # running mean of a job's time, for Retry-After
        self._load = (0, 0, 0, 0)  # running, waiting, sequences, tokens in flight: replaced whole, read without lock
        self._progress_at = time.monotonic()  # the loop's last step, admission or finish
        self.longest_stall = 0.0  # the longest time, with work to do, between two signs of progress
        self._trim, self._trimmed_at = _memory_trimmer(), time.monotonic()
        self.stats = {"steps": 0, "rows": 0, "requests": 0, "finished": 0, "cancelled": 0, "timed_out": 0,
                      "expired": 0, "failed": 0, "refused": 0}

    # ----------------------------------------------------------------- lifecycle
    @property
    def draining(self) -> bool:
        """Whether the engine has stopped taking requests (`drain`)."""
        return self._draining

    @property
    def drain_deadline(self) -> float | None:
        """When (`time.monotonic`) the requests still running after `drain(timeout)` are cancelled."""
        return self._drain_deadline

    def start(self) -> Engine:
        if self._loop is None:
            self._loop = threading.Thread(target=self._run_loop, name="aogpt-engine", daemon=True)
            self._loop.start()
        return self

    def drain(self, timeout: float | None = None) -> None:
        """Take no new requests; those running or waiting still finish, or, with `timeout`, are
        cancelled when that many seconds have passed (a second call never extends the first's)."""
        with self._lock:
            self._draining = True
            if timeout is not None:
                deadline = time.monotonic() + timeout
                self._drain_deadline = min(deadline, self._drain_deadline or deadline)
            self._lock.notify_all()

    def stop(self, timeout: float | None = None) -> None:
        """Drain, wait up to `timeout` seconds (or until the drain deadline) for the accepted requests,
        cancel what is left, stop."""
        self.drain(timeout)
        with self._lock:
            while (self._running or self._waiting) and self._loop is not None and self._loop.is_alive():
                left = None if self._drain_deadline is None else self._drain_deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._lock.wait(left)
            leftover = [*self._running, *self._waiting]
        for job in leftover:
            job.cancel(SHUTDOWN)
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._loop is not None:
            bound = None if self._drain_deadline is None else max(0.0, self._drain_deadline - time.monotonic()) + 5
            self._loop.join(bound)  # a loop stuck in a step must not hold a bounded shutdown up (it is a daemon)
            if self._loop.is_alive():
                log.error("the engine's loop did not stop within 5 s of the drain deadline; leaving it")
            self._loop = None

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop(timeout=0 if exc[0] is not None else None)

    # ----------------------------------------------------------------- requests
    def submit(self, job: Job) -> Job:
        """Queue `job` (raises `Busy` or `Draining`, or `AOGPTError` for a job larger than the limits);
        it starts at the next step the limits allow, or ends with 503 at its queue deadline."""
        lim = self.limits
        if job.sequences > lim.max_sequences or job.tokens > lim.max_tokens_in_flight:
            raise AOGPTError(f"this request decodes {job.sequences} sequences and {job.tokens} tokens at once, more "
                             f"than this server takes ({lim.max_sequences} sequences, {lim.max_tokens_in_flight} "
                             "tokens in flight)", "lower n or max_tokens")
        now = time.monotonic()
        timeout = min((t for t in (job.timeout, lim.timeout) if t is not None), default=None)
        queue_timeout = min((t for t in (lim.queue_timeout, timeout) if t is not None), default=None)
        with self._lock:
            if self._draining:
                raise Draining()
            must_wait = bool(self._waiting) or not self._fits(job)
            if must_wait and len(self._waiting) >= lim.max_queue:
                self.stats["refused"] += 1
                raise Busy(self._retry_after())
            if not self._running and not self._waiting:
                self._progress_at = now  # idle time is not a stall
            job.submitted = now
            job.deadline = None if timeout is None else now + timeout
            job.queue_deadline = None if queue_timeout is None else now + queue_timeout
            self.stats["requests"] += 1
            self._waiting.append(job)
            self._update_load()
            self._lock.notify_all()
        return job

    def run(self, timeout: float | None = None, **kwargs: Any) -> GenerationResult:
        """Submit one request with these `generate` arguments and wait for its result (Python use)."""
        job = self.submit(Job(kwargs, *job_size(kwargs, self.model.config), timeout=timeout))
        if not job.finished.wait(None if job.deadline is None else job.deadline - time.monotonic() + 5):
            job.cancel()
            raise TimeoutError(f"the request took longer than {timeout} s")
        if job.error is not None:
            if job.outcome in ("timed_out", "expired"):
                raise TimeoutError(job.error[1])
            raise AOGPTError(job.error[1], "fix the request") if job.error[0] == 400 else RuntimeError(job.error[1])
        return job.result

    def load(self) -> dict[str, int]:
        """What the engine holds now: requests running and waiting, sequences and tokens in flight
        (a snapshot: no lock is taken)."""
        running, waiting, sequences, tokens = self._load
        return {"running": running, "waiting": waiting, "sequences": sequences, "tokens_in_flight": tokens}

    def health(self) -> dict[str, Any]:
        """Whether the loop is alive and making progress, without taking the lock: `engine` is "idle"
        (nothing to do), "busy" (progress within the last `stall_after` seconds), "stuck" (work but no
        progress for longer) or "stopped" (the loop is not running)."""
        running, waiting, _, _ = self._load
        since = time.monotonic() - self._progress_at if running or waiting else 0.0
        alive = self._loop is not None and self._loop.is_alive() and not self._failed
        state = ("stopped" if not alive else "idle" if not (running or waiting)
                 else "stuck" if since > self.limits.stall_after else "busy")
        return {"engine": state, "seconds_since_progress": round(since, 3), "stall_after": self.limits.stall_after,
                "longest_stall": round(max(self.longest_stall, since), 3)}

    def _retry_after(self) -> int:
        """Seconds until a slot is likely free: the recent time per request, times the queue ahead."""
        running, waiting = len(self._running), len(self._waiting)
        return max(1, round(self._job_seconds * (1 + waiting) / max(1, running)))

    def _fits(self, job: Job) -> bool:
        if not self._running:
            return True
        return (sum(j.sequences for j in self._running) + job.sequences <= self.limits.max_sequences
                and sum(j.tokens for j in self._running) + job.tokens <= self.limits.max_tokens_in_flight)

    def _update_load(self) -> None:
        """Refresh the lock-free snapshot (lock held)."""
        self._load = (len(self._running), len(self._waiting), sum(j.sequences for j in self._running),
                      sum(j.tokens for j in self._running))

    def _progress(self) -> None:
        now = time.monotonic()
        self.longest_stall = max(self.longest_stall, now - self._progress_at)
        self._progress_at = now

    def _settle(self, job: Job, error: tuple[int, str] | None, outcome: str = "failed") -> tuple[str, Any] | None:
        """Record how a job ended (lock held): its result, or `error` (counted as `outcome`), or, with
        neither, its cancellation. Returns the event to hand its owner (None if it had ended)."""
        if job.finished.is_set():
            return None
        if job.result is not None:
            outcome = "finished"
            self._job_seconds = 0.8 * self._job_seconds + 0.2 * (time.monotonic() - (job.started or 0.0))
        elif error is None:
            error, outcome = job.reason, job.outcome
        self.stats[outcome] += 1
        job.outcome = outcome
        job.error = None if outcome == "finished" else error
        if job.error is not None and job.error[0] == 503:
            job.retry_after = self._retry_after()
        job.finished.set()
        self._lock.notify_all()
        return ("done", job.result) if outcome == "finished" else ("error", job.error)

    def _deliver(self, job: Job, event: tuple[str, Any] | None) -> None:
        """Hand a job's last event to its owner (lock not held: a listener cannot stall the engine)."""
        if event is None:
            return
        try:
            job.on_event(*event)
        except Exception:  # whoever listened has gone (a closed event loop): the engine goes on
            log.warning("request %d ended but nobody took its result:\n%s", job.id, traceback.format_exc())

    # ----------------------------------------------------------------- the loop (one thread)
    def _park(self, job: Job, call: ForwardCall | DrawCall, where: list[tuple[Job, Any]]) -> Any:
        """Called inside a job's greenlet: park the call (a forward, or a draw after one) and wait,
        switched out, for its result."""
        if job.cancelled.is_set():
            raise Cancelled()
        where.append((job, call))
        return self._hub.switch()

    def _run_job(self, job: Job) -> None:
        """A job's greenlet: its whole `generate` call."""
        error: tuple[int, str] | None = None
        try:
            def on_step(revealed: Revealed) -> None:
                job.on_event("step", revealed)

            job.result = (job.work or generate)(SharedModel(self, job), **job.kwargs, prepack=False, compile=False,
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
            self._update_load()
            event = self._settle(job, error)
        self._deliver(job, event)

    def _expire(self) -> None:
        """Shed what is out of time: waiting jobs past their queue deadline (or cancelled) end now;
        running jobs past their deadline, and everything once the drain deadline has passed, are
        cancelled (they stop at this step)."""
        now = time.monotonic()
        over = self._drain_deadline is not None and now >= self._drain_deadline
        ended: list[tuple[Job, tuple[str, Any] | None]] = []
        with self._lock:
            for job in list(self._waiting):
                if over:
                    job.cancel(SHUTDOWN)
                if job.cancelled.is_set():
                    error, outcome = None, "cancelled"
                elif job.queue_deadline is not None and now >= job.queue_deadline:
                    error, outcome = queue_error(job.queue_deadline - job.submitted), "expired"
                else:
                    continue
                self._waiting.remove(job)
                ended.append((job, self._settle(job, error, outcome)))
            if ended:
                self._update_load()
            for job in self._running:
                if over:
                    job.cancel(SHUTDOWN)
                elif job.deadline is not None and now >= job.deadline:
                    job.cancel(deadline_error(job.deadline - job.submitted), "timed_out")
        for job, event in ended:
            self._deliver(job, event)
        if ended:
            self._progress()

    def _admit(self) -> list[Job]:
        """Waiting jobs that start now, first come first served, while the limits allow."""
        started = []
        with self._lock:
            while self._waiting and self._fits(self._waiting[0]):
                job = self._waiting.popleft()
                job.started = time.monotonic()
                self._running[job] = greenlet.greenlet(functools.partial(self._run_job, job), self._hub)
                started.append(job)
            if started:
                self._update_load()
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
        try:
            with torch.inference_mode():
                while self._idle():
                    self._expire()
                    started = self._admit()
                    for job in started:  # each runs until it parks its first forward (or ends)
                        self._running[job].switch()
                    if started:
                        self._progress()
                    batch, self._parked = self._parked, []
                    if not batch:  # nothing parked (every job ended, or was shed): look again
                        time.sleep(0.001)
                        continue
                    results = self._step(batch)
                    self._progress()
                    if self._trim is not None and self._progress_at - self._trimmed_at >= TRIM_EVERY:
                        self._trim(0)
                        self._trimmed_at = time.monotonic()
                    self._resume(batch, results)  # each runs until it parks its draw or next forward, or ends
                    while self._drawing:  # the step's token draws, all at once
                        draws, self._drawing = self._drawing, []
                        self._resume(draws, draw_together([call for _, call in draws]))
        except BaseException:  # a bug in the loop itself: every request gets an answer, and health says so
            self._failed = True
            log.error("the engine's loop stopped:\n%s", traceback.format_exc())
            with self._lock:
                jobs = [*self._running, *self._waiting]
                self._running.clear()
                self._waiting.clear()
                self._update_load()
                error = (500, "internal error: the server's engine stopped (its log has the details)")
                events = [(job, self._settle(job, error)) for job in jobs]
            for job, event in events:
                self._deliver(job, event)

    def _resume(self, parked: list[tuple[Job, Any]], results: list[Any]) -> None:
        """Hand each parked job its result (or the exception it is to see) and let it run on."""
        for (job, _), result in zip(parked, results, strict=True):
            g = self._running.get(job)
            if g is None:
                continue
            if job.cancelled.is_set():
                g.throw(Cancelled())
            elif isinstance(result, BaseException):
                g.throw(result)
            else:
                g.switch(result)

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
