"""The HTTP face of the engine (FastAPI): OpenAI-style completions, streaming by server-sent events,
the model list, a health report and the page at ``/``.

Every failure a client can see is one JSON line in OpenAI's error shape, ``{"error": {"message":
..., "type": ..., "param": ..., "code": ...}}``: 400 for a malformed body or a value out of range
(pydantic's reason, or the library's own `AOGPTError` message), 404 for an unknown model or path,
503 with ``Retry-After`` when the server sheds the request (the queue is full, it could not start
within its queue deadline, it ran past its deadline, or the server is shutting down), 500 (never a
traceback: that goes to the server's log) for a bug. A client that goes away cancels its request
at the next step.

The event loop never waits on the engine: handing a request over, cancelling it and reading the
engine's state take no lock the engine can hold for long (`/health` takes none), the engine's events
come back through ``call_soon_threadsafe``, and every wait for them is bounded by the request's
deadline (plus `BACKSTOP`): if the engine ever failed to answer, the client would still get a 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
import time
import uuid
from collections.abc import Callable
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from aogpt.errors import AOGPTError
from aogpt.generation.length import DRAWS as LENGTH_DRAWS
from aogpt.serve.engine import Busy, Draining, Engine, Job, job_size
from aogpt.serve.jobs import deadline_error
from aogpt.serve.openai import Completed, Part, complete
from aogpt.serve.openai import body as response_body
from aogpt.serve.protocol import (
    Choice,
    CompletionRequest,
    Plan,
    choices_for,
    chunk,
    condition_of,
    draw_request_seed,
    plan_prompt,
    prompts,
    stops,
)

log = logging.getLogger("aogpt.serve")
DISCONNECT_POLL = 0.25  # seconds between checks that a waiting (non-streaming) client is still there
BACKSTOP = 2.0  # seconds past a request's deadline after which the app answers 503 itself
BIG_PROMPT = 4096  # prompts longer than this (characters or ids) are tokenized off the event loop
ERROR_TYPES = {"expired": "server_busy", "timed_out": "timeout", "cancelled": "server_busy"}


def error_response(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    message = " ".join(str(message).split())  # one line, whatever the source said
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    err = exc.errors()[0] if exc.errors() else {"msg": "invalid request", "loc": ()}
    if err.get("type") == "json_invalid" or tuple(err.get("loc", ())) == ("body",):
        return ("the body is not a JSON object (send one, with content-type application/json, e.g. "
                "{\"prompt\": \"To be\"})"), None
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    field = ".".join(loc) if loc else None
    msg = err.get("msg", "invalid value")
    if err.get("type") == "extra_forbidden":
        msg = "unknown field (see docs/serve.md for the fields this server takes)"
    elif err.get("type") == "missing":
        msg = "missing"
    return (f"{field}: {msg}" if field else f"the body is not a completion request: {msg}"), field


def create_app(engine: Engine, tokenizer: Any, model_name: str, max_samples: int = 16,
               own_engine: bool = True, dropped_lines: Callable[[], int] | None = None,
               seed: int | None = None) -> FastAPI:
    """The app serving `engine`. With `own_engine`, the app starts the engine and stops it (after the
    running requests finish, or at the engine's drain deadline) with its lifespan. `dropped_lines`:
    how many log lines the server's output dropped (reported by /health). `seed`: where the seeds of
    requests that bring none come from -- the k-th such request gets the k-th seed drawn from it, so a
    server restarted with the same seed answers the same unseeded requests, sent in the same order,
    alike (None: a fresh random seed each). Every response names the seed it used."""
    unseeded = random.Random(seed) if seed is not None else None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if own_engine:
            engine.start()
        yield
        if own_engine:
            await asyncio.to_thread(engine.stop)

    app = FastAPI(title="aogpt", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    created = int(time.time())
    config = engine.model.config
    lim = engine.limits
    limits = {"max_sequences": lim.max_sequences, "max_tokens_in_flight": lim.max_tokens_in_flight,
              "max_queue": lim.max_queue, "timeout": lim.timeout, "queue_timeout": lim.queue_timeout,
              "max_samples": max_samples}

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, field = _validation_message(exc)
        return error_response(400, message, param=field)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(exc.status_code, exc.detail, kind, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(500, "internal error (the server's log has the details)", "server_error")

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(resources.files("aogpt.serve").joinpath("static/index.html").read_text("utf-8"))

    @app.get("/health")
    async def health() -> JSONResponse:
        """Liveness without the engine's lock: 200 while the engine is idle or making progress, 503
        when it has work but made no progress for `stall_after` seconds, or its loop stopped."""
        state = engine.health()
        status = "draining" if engine.draining else "ok"
        if state["engine"] in ("stuck", "stopped"):
            status = state["engine"]
        body = {"status": status, "model": model_name, **engine.load(), **state, "limits": limits,
                "batch_invariant": engine.row_invariant, "decode_kernels": engine.decode_kernels,
                "context": config.block_size, "variant": config.variant,
                "stats": dict(engine.stats), "log_lines_dropped": dropped_lines() if dropped_lines else 0}
        return JSONResponse(body, status_code=503 if status in ("stuck", "stopped") else 200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "aogpt", "context": config.block_size,
                                            "max_model_len": config.block_size, "limits": limits}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        if body.model not in (None, model_name):
            return error_response(404, f"model {body.model!r} is not served here (this server serves "
                                       f"{model_name!r}; GET /v1/models lists it)", "not_found_error", "model")
        if body.timeout is not None and lim.timeout is not None and body.timeout > lim.timeout:
            return error_response(400, f"timeout: {body.timeout:g} s is more than this server's {lim.timeout:g} s",
                                  param="timeout")
        seed = body.seed  # without one: drawn here, in the event loop (in order of arrival with --seed)
        if seed is None:
            seed = unseeded.getrandbits(62) if unseeded is not None else draw_request_seed()
        items = prompts(body)

        def plan_all() -> list[Plan]:
            return [plan_prompt(body, p, config, tokenizer, seed, len(items), max_samples) for p in items]

        try:
            if sum(len(p) for p in items) > BIG_PROMPT:  # tokenizing could hold up every other request
                plans = await asyncio.to_thread(plan_all)
            else:
                plans = plan_all()
        except AOGPTError as exc:
            return error_response(400, str(exc))
        submitted: list[tuple[Plan, Job, _Events]] = []
        for plan in plans:
            events = _Events(request, engine)
            work = functools.partial(complete, plan=plan, announce=events.deliver) if plan.custom else None
            sequences, tokens = job_size(plan.kwargs, config)
            if plan.layout is not None:  # the length estimate decodes its proposal fills, DRAWS at a time
                sequences = max(sequences, LENGTH_DRAWS)
                tokens = sequences * config.block_size
            job = Job(plan.kwargs, sequences, tokens, events.deliver, steps=body.stream, timeout=body.timeout,
                      work=work)
            refused = _submit(job)
            if refused is not None:
                for _, other, _ in submitted:
                    other.cancel()
                return refused
            events.job = job
            submitted.append((plan, job, events))
        request_id = f"cmpl-{uuid.uuid4().hex[:24]}"
        if body.stream:
            return await _streamed(request_id, submitted[0], body)
        parts = []
        try:
            for p, (plan, job, events) in enumerate(submitted):
                kind, payload = await _outcome(events)
                if kind != "done":
                    return (error_response(499, "the client closed the connection") if kind == "gone"
                            else _job_error(job, payload))
                result = payload.result if isinstance(payload, Completed) else payload
                parts.append(Part(plan, payload, choices_for(plan, condition_of(result), body.n, tokenizer,
                                                             stops(body), offset=p * body.n)))
        finally:
            for _, job, _ in submitted:
                if not job.finished.is_set():
                    job.cancel()
        return JSONResponse(response_body(request_id, model_name, parts))

    def _submit(job: Job) -> JSONResponse | None:
        """Hand `job` to the engine; the error response if it refuses."""
        try:
            engine.submit(job)
        except AOGPTError as exc:
            return error_response(400, str(exc))
        except Busy as exc:
            return error_response(503, str(exc), "server_busy", headers={"Retry-After": str(exc.retry_after)})
        except Draining as exc:
            return error_response(503, str(exc), "server_busy", headers={"Retry-After": "30", "Connection": "close"})
        return None

    async def _streamed(request_id: str, submitted: tuple[Plan, Job, _Events], body: CompletionRequest):
        """The response of a streamed request: its first event decides between an error and the stream
        (a gap of unknown length is announced first, with the layout the stream then describes)."""
        plan, job, events = submitted
        condition = plan.condition
        try:
            kind, payload = await events.next()
            if kind == "layout":
                condition = payload[0]
                kind, payload = await events.next()
        except asyncio.CancelledError:
            job.cancel()
            raise
        if kind == "gone":
            job.cancel()
            return error_response(499, "the client closed the connection")
        if kind == "error":
            return _job_error(job, payload)
        choices = choices_for(plan, condition, body.n, tokenizer, stops(body))
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(_stream(request_id, model_name, (kind, payload), events, job, choices,
                                         include_usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return app


def _job_error(job: Job, error: tuple[int, str]) -> JSONResponse:
    """The response of a job that ended with `error` (a 503 says when to retry)."""
    status, message = error
    if status == 503:
        return error_response(503, message, ERROR_TYPES.get(job.outcome, "server_busy"),
                              headers={"Retry-After": str(job.retry_after or 1)})
    return error_response(status, message, "invalid_request_error" if status == 400 else "server_error")


class _Events:
    """A job's events, handed over from the engine's thread, and whether its client is still there
    (asked at least every `DISCONNECT_POLL` seconds, however often events come)."""

    def __init__(self, request: Request, engine: Engine):
        self.request, self.engine = request, engine
        self.job: Job | None = None
        self.queue: asyncio.Queue = asyncio.Queue()
        self.loop = asyncio.get_running_loop()
        self.checked = time.monotonic()

    def deliver(self, kind: str, payload: Any) -> None:  # called from the engine's thread
        with contextlib.suppress(RuntimeError):  # the event loop has closed: nobody is listening any more
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, payload))

    def _late(self) -> float | None:
        """Seconds left before the app stops waiting for the engine (None: no bound): the job's
        deadline or the drain deadline, plus `BACKSTOP`."""
        bounds = [t for t in (self.job.deadline if self.job else None, self.engine.drain_deadline) if t is not None]
        return min(bounds) + BACKSTOP - time.monotonic() if bounds else None

    def _backstop(self) -> tuple[str, Any]:
        """The engine did not answer in time: cancel the job and answer for it."""
        job = self.job
        error = deadline_error((job.deadline or time.monotonic()) - (job.submitted or 0.0))
        job.cancel(error, "timed_out")
        job.outcome = "timed_out"
        log.error("request %d: no answer from the engine %.0f s past its deadline; answered 503", job.id, BACKSTOP)
        return "error", error

    async def next(self, poll: bool = True) -> tuple[str, Any]:
        """The next event, or ("gone", None) once the client has disconnected (asked when `poll`)."""
        while True:
            if poll and time.monotonic() - self.checked >= DISCONNECT_POLL:
                self.checked = time.monotonic()
                if await self.request.is_disconnected():
                    return "gone", None
            if not self.queue.empty():  # what the engine said first, even past the deadline
                return self.queue.get_nowait()
            left = self._late()
            if left is not None and left <= 0:
                return self._backstop()
            wait = DISCONNECT_POLL if left is None else min(DISCONNECT_POLL, left)
            try:
                return await asyncio.wait_for(self.queue.get(), wait)
            except TimeoutError:
                pass


async def _outcome(events: _Events) -> tuple[str, Any]:
    """A job's last event (its result, its error, or "gone"), past the steps and layout it reports."""
    while True:
        kind, payload = await events.next()
        if kind not in ("step", "layout"):
            return kind, payload


def _advance(choices: list[Choice], revealed: Any) -> list[dict[str, Any]]:
    out = []
    for c in choices:
        rows = (revealed.samples == c.sample).nonzero()[0]
        if len(rows):
            out.append(c.advance(revealed, rows))
    return out


def _sse(data: Any) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


async def _stream(request_id: str, model: str, first: tuple[str, Any], events: _Events, job: Job,
                  choices: list[Choice], include_usage: bool):
    """Server-sent events: a chunk per sequence and step, the finishing chunks, then ``[DONE]``. A
    client that disconnects cancels the generator, which cancels the job."""
    created = int(time.time())
    kind, payload = first
    try:
        for c in choices:
            yield _sse(chunk(request_id, model, created, [c.start()]))
        while True:
            if kind == "step":
                for choice in _advance(choices, payload):
                    yield _sse(chunk(request_id, model, created, [choice]))
            elif kind == "done":
                result = payload.result if isinstance(payload, Completed) else payload
                tokens = result.tokens.numpy()
                extra = {"seed": result.settings["seed"]}
                if isinstance(payload, Completed) and payload.gap is not None:
                    extra["gap"] = payload.gap.to_dict()
                for c in choices:
                    yield _sse(chunk(request_id, model, created, [c.finish(tokens[c.sample])], aogpt=extra))
                if include_usage:
                    known, masked = int(result.known.sum()), int((~result.known).sum())
                    usage = {"prompt_tokens": known, "completion_tokens": masked * len(choices),
                             "total_tokens": known + masked * len(choices)}
                    yield _sse(chunk(request_id, model, created, [], usage=usage))
                yield "data: [DONE]\n\n"
                return
            else:
                etype = ERROR_TYPES.get(job.outcome, "server_busy") if payload[0] == 503 else "server_error"
                yield _sse({"error": {"message": payload[1], "type": etype, "param": None, "code": payload[0]}})
                return
            kind, payload = await events.next(poll=False)  # the response itself watches for a disconnect
    finally:
        if not job.finished.is_set():
            job.cancel()
