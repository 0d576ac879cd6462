"""`aogpt bench serve --workload mixed`: the server under a sustained, mixed load, then SIGTERM.

`aogpt serve` runs with its defaults in a process of its own, its output on a pipe that nobody
reads past the first line (as a careless supervisor would leave it), while N clients send the mix of
`aogpt.bench.serve.load` (six request kinds, seeds, streams, streams cut by their client, malformed
requests) for the given time, and /health is asked five times a second. Then, with the clients still
sending, the server gets SIGTERM. Reported: requests answered (200), refused (503), rejected (400),
unanswered, late and different from offline `generate()`; latency p50/p99; /health's p50/p99; the
longest time the engine went without progress while it had work; memory at start, after the first
minute and at the end; how long the server took to exit after SIGTERM and its exit status. `verdict`
says which of the goals (docs/serve.md) the run met.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aogpt.bench.common import write_outputs
from aogpt.bench.environment import describe_environment, environment, finish_environment
from aogpt.bench.serve.load import HealthWatch, MixedLoad, Server, Workload, references, summarize, verdict

SIGNAL_WAIT = 60.0  # seconds to wait for the server to exit after SIGTERM before it is killed


def soak(checkpoint: Path, clients: int, seconds: float, threads: int, seed: int = 0, out: Path | None = None,
         workload: Workload | None = None, server_flags: list[str] | None = None,
         progress: Callable[[int, str], None] | None = None, first_minute: float = 60.0) -> dict[str, Any]:
    """Run the soak (module docstring); returns the summary, with `checks` (goal: met?). Memory is
    judged against its value `first_minute` seconds in (the allocator's warm-up comes before)."""
    from aogpt.checkpoint import load

    workload = workload or Workload()
    loaded = load(checkpoint)
    refs = references(loaded.model, loaded.tokenizer, loaded.config, workload.seeds)
    env = environment("cpu", "fp32")  # the server loads the weights in fp32
    server = Server(checkpoint, threads, clients, flags=server_flags or [])
    try:
        limits = _limits(server)
        deadline = limits.get("timeout")
        health = HealthWatch(server.host, server.port, server.proc.pid).start()
        mix = MixedLoad(server.host, server.port, clients, seed, workload,
                        client_timeout=(deadline or 600) + 30).start()
        start = time.monotonic()
        while (left := seconds - (time.monotonic() - start)) > 0:
            time.sleep(min(1.0, left))
            if progress is not None:
                progress(min(100, int(100 * (time.monotonic() - start) / seconds)), f"{len(mix.outcomes)} answers")
        signal_at = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)  # with the clients still sending
        try:
            code: int | None = server.proc.wait(SIGNAL_WAIT)
        except subprocess.TimeoutExpired:
            code = None
        exit_seconds = time.monotonic() - signal_at
        mix.stop()
        mix.join((deadline or 600) + 40)
        health.stop()
    finally:
        server.stop()
    env = finish_environment(env)
    summary = summarize(mix.outcomes, health.samples, refs, deadline, signal_at, first_minute=first_minute)
    summary.update({"checkpoint": str(checkpoint), "clients": clients, "seconds": seconds, "seed": seed,
                    "server_threads": threads, "limits": limits, "workload": dataclasses.asdict(workload),
                    "exit_code": code, "exit_seconds": None if code is None else exit_seconds,
                    "environment": env})
    summary["checks"] = verdict(summary)
    summary["passed"] = all(summary["checks"].values())
    summary["files"] = write_outputs(out, "serve-soak", to_markdown(summary), summary)
    return summary


def _limits(server: Any) -> dict[str, Any]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        conn.request("GET", "/v1/models")
        return json.loads(conn.getresponse().read())["data"][0].get("limits", {})
    finally:
        conn.close()


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s" if x >= 1 else f"{x * 1000:.0f} ms"


def _mb(x: int | None) -> str:
    return "-" if x is None else f"{x / 2**20:.0f} MiB"


def to_markdown(s: dict[str, Any]) -> str:
    after = s["after_signal"]
    lines = [
        f"# aogpt bench serve: mixed soak, {s['clients']} clients for {s['seconds']:.0f} s, then SIGTERM",
        "",
        f"Before the signal, {s['sent_before_signal']} requests: {s['answered_200']} answered "
        f"200, {s['refused_503']} refused 503, {s['rejected_400']} rejected 400 (malformed), "
        f"{s['unanswered_count']} unanswered, {s['cut_streams']} streams cut by their client; "
        f"{s['server_errors']} other 5xx; {s['late']} answered after their deadline; "
        f"{s['different_from_generate']} of {s['compared_with_generate']} answers different from generate(). "
        f"Statuses: {s['statuses']}.",
        "",
        f"Latency of the 200s: p50 {_s(s['p50_latency'])}, p99 {_s(s['p99_latency'])}. /health: asked "
        f"{s['health_asked']} times, {s['health_unanswered']} unanswered, p50 {_s(s['health_p50'])}, p99 "
        f"{_s(s['health_p99'])}, longest {_s(s['health_max'])}. Longest time without engine progress while it "
        f"had work: {_s(s['longest_stall_engine'])} (engine), {_s(s['longest_stall_seen'])} (seen by /health). "
        f"Server memory: {_mb(s['memory_start'])} at start, {_mb(s['memory_after_first_minute'])} after the first "
        f"minute, {_mb(s['memory_max_after_first_minute'])} at most after it (sampled five times a second), "
        f"{_mb(s['memory_end'])} at the end. "
        f"Log lines dropped: {s['log_lines_dropped']}.",
        "",
        f"SIGTERM under load: exit status {s['exit_code']} after {_s(s['exit_seconds'])}; requests sent after "
        f"it ({s['sent_after_signal']}): {after['answered_200']} answered, {after['refused_503']} refused 503, "
        f"{after['door_closed']} found the door closed.",
        "",
        "Checks: " + "; ".join(f"{name}: {'yes' if ok else '**NO**'}" for name, ok in s["checks"].items()) + ".",
        "",
        f"Limits: {s['limits']}. Server: {s['server_threads']} torch thread(s). "
        + describe_environment(s["environment"]),
    ]
    if s["unanswered"]:
        lines += ["", "Unanswered (first 20): " + "; ".join(s["unanswered"])]
    return "\n".join(lines)
