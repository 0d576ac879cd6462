"""The server's output never blocks it (`aogpt.serve.logs`), and the hang that it caused, reproduced.

The hang: under sustained load `aogpt serve` stopped answering anything, /health included, and
ignored SIGTERM, at 0% CPU. A stack dump of the stopped process showed the event loop's thread in
``write()`` on its standard output, inside uvicorn's access log (one line per request), and the
engine's thread idle: the output was a pipe that nobody read after the server's first line, and a
pipe holds 64 KiB, about 960 access lines. The reproduction below leaves the pipe full from the start
(the test fills it after reading the first line, instead of waiting for 960 requests), then sends
the mixed load of `aogpt.bench.serve.load`: before the fix no request after the first was answered
and SIGTERM did nothing; now every request is answered, /health answers, and SIGTERM exits 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import time

import httpx
import pytest

from aogpt.bench.serve.load import MixedLoad, Workload, summarize
from aogpt.serve.logs import STDERR, STDOUT, ServerOutput
from tests.serve.conftest import start_server


def _fill(fd: int) -> int:
    """Write into pipe `fd` until it is full (nobody reads it); the bytes written."""
    os.set_blocking(fd, False)
    written = 0
    with contextlib.suppress(BlockingIOError):
        while True:
            written += os.write(fd, b"x" * 4096)
    os.set_blocking(fd, True)
    return written


def _first_line(fd: int, timeout: float = 120.0) -> str:
    """The first line written to pipe `fd`, read byte by byte (nothing after it is read)."""
    line, end = b"", time.monotonic() + timeout
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
        assert ready, f"the server printed no first line in {timeout} s: {line!r}"
        byte = os.read(fd, 1)
        assert byte, f"the server exited before its first line: {line!r}"
        line += byte
    return line.decode()


def test_output_lines_are_written_in_order_and_dropped_when_nobody_reads(tmp_path):
    r, w = os.pipe()
    out = ServerOutput(capacity=50, fds=(w, w))
    for i in range(5):
        out.write(f"line {i}\n")
    assert out.close(timeout=5)
    os.close(w)
    assert os.read(r, 1000).decode().splitlines() == [f"line {i}" for i in range(5)]
    os.close(r)

    r, w = os.pipe()
    _fill(w)  # a reader that has stopped reading
    out = ServerOutput(capacity=50, fds=(w, w))
    start = time.monotonic()
    for i in range(1000):
        out.write(f"line {i}\n", STDERR)
    assert time.monotonic() - start < 1.0, "a write waited for the reader"
    assert 1000 - 51 <= out.dropped <= 1000 - 50  # the queue holds 50 (one more may be in the writer's hands)
    assert out.close(timeout=0.5) is False  # a reader that never reads cannot hold the exit up
    os.close(r)


def test_captured_loggers_and_warnings_go_through_the_queue_and_are_put_back():
    r, w = os.pipe()
    out = ServerOutput(fds=(w, w))
    logger = logging.getLogger("aogpt.serve")
    before = logger.handlers[:], logger.propagate
    fmt = logging.Formatter("%(name)s %(levelname)s %(message)s")
    with out.capture({"aogpt.serve": (STDOUT, fmt), "py.warnings": (STDERR, fmt)}, logging.INFO):
        logger.info("hello")
        import warnings

        warnings.warn("careful", UserWarning, stacklevel=1)
    assert (logger.handlers, logger.propagate) == before
    assert out.close(timeout=5)
    os.close(w)
    text = os.read(r, 10_000).decode()
    os.close(r)
    assert "aogpt.serve INFO hello" in text and "py.warnings WARNING" in text and "careful" in text


@pytest.mark.slow
def test_a_server_whose_output_nobody_reads_answers_every_request_and_stops_on_sigterm(slow_checkpoint):
    """The reproduction (module docstring): `aogpt serve` with its defaults, its stdout and stderr on
    one pipe read up to the first line and then left full; eight clients send the seeded mixed load
    for 10 s. Every request must be answered, /health must answer, and SIGTERM must end it with 0."""
    r, w = os.pipe()
    proc = start_server(slow_checkpoint, stdout=w, stderr=w)
    try:
        line = _first_line(r)
        assert "serving slow" in line, line
        url = line.split(" at ")[1].split()[0].rstrip("/")
        host, port = url.removeprefix("http://").rsplit(":", 1)
        assert _fill(w) > 0  # the pipe is full: every line the server writes from now on finds it so
        load = MixedLoad(host, int(port), clients=8, seed=0, workload=Workload(seeds=4), client_timeout=20,
                         seconds=10).start()
        finished = load.join(60)
        summary = summarize(load.outcomes, [], {}, None)
        assert summary["unanswered_count"] == 0, (f"{summary['unanswered_count']} of {summary['sent']} requests "
                                                  f"unanswered: {summary['unanswered'][:3]}")
        assert finished and summary["answered_200"] > 20, summary
        assert summary["server_errors"] == summary["malformed_not_400"] == summary["well_formed_4xx"] == 0, summary
        health = httpx.get(url + "/health", timeout=2)
        assert health.status_code == 200 and health.json()["engine"] in ("idle", "busy")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(35) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        os.close(r)
        os.close(w)
