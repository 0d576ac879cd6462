"""`aogpt serve`: a checkpoint's exact any-order decoding as an HTTP service (`aogpt.serve`), with the
page that shows the order in which a text is revealed. Behaviour and decisions: docs/serve.md."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import socket
import sys
import threading
import time
from typing import Any

from aogpt.cli.common import add_common, config_arg, finite_float, int_arg, seed_arg
from aogpt.errors import AOGPTError

HELP = "serve a checkpoint over HTTP: OpenAI-style completions, streaming the positions each step reveals"
MAX_SAMPLES = 1024
WATCHDOG_GRACE = 5.0  # seconds past the drain deadline after which a server that has not exited is ended


def add_parser(subparsers: Any) -> None:
    from aogpt.serve.jobs import EngineLimits  # not the engine: it needs greenlet, this runs for every command

    p = subparsers.add_parser("serve", help=HELP, description=HELP + "; continuous batching with results identical "
                              "to `aogpt sample`/generate() for the same seed; a page at / (see docs/serve.md)")
    p.add_argument("--checkpoint", metavar="RUN", required=True,
                   help="run directory (its newest checkpoint) or a ckpt-* directory")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 opens it to the network)")
    p.add_argument("--port", type=int_arg(ge=0, le=65535), default=8000,
                   help="TCP port, 0..65535 (default 8000; 0 picks a free one and prints it)")
    p.add_argument("--name", default=None, help="model name clients send and /v1/models lists (default: the run's)")
    p.add_argument("--max-sequences", type=config_arg(EngineLimits, "max_sequences"), default=32,
                   help="sequences decoded at once, 1..4096 (default 32; a request with n samples counts n)")
    p.add_argument("--max-tokens-in-flight", type=config_arg(EngineLimits, "max_tokens_in_flight"), default=16384,
                   help="sum of n x length over the running requests, 1..2^24 (default 16384)")
    p.add_argument("--max-queue", type=config_arg(EngineLimits, "max_queue"), default=64,
                   help="requests waiting for room, 0..100000 (default 64); beyond it a request gets 503 and "
                   "Retry-After")
    p.add_argument("--timeout", type=config_arg(EngineLimits, "timeout"), default=60.0, metavar="S",
                   help="a request's deadline in seconds, from its arrival (default 60; a request may ask for less "
                   "with \"timeout\"): past it, it is cancelled with 503")
    p.add_argument("--queue-timeout", type=config_arg(EngineLimits, "queue_timeout"), default=10.0, metavar="S",
                   help="seconds a request may wait for room before it gets 503 and Retry-After (default 10)")
    p.add_argument("--drain-timeout", type=finite_float(ge=0, le=86_400), default=30.0, metavar="S",
                   help="on SIGTERM or Ctrl-C: seconds the running requests get to finish before they are "
                   "cancelled with 503 (default 30); the process then exits 0")
    p.add_argument("--stall-after", type=config_arg(EngineLimits, "stall_after"), default=10.0, metavar="S",
                   help="seconds without engine progress, while there is work, after which /health says \"stuck\" "
                   "and answers 503 (default 10)")
    p.add_argument("--max-samples", type=int_arg(ge=1, le=MAX_SAMPLES), default=16,
                   help=f"most samples (n) one request may ask for, 1..{MAX_SAMPLES} (default 16)")
    p.add_argument("--weights", choices=("ema", "raw"), default="ema", help="EMA (default) or raw weights")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")
    p.add_argument("--threads", type=int_arg(ge=1, le=1024), default=None,
                   help="torch threads, 1..1024 (default: torch's, one per core)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info",
                   help="server log level (default info: one line per request)")
    p.add_argument("--seed", type=seed_arg, default=None, metavar="S",
                   help="seeds for requests that bring none: the k-th such request gets the k-th seed drawn from S, so "
                        "a restarted server answers the same requests, sent in the same order, alike (default: a "
                        "fresh random seed each; a request's own seed always wins, and every response names its seed)")
    add_common(p, seed=False)
    p.set_defaults(func=run)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one), or a one-line error."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        raise AOGPTError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                         "pick another --port (0 picks a free one) or --host") from None
    sock.listen(2048)  # connections wait in the backlog until the server accepts them
    sock.set_inheritable(True)
    return sock


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from uvicorn.logging import AccessFormatter, DefaultFormatter

    from aogpt.checkpoint import load
    from aogpt.device import resolve_device
    from aogpt.serve.app import create_app
    from aogpt.serve.engine import Engine, EngineLimits
    from aogpt.serve.logs import STDERR, STDOUT, ServerOutput

    sock = bind(args.host, args.port)  # before the model loads: a busy port fails at once
    loaded = load(args.checkpoint, weights=args.weights, device=resolve_device(args.device))
    run_dir = loaded.path.parent if loaded.path.name.startswith("ckpt-") else loaded.path
    name = args.name or run_dir.name
    limits = EngineLimits(max_sequences=args.max_sequences, max_tokens_in_flight=args.max_tokens_in_flight,
                          max_queue=args.max_queue, timeout=args.timeout, queue_timeout=args.queue_timeout,
                          stall_after=args.stall_after)
    engine = Engine(loaded.model, limits, threads=args.threads)
    # everything the server logs goes through a queue that never blocks it (aogpt.serve.logs: the event loop
    # must not wait on an output that nobody reads)
    output = ServerOutput()
    app = create_app(engine, loaded.tokenizer, name, max_samples=args.max_samples,
                     dropped_lines=lambda: output.dropped, seed=args.seed)
    # what start-up made (modules, the model, its packed weights) lives as long as the server: frozen, Python's
    # collector never walks it again, so a full collection while serving walks only what requests allocate
    # (over the start-up heap one took about 0.15 s of the engine's thread, a step's time many times over)
    gc.collect()
    gc.freeze()
    config = uvicorn.Config(app, log_level=args.log_level, log_config=None, lifespan="on",
                            timeout_graceful_shutdown=args.drain_timeout + 2)  # a backstop: the engine cancels first

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:  # SIGTERM / Ctrl-C: refuse new work, drain, exit 0
            first = not self.should_exit
            engine.drain(args.drain_timeout)
            super().handle_exit(sig, frame)
            # uvicorn re-raises the signal once it has shut down, so the process would die of it; a drained
            # server exits 0 instead (and prints its summary)
            getattr(self, "_captured_signals", []).clear()
            if first:
                threading.Thread(target=_watchdog, args=(args.drain_timeout + WATCHDOG_GRACE,), daemon=True).start()

    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    cfg = loaded.config
    print(f"serving {name} ({cfg.variant}, context {cfg.block_size}) at http://{shown}:{port}/  "
          f"(the page at /, completions at /v1/completions; SIGTERM or Ctrl-C stops after the running requests, "
          f"{args.drain_timeout:g} s at most)", flush=True)
    if not engine.row_invariant:
        print("note: this machine's matrix kernels are not row-invariant: batched results may differ from offline "
              "generate() in rare tokens (docs/serve.md)", file=sys.stderr, flush=True)
    colours = sys.stderr.isatty()
    loggers = {"uvicorn": (STDERR, DefaultFormatter("%(levelprefix)s %(message)s", use_colors=colours)),
               "uvicorn.access": (STDOUT, AccessFormatter('%(levelprefix)s %(client_addr)s - "%(request_line)s" '
                                                          "%(status_code)s", use_colors=sys.stdout.isatty())),
               "aogpt.serve": (STDERR, DefaultFormatter("%(levelprefix)s %(message)s", use_colors=colours)),
               "py.warnings": (STDERR, DefaultFormatter("%(levelprefix)s %(message)s", use_colors=colours)),
               "": (STDERR, DefaultFormatter("%(levelprefix)s %(name)s: %(message)s", use_colors=colours))}
    with output.capture(loggers, getattr(logging, args.log_level.upper())):
        Server(config).run(sockets=[sock])
    st = engine.stats
    output.write(f"stopped: {st['finished']} requests served, {st['cancelled'] + st['timed_out']} cancelled, "
                 f"{st['failed']} failed, {st['refused'] + st['expired']} refused (busy)"
                 + (f"; {output.dropped} log lines dropped (nobody read the output)" if output.dropped else "") + "\n")
    if args.json:  # one JSON line last on stdout, through the same queue (it never blocks the exit)
        output.write(json.dumps({"command": "serve", "model": name, "url": f"http://{shown}:{port}/",
                                 **engine.stats, "log_lines_dropped": output.dropped}) + "\n")
    output.close()
    return 0


def _watchdog(seconds: float) -> None:
    """The last resort of a SIGTERM: if the process is still here `seconds` after it (something the
    drain does not bound held it up), it exits with status 1 rather than never."""
    time.sleep(seconds)
    message = f"error: the server did not stop within {seconds:g} s of the signal; exiting\n".encode()

    def say_it() -> None:
        with contextlib.suppress(OSError):
            os.write(2, message)

    say = threading.Thread(target=say_it, daemon=True)
    say.start()
    say.join(1.0)  # a full stderr pipe must not hold this up either
    os._exit(1)
