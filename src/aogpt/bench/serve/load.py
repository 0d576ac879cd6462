"""A mixed, seeded load on a running `aogpt serve`: what its users send, all at once.

Each client is a thread with one keep-alive HTTP connection that sends requests in a loop, each a
random choice (from the client's own seeded stream) of:

- one of six request kinds (`KINDS`: random, left-to-right, template, confidence, few-step template
  and speculative decoding) with a seed in 0..seeds-1, a share of them streamed, a share with their
  own deadline (``"timeout"``);
- a stream the client reads a few chunks of and then cuts (closing its connection);
- a malformed request (bad JSON, an unknown field, a value out of range: `MALFORMED`).

Every answer is recorded (`Outcome`): its status (0: none), the seconds it took, and for a 200 the
tokens, from the body or rebuilt from the stream's chunks, to compare with offline `generate()`
(`references`). `Server` runs `aogpt serve` in a process of its own; `HealthWatch` asks its
/health every `period` seconds meanwhile, and reads its memory. `summarize` turns both into the
soak's figures and `verdict` into pass/fail checks.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aogpt.errors import AOGPTError

KINDS: list[dict[str, Any]] = [
    {"prompt": "HAMLET:\n", "max_tokens": 32, "order": "random"},
    {"prompt": "ROMEO:\n", "max_tokens": 24, "order": "l2r"},
    {"prompt": "HAMLET:\nTo be, or [MASK:6] to be", "order": "random"},
    {"prompt": "KING:\n", "max_tokens": 40, "order": "confidence"},
    {"prompt": "A [MASK:4] and [MASK:4].", "order": "random", "steps": 3},
    {"prompt": "First Citizen:\n", "max_tokens": 30, "order": "random", "speculative": 4},
]
MALFORMED: list[str] = [
    '{"prompt": "HAMLET:\\n", "max_tokens": ',  # cut JSON
    '{"prompt": "HAMLET:\\n", "colour": "red"}',  # unknown field
    '{"prompt": "HAMLET:\\n", "temperature": -1}',  # out of range
    '{"prompt": "HAMLET:\\n", "max_tokens": 100000}',  # beyond any context
    '{"prompt": "A [MASK:4] and [MASK:4].", "order": "sideways"}',  # no such order
    '["not", "an", "object"]',
]
CUT_AFTER = 3  # data lines a disconnecting client reads before it closes its connection
START_TIMEOUT = 120.0  # seconds for the server to load the model and listen


class Server:
    """`aogpt serve` on a free loopback port, in its own process (stopped with SIGTERM). Its output
    is read up to the line that gives its address, and then no more. `flags`: the server's own
    (None: room for every client, and warnings only in its log)."""

    def __init__(self, checkpoint: Path, threads: int, clients: int, flags: list[str] | None = None):
        if flags is None:
            flags = ["--max-sequences", str(max(32, clients)), "--max-queue", str(max(64, 2 * clients)),
                     "--log-level", "warning"]
        cmd = [sys.executable, "-m", "aogpt", "serve", "--checkpoint", str(checkpoint), "--port", "0",
               "--threads", str(threads), *flags]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "OMP_NUM_THREADS": str(threads)})
        line = self._first_line()
        if " at http://" not in line:
            self.proc.kill()
            err = (self.proc.stderr.read() or "").strip().splitlines()
            raise AOGPTError(f"the server did not start: {err[-1] if err else line.strip()}",
                             "check that `aogpt serve --checkpoint ...` runs on its own")
        url = line.split(" at ")[1].split()[0]
        self.host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
        self.port = int(port)

    def _first_line(self) -> str:
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(START_TIMEOUT)
        return box[0] if box else ""

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of the server process so far (Linux), else None."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@dataclass(frozen=True)
class Workload:
    """The mix: `seeds` per kind; shares of streams, of streams cut by their client, of malformed
    requests and of requests with their own deadline (`own_timeout` seconds)."""

    seeds: int = 8
    stream_share: float = 1 / 3
    cut_share: float = 0.15
    malformed_share: float = 0.05
    own_timeout_share: float = 0.0
    own_timeout: float = 30.0


@dataclass
class Outcome:
    """One request: what was sent (kind index, -1 for malformed; seed; plan) and what came back."""

    client: int
    kind: int
    seed: int
    plan: str  # "request", "stream", "cut" (a stream its client cuts) or "malformed"
    sent_at: float  # time.monotonic() when it was sent
    deadline: float | None  # the request's own "timeout", if it had one
    status: int = 0  # 0: no answer (the client gave up or the connection broke)
    seconds: float = 0.0
    tokens: list[int] | None = None
    error: str = ""


class MixedLoad:
    """`clients` threads sending the mix to host:port until `stop` (or `seconds` have passed). A
    client waits at most `client_timeout` seconds for any answer (then records no answer)."""

    def __init__(self, host: str, port: int, clients: int, seed: int = 0, workload: Workload = Workload(),
                 client_timeout: float = 120.0, seconds: float | None = None, max_requests: int | None = None):
        self.host, self.port, self.workload = host, port, workload
        self.seed, self.client_timeout = seed, client_timeout
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._end = None if seconds is None else time.monotonic() + seconds
        self._left = max_requests
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True, name=f"client-{i}")
                         for i in range(clients)]

    def start(self) -> MixedLoad:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        """Send nothing new; requests in flight still get their answer (or their client timeout)."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for every client to finish; False if one is still waiting after `timeout` seconds."""
        end = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if end is None else max(0.0, end - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def _go_on(self) -> bool:
        if self._stop.is_set() or (self._end is not None and time.monotonic() >= self._end):
            return False
        with self._lock:
            if self._left is not None:
                if self._left <= 0:
                    return False
                self._left -= 1
        return True

    def _client(self, index: int) -> None:
        rng = random.Random(self.seed * 100_003 + index)
        conn: http.client.HTTPConnection | None = None
        while self._go_on():
            out, body = self._draw(rng, index)
            if conn is None:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=self.client_timeout)
            keep = self._send(conn, out, body)
            if not keep:
                conn.close()
                conn = None
            if out.status == 0 and out.plan != "cut":
                self._stop.wait(0.05)  # a closed door (a server that stopped): do not spin
            with self._lock:
                self.outcomes.append(out)
        if conn is not None:
            conn.close()

    def _draw(self, rng: random.Random, client: int) -> tuple[Outcome, str]:
        w = self.workload
        now = time.monotonic()
        if rng.random() < w.malformed_share:
            k = rng.randrange(len(MALFORMED))
            return Outcome(client, -1, k, "malformed", now, None), MALFORMED[k]
        kind, seed = rng.randrange(len(KINDS)), rng.randrange(w.seeds)
        body: dict[str, Any] = {**KINDS[kind], "seed": seed}
        plan = "request"
        if rng.random() < w.stream_share:
            body["stream"] = True
            plan = "cut" if rng.random() < w.cut_share else "stream"
        own = None
        if rng.random() < w.own_timeout_share:
            own = body["timeout"] = w.own_timeout
        return Outcome(client, kind, seed, plan, now, own), json.dumps(body)

    def _send(self, conn: http.client.HTTPConnection, out: Outcome, body: str) -> bool:
        """Send one request and record its answer; False when the connection must not be reused."""
        start = time.monotonic()
        out.sent_at = start
        try:
            conn.request("POST", "/v1/completions", body.encode(), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if out.plan in ("stream", "cut") and resp.status == 200:
                keep = self._read_stream(conn, resp, out)
            else:
                data = resp.read()
                out.status = resp.status
                parsed = json.loads(data)
                if resp.status == 200:
                    out.tokens = parsed["choices"][0]["aogpt"]["tokens"]
                else:
                    out.error = parsed.get("error", {}).get("message", "")
                keep = not resp.will_close
        except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError) as exc:
            out.status, out.error, keep = 0, f"{type(exc).__name__}: {exc}", False
        out.seconds = time.monotonic() - start
        return keep

    def _read_stream(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, out: Outcome) -> bool:
        """Read a stream's events (or, for a cut, a few of them, then hang up): the tokens are
        rebuilt from the chunks' revealed positions."""
        tokens: list[int] = []
        lines = 0
        while True:
            line = resp.readline()
            if not line:
                out.status, out.error = 0, "the stream ended without [DONE]"
                return False
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            lines += 1
            if out.plan == "cut" and lines >= CUT_AFTER:  # hang up mid-stream, as a client that goes away
                out.status = 200
                if conn.sock is not None:
                    try:
                        conn.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return False
            if line == b"data: [DONE]":
                out.status, out.tokens = 200, tokens
                resp.read()  # the end of the chunked body
                return not resp.will_close
            event = json.loads(line[6:])
            if "error" in event:
                out.status, out.error = int(event["error"].get("code") or 500), event["error"]["message"]
                resp.read()
                return False
            for choice in event["choices"]:
                step = choice.get("aogpt", {})
                if "length" in step:
                    tokens = [-1] * step["length"]
                for p, t in zip(step.get("positions", []), step.get("tokens", []), strict=True):
                    tokens[p] = t


@dataclass
class HealthSample:
    at: float  # time.monotonic()
    seconds: float | None  # how long /health took to answer (None: no answer within the timeout)
    status: int = 0
    body: dict[str, Any] = field(default_factory=dict)
    rss: int | None = None  # the server's resident memory, bytes


class HealthWatch:
    """Asks /health every `period` seconds (a fresh answer within `timeout` or none), and reads the
    server's memory (`pid`, Linux) at the same moments."""

    def __init__(self, host: str, port: int, pid: int | None = None, period: float = 0.2, timeout: float = 5.0):
        self.host, self.port, self.pid, self.period, self.timeout = host, port, pid, period, timeout
        self.samples: list[HealthSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="health-watch")

    def start(self) -> HealthWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout + 1)

    def _watch(self) -> None:
        conn = None
        while not self._stop.is_set():
            start = time.monotonic()
            sample = HealthSample(start, None, rss=rss_bytes(self.pid))
            try:
                conn = conn or http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
                conn.request("GET", "/health")
                resp = conn.getresponse()
                sample.body = json.loads(resp.read())
                sample.status, sample.seconds = resp.status, time.monotonic() - start
            except (OSError, http.client.HTTPException, ValueError):
                if conn is not None:
                    conn.close()
                conn = None
            self.samples.append(sample)
            self._stop.wait(max(0.0, self.period - (time.monotonic() - start)))
        if conn is not None:
            conn.close()


def rss_bytes(pid: int | None) -> int | None:
    """Resident memory of process `pid` (Linux /proc), else None."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def references(model: Any, tokenizer: Any, config: Any, seeds: int) -> dict[tuple[int, int], list[int]]:
    """``{(kind, seed): tokens}``: what offline `generate()` gives for every request of the mix."""
    from aogpt.generation.generate import generate
    from aogpt.serve.protocol import CompletionRequest, to_generate

    out = {}
    for k, body in enumerate(KINDS):
        for s in range(seeds):
            kwargs, _ = to_generate(CompletionRequest(**body, seed=s), config, tokenizer, max_samples=1)
            out[(k, s)] = generate(model, **kwargs).tokens[0].tolist()
    return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def summarize(outcomes: list[Outcome], samples: list[HealthSample], refs: dict[tuple[int, int], list[int]],
              deadline: float | None, signal_at: float | None = None, slack: float = 3.0,
              first_minute: float = 60.0) -> dict[str, Any]:
    """The soak's figures. Requests sent before `signal_at` (SIGTERM) must have been answered;
    those sent after may also find the door closed (and /health is judged before it only). An answer
    is late if it took more than its deadline (its own, else the server's `deadline`) plus `slack`
    seconds."""
    before = [o for o in outcomes if signal_at is None or o.sent_at < signal_at]
    after = [o for o in outcomes if signal_at is not None and o.sent_at >= signal_at]
    expected = [o for o in before if o.plan != "cut"]
    ok = [o for o in expected if o.status == 200]
    compared = [o for o in ok if o.plan != "malformed"]
    status_counts: dict[str, int] = {}
    for o in outcomes:
        status_counts[str(o.status)] = status_counts.get(str(o.status), 0) + 1

    def late(o: Outcome) -> bool:
        bound = o.deadline if o.deadline is not None else deadline
        return bound is not None and o.status != 0 and o.seconds > bound + slack

    samples = [s for s in samples if signal_at is None or s.at < signal_at]  # after it, the door closes
    answered_health = [s.seconds for s in samples if s.seconds is not None]
    stalls = [s.body.get("seconds_since_progress", 0.0) for s in samples if s.body.get("waiting") or
              s.body.get("running")]
    rss = [(s.at, s.rss) for s in samples if s.rss is not None]
    t0 = samples[0].at if samples else 0.0
    after_minute = [r for t, r in rss if t - t0 >= first_minute]
    return {
        "sent": len(outcomes), "sent_before_signal": len(before), "sent_after_signal": len(after),
        "statuses": dict(sorted(status_counts.items())),
        "answered_200": len(ok), "refused_503": sum(o.status == 503 for o in expected),
        "rejected_400": sum(o.status == 400 for o in expected),
        "unanswered": [_brief(o) for o in expected if o.status == 0][:20],
        "unanswered_count": sum(o.status == 0 for o in expected),
        "server_errors": sum(o.status >= 500 and o.status != 503 for o in outcomes),
        "malformed_not_400": sum(o.plan == "malformed" and o.status != 400 for o in expected),
        "well_formed_4xx": sum(o.plan != "malformed" and 400 <= o.status < 500 for o in expected),
        "cut_streams": sum(o.plan == "cut" for o in outcomes),
        "late": sum(late(o) for o in expected),
        "different_from_generate": sum(o.tokens != refs[(o.kind, o.seed)] for o in compared
                                       if (o.kind, o.seed) in refs),
        "compared_with_generate": sum((o.kind, o.seed) in refs for o in compared),
        "p50_latency": percentile([o.seconds for o in compared], 50),
        "p99_latency": percentile([o.seconds for o in compared], 99),
        "health_asked": len(samples), "health_unanswered": len(samples) - len(answered_health),
        "health_p50": percentile(answered_health, 50), "health_p99": percentile(answered_health, 99),
        "health_max": max(answered_health, default=None),
        "longest_stall_seen": max(stalls, default=0.0),
        "longest_stall_engine": max((s.body.get("longest_stall", 0.0) for s in samples), default=0.0),
        "memory_start": rss[0][1] if rss else None,
        "memory_after_first_minute": after_minute[0] if after_minute else None,
        "memory_end": rss[-1][1] if rss else None,
        "memory_max_after_first_minute": max(after_minute, default=None),
        "memory_timeline": [(round(t - t0), r) for k, (t, r) in enumerate(rss) if k % 50 == 0 or k == len(rss) - 1],
        "log_lines_dropped": max((s.body.get("log_lines_dropped", 0) for s in samples), default=0),
        "after_signal": {"answered_200": sum(o.status == 200 for o in after),
                         "refused_503": sum(o.status == 503 for o in after),
                         "door_closed": sum(o.status == 0 for o in after)},
    }


def _brief(o: Outcome) -> str:
    return f"client {o.client} {o.plan} kind {o.kind} seed {o.seed}: {o.error[:120]}"


def verdict(summary: dict[str, Any], health_bound: float = 0.1, stall_bound: float = 2.0,
            memory_bound: float = 0.10) -> dict[str, bool]:
    """The soak's pass/fail checks (the goals of docs/serve.md's soak)."""
    base = summary["memory_after_first_minute"]
    grew = None if base is None else (summary["memory_max_after_first_minute"] or base) / base - 1
    checks = {
        "every request answered (200, 4xx or 503)": summary["unanswered_count"] == 0,
        "no 5xx but 503": summary["server_errors"] == 0,
        "malformed get 400, well-formed never 4xx": summary["malformed_not_400"] == summary["well_formed_4xx"] == 0,
        "every answer within its deadline": summary["late"] == 0,
        "every 200 identical to generate()": summary["different_from_generate"] == 0
        and summary["compared_with_generate"] > 0,
        f"/health p99 under {health_bound * 1000:.0f} ms, always answered": summary["health_unanswered"] == 0
        and (summary["health_p99"] or 0) < health_bound,
        f"engine progress at least every {stall_bound:g} s": summary["longest_stall_engine"] <= stall_bound,
    }
    if grew is not None:
        checks[f"memory within {memory_bound:.0%} of its value after the first minute"] = grew <= memory_bound
    if "exit_code" in summary:
        checks["SIGTERM under load: exit 0 within 35 s"] = (summary["exit_code"] == 0
                                                            and summary["exit_seconds"] <= 35)
    return checks

