"""The HTTP face of the engine (FastAPI): OpenAI-style completions, streaming by server-sent events,
the model list, a health report and the page at ``/``.

Every failure a client can see is one JSON line in OpenAI's error shape, ``{"error": {"message":
..., "type": ..., "param": ..., "code": ...}}``: 400 for a malformed body or a value out of range
(pydantic's reason, or the library's own `AOGPTError` message), 404 for an unknown model or path,
503 with ``Retry-After`` when the queue is full or the server is shutting down, 500 (never a
traceback: that goes to the server's log) for a bug. A client that goes away cancels its request
at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from aogpt.errors import AOGPTError
from aogpt.serve.engine import Busy, Draining, Engine, Job, job_size
from aogpt.serve.protocol import (
    Choice,
    CompletionRequest,
    choices_for,
    chunk,
    completion_body,
    stops,
    to_generate,
)

log = logging.getLogger("aogpt.serve")
DISCONNECT_POLL = 0.25  # seconds between checks that a waiting (non-streaming) client is still there


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
               own_engine: bool = True) -> FastAPI:
    """The app serving `engine`. With `own_engine`, the app starts the engine and stops it (after the
    running requests finish) with its lifespan."""

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
    async def health() -> dict[str, Any]:
        return {"status": "draining" if engine.draining else "ok", "model": model_name, **engine.load(),
                "batch_invariant": engine.row_invariant, "context": config.block_size,
                "variant": config.variant, "stats": dict(engine.stats)}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "aogpt", "context": config.block_size}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        if body.model not in (None, model_name):
            return error_response(404, f"model {body.model!r} is not served here (this server serves "
                                       f"{model_name!r}; GET /v1/models lists it)", "not_found_error", "model")
        try:
            kwargs, first = to_generate(body, config, tokenizer, max_samples)
        except AOGPTError as exc:
            return error_response(400, str(exc))
        events = _Events(request)
        job = Job(kwargs, *job_size(kwargs, config), events.deliver, steps=body.stream)
        try:
            engine.submit(job)
        except AOGPTError as exc:
            return error_response(400, str(exc))
        except Busy as exc:
            return error_response(503, str(exc), "server_busy", headers={"Retry-After": str(exc.retry_after)})
        except Draining as exc:
            return error_response(503, str(exc), "server_busy", headers={"Retry-After": "30", "Connection": "close"})
        request_id = f"cmpl-{uuid.uuid4().hex[:24]}"
        choices = choices_for((body.n, kwargs["condition"].length), kwargs["condition"], first, tokenizer,
                              stops(body))
        try:
            kind, payload = await events.next()
        except asyncio.CancelledError:
            job.cancel()
            raise
        if kind == "gone":
            job.cancel()
            return error_response(499, "the client closed the connection")
        if kind == "error":
            kind = "invalid_request_error" if payload[0] == 400 else "server_error"
            return error_response(payload[0], payload[1], kind)
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            return StreamingResponse(_stream(request_id, model_name, (kind, payload), events, job, choices,
                                             include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            while kind == "step":
                _advance(choices, payload)
                kind, payload = await events.next()
        finally:
            if not job.finished.is_set():
                job.cancel()
        if kind == "done":
            return JSONResponse(completion_body(request_id, model_name, payload, choices))
        if kind == "gone":
            return error_response(499, "the client closed the connection")
        return error_response(payload[0], payload[1], "server_error")

    return app


class _Events:
    """A job's events, handed over from its thread, and whether its client is still there (asked at
    least every `DISCONNECT_POLL` seconds, however often events come)."""

    def __init__(self, request: Request):
        self.request = request
        self.queue: asyncio.Queue = asyncio.Queue()
        self.loop = asyncio.get_running_loop()
        self.checked = time.monotonic()

    def deliver(self, kind: str, payload: Any) -> None:  # called from the job's thread
        with contextlib.suppress(RuntimeError):  # the event loop has closed: nobody is listening any more
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, payload))

    async def next(self) -> tuple[str, Any]:
        """The next event, or ("gone", None) once the client has disconnected."""
        while True:
            if time.monotonic() - self.checked >= DISCONNECT_POLL:
                self.checked = time.monotonic()
                if await self.request.is_disconnected():
                    return "gone", None
            try:
                return await asyncio.wait_for(self.queue.get(), DISCONNECT_POLL)
            except TimeoutError:
                pass


def _advance(choices: list[Choice], revealed: Any) -> list[dict[str, Any]]:
    out = []
    for c in choices:
        rows = (revealed.samples == c.index).nonzero()[0]
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
                tokens = payload.tokens.numpy()
                for c in choices:
                    yield _sse(chunk(request_id, model, created, [c.finish(tokens[c.index])],
                                     aogpt={"seed": payload.settings["seed"]}))
                if include_usage:
                    known, masked = int(payload.known.sum()), int((~payload.known).sum())
                    usage = {"prompt_tokens": known, "completion_tokens": masked * len(choices),
                             "total_tokens": known + masked * len(choices)}
                    yield _sse(chunk(request_id, model, created, [], usage=usage))
                yield "data: [DONE]\n\n"
                return
            else:
                yield _sse({"error": {"message": payload[1], "type": "server_error", "param": None,
                                      "code": payload[0]}})
                return
            kind, payload = await events.queue.get()
    finally:
        if not job.finished.is_set():
            job.cancel()
