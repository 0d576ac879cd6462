"""The server's output without ever blocking the server: every log line goes through one bounded
queue to one writer thread, and a line that finds the queue full is dropped and counted.

Why: the HTTP event loop is one thread. Written directly, a log line (uvicorn writes one per request
to stdout) blocks that thread as soon as nobody reads the output: a pipe holds 64 KiB, about 960
access lines, and a supervisor, a test harness or a shell pipeline that stops reading it (or reads
only the first line) leaves the next write waiting forever. The event loop then answers nothing,
not even /health, and cannot act on SIGTERM; that was the hang of `aogpt serve` under sustained
load (docs/serve.md). Here the writer thread is the only one that can wait on the output; it writes
with `os.write` on the file descriptor (no Python buffer or lock that another thread could need), so
the process can always exit, and `dropped` says how many lines were lost (reported by /health).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Iterator

STDOUT, STDERR = 1, 2
CAPACITY = 10_000  # lines held for a slow reader (a few MB at most) before new ones are dropped


class ServerOutput:
    """A bounded queue of lines for the standard output and error, written by one daemon thread."""

    def __init__(self, capacity: int = CAPACITY, fds: tuple[int, int] = (STDOUT, STDERR)):
        self.fds = {STDOUT: fds[0], STDERR: fds[1]}
        self._queue: queue.Queue[tuple[int, bytes] | None] = queue.Queue(capacity)
        self._dropped = 0
        self._count = threading.Lock()
        self._thread = threading.Thread(target=self._write_lines, name="aogpt-output", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Lines dropped because the queue was full (nobody read the output fast enough)."""
        return self._dropped

    def write(self, text: str, stream: int = STDOUT) -> None:
        """Queue `text` (a line with its newline) for `stream`; never blocks."""
        try:
            self._queue.put_nowait((self.fds[stream], text.encode("utf-8", "replace")))
        except queue.Full:
            with self._count:
                self._dropped += 1

    def handler(self, stream: int, formatter: logging.Formatter) -> logging.Handler:
        """A logging handler that formats in the caller's thread and queues the line."""
        return _QueueHandler(self, stream, formatter)

    def close(self, timeout: float = 2.0) -> bool:
        """Write what is queued, waiting at most `timeout` seconds (a reader that has stopped reading
        cannot hold the process up); True if everything was written."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _write_lines(self) -> None:
        while (item := self._queue.get()) is not None:
            fd, data = item
            while data:
                try:
                    data = data[os.write(fd, data):]
                except InterruptedError:
                    continue
                except OSError:  # the reader has closed its end: nothing more can be shown
                    break

    @contextlib.contextmanager
    def capture(self, loggers: dict[str, tuple[int, logging.Formatter]], level: int) -> Iterator[ServerOutput]:
        """Route each named logger (and Python's warnings) to this output while the block runs:
        ``{name: (stream, formatter)}``; their own handlers are put back after."""
        saved = {}
        for name, (stream, formatter) in loggers.items():
            logger = logging.getLogger(name)
            saved[name] = (logger.handlers[:], logger.propagate, logger.level)
            logger.handlers = [self.handler(stream, formatter)]
            logger.propagate = False
            if name.startswith("aogpt") or name == "py.warnings":
                logger.setLevel(level)
        logging.captureWarnings(True)
        try:
            yield self
        finally:
            logging.captureWarnings(False)
            for name, (handlers, propagate, lvl) in saved.items():
                logger = logging.getLogger(name)
                logger.handlers, logger.propagate = handlers, propagate
                logger.setLevel(lvl)


class _QueueHandler(logging.Handler):
    def __init__(self, output: ServerOutput, stream: int, formatter: logging.Formatter):
        super().__init__()
        self.output, self.stream = output, stream
        self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.output.write(self.format(record) + "\n", self.stream)
        except Exception:  # a record that cannot be formatted: counted, never written to a blocking stderr
            with self.output._count:
                self.output._dropped += 1

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        with self.output._count:
            self.output._dropped += 1

