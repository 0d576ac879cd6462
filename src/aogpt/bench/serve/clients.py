"""`aogpt bench serve`: the server under concurrent clients, against the same requests one at a time
(``--workload mixed``: the mixed soak of `aogpt.bench.serve.soak` instead).

The server is `aogpt serve` in a process of its own on the loopback interface; the clients are
threads of this process, one keep-alive HTTP connection each. Every request asks for an
unconditional sample of ``max_tokens`` tokens with its own seed, so each has one right answer:
what `aogpt.generate` gives for that seed, computed here in-process first.

Contenders, interleaved round by round (medians over rounds; latencies pooled):

- the server, requests sent one at a time (one client);
- the server, N concurrent clients (continuous batching);
- in-process, for reference: `generate()` per request (no HTTP), and `generate(num_samples=N)` as
  one batch job (its samples share one seed: fast, but neither per-request nor batch-invariant; what
  serving exactly costs against it is the gap between it and the N-client row).

Then, with ``--duration``, a soak: N clients send the same requests in a loop for that long
(bounded in time and count), and every answer is checked: lost (no answer or not 200), duplicated
(a response id seen twice), or different from `generate()`.
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aogpt.bench.common import fmt_ratio, markdown_table, write_outputs
from aogpt.bench.environment import describe_environment, environment, finish_environment
from aogpt.bench.serve.load import Server
from aogpt.errors import AOGPTError

QUICK = {"requests": 6, "clients": 3, "max_tokens": 16, "repeats": 1}
MAX_SOAK_REQUESTS = 1_000_000  # the soak's bound in count, beside its bound in time


@dataclass
class Answer:
    """What one request got: HTTP status (0: no answer), tokens, response id, seconds it took."""

    index: int
    status: int
    tokens: list[int] | None
    id: str | None
    seconds: float
    error: str = ""


def _ask(conn: http.client.HTTPConnection, index: int, body: dict[str, Any]) -> Answer:
    start = time.perf_counter()
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = json.loads(resp.read())
    except (OSError, http.client.HTTPException, ValueError) as exc:
        conn.close()
        return Answer(index, 0, None, None, time.perf_counter() - start, str(exc))
    seconds = time.perf_counter() - start
    if resp.status != 200:
        return Answer(index, resp.status, None, None, seconds, data.get("error", {}).get("message", ""))
    return Answer(index, 200, data["choices"][0]["aogpt"]["tokens"], data["id"], seconds)


def run_clients(server: Server, bodies: list[dict[str, Any]], clients: int, seconds: float | None = None,
                limit: int | None = None) -> tuple[list[Answer], float]:
    """`clients` threads send `bodies` (each once; or, with `seconds`, in a loop until then, at most
    `limit` requests in all) and collect the answers; returns them and the wall time."""
    answers: list[Answer] = []
    lock = threading.Lock()
    counter = iter(range(limit if seconds is not None else len(bodies)))
    deadline = None if seconds is None else time.monotonic() + seconds

    def client() -> None:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=600)
        while deadline is None or time.monotonic() < deadline:
            with lock:
                k = next(counter, None)
            if k is None:
                break
            answer = _ask(conn, k % len(bodies), bodies[k % len(bodies)])
            with lock:
                answers.append(answer)
        conn.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers, time.perf_counter() - start


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def bench_serve(checkpoint: Path, clients: int, requests: int, max_tokens: int, repeats: int, duration: float,
                threads: int, seed: int, out: Path | None, progress: Callable[[int, str], None] | None = None,
                workload: str = "uniform") -> dict[str, Any]:
    """The uniform benchmark (module docstring), or with ``workload="mixed"`` the mixed soak
    (`aogpt.bench.serve.soak`) for `duration` seconds."""
    if workload == "mixed":
        from aogpt.bench.serve.soak import soak

        return soak(checkpoint, clients, duration, threads, seed, out, progress=progress)
    from aogpt.checkpoint import load
    from aogpt.generation.generate import generate
    from aogpt.serve.protocol import CompletionRequest, to_generate

    loaded = load(checkpoint)
    model, tokenizer, cfg = loaded.model, loaded.tokenizer, loaded.config
    if max_tokens > cfg.block_size:
        raise AOGPTError(f"--max-tokens {max_tokens} exceeds the model's context of {cfg.block_size}",
                         f"use at most {cfg.block_size}")
    bodies = [{"prompt": "", "max_tokens": max_tokens, "seed": seed + i} for i in range(requests)]
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, label)

    def in_process_one() -> list[list[int]]:
        return [generate(model, **to_generate(CompletionRequest(**body), cfg, tokenizer, max_samples=1)[0]
                         ).tokens[0].tolist() for body in bodies]

    batches = max(1, requests // clients)

    def in_process_batch() -> None:
        for b in range(batches):
            generate(model, num_samples=clients, length=max_tokens, seed=seed + b, tokenizer=tokenizer)

    env = environment("cpu", "fp32")  # the server and the in-process rows load the weights in fp32
    timings: dict[str, list[float]] = {"generate": [], "batch": []}
    rounds: dict[str, list[dict[str, Any]]] = {"one": [], "many": []}
    reference: list[list[int]] = []
    server = Server(checkpoint, threads, clients)
    try:
        for _ in range(repeats):  # every contender once per round, in the same order
            start = time.perf_counter()
            answers = in_process_one()  # the right answers (the first round's), and a contender
            timings["generate"].append(time.perf_counter() - start)
            reference = reference or answers
            tick("generate() one at a time")
            start = time.perf_counter()
            in_process_batch()
            timings["batch"].append(time.perf_counter() - start)
            tick(f"generate() batches of {clients}")
            for mode, n in (("one", 1), ("many", clients)):
                cpu0 = server.cpu_seconds()
                answers, wall = run_clients(server, bodies, n)
                cpu1 = server.cpu_seconds()
                rounds[mode].append({"answers": answers, "wall": wall,
                                     "cpu": None if cpu0 is None or cpu1 is None else cpu1 - cpu0})
                tick("one at a time" if n == 1 else f"{n} clients")
        soak = _soak(server, bodies, reference, clients, duration) if duration > 0 else None
        if soak is not None:
            tick("soak")
    finally:
        server.stop()
    env = finish_environment(env)
    tokens = requests * max_tokens
    first_one = [a.tokens for a in sorted(rounds["one"][0]["answers"], key=lambda a: a.index)]
    rows = {}
    for mode, label in (("one", "server, one request at a time"), ("many", f"server, {clients} concurrent clients")):
        walls = [r["wall"] for r in rounds[mode]]
        latencies = [a.seconds for r in rounds[mode] for a in r["answers"] if a.status == 200]
        outputs = [(a.index, a.tokens) for r in rounds[mode] for a in r["answers"]]
        answered = sum(a.status == 200 for r in rounds[mode] for a in r["answers"])
        cpu = [r["cpu"] for r in rounds[mode] if r["cpu"] is not None]
        rows[mode] = {"label": label, "clients": 1 if mode == "one" else clients, "requests": len(outputs),
                      "answered": answered, "wall_seconds": statistics.median(walls),
                      "tokens_per_second": tokens / statistics.median(walls),
                      "p50_latency": _percentile(latencies, 50), "p99_latency": _percentile(latencies, 99),
                      "server_cpu_seconds": statistics.median(cpu) if cpu else None,
                      "identical_to_generate": sum(t == reference[i] for i, t in outputs) / len(outputs),
                      "identical_to_one_at_a_time": sum(t == first_one[i] for i, t in outputs) / len(outputs)}
    offline = statistics.median(timings["generate"])
    batch = statistics.median(timings["batch"])
    rows["generate"] = {"label": "in-process generate(), one request at a time", "clients": 1,
                        "requests": requests * repeats, "wall_seconds": offline, "tokens_per_second": tokens / offline}
    rows["batch"] = {"label": f"in-process generate(num_samples={clients}), one batch job", "clients": clients,
                     "requests": batches * clients * repeats, "wall_seconds": batch,
                     "tokens_per_second": batches * clients * max_tokens / batch}
    result = {"checkpoint": str(checkpoint), "variant": cfg.variant, "clients": clients, "requests": requests,
              "max_tokens": max_tokens, "repeats": repeats, "server_threads": threads, "environment": env,
              "rows": rows, "speedup": rows["many"]["tokens_per_second"] / rows["one"]["tokens_per_second"],
              "soak": soak}
    result["files"] = write_outputs(out, "serve", to_markdown(result), result)
    return result


def _soak(server: Server, bodies: list[dict[str, Any]], reference: list[list[int]], clients: int,
          seconds: float) -> dict[str, Any]:
    answers, wall = run_clients(server, bodies, clients, seconds=seconds, limit=MAX_SOAK_REQUESTS)
    ok = [a for a in answers if a.status == 200]
    ids = [a.id for a in ok]
    statuses: dict[str, int] = {}
    for a in answers:
        if a.status != 200:
            statuses[str(a.status)] = statuses.get(str(a.status), 0) + 1
    return {"seconds": wall, "clients": clients, "sent": len(answers), "answered": len(ok),
            "lost": len(answers) - len(ok), "duplicated": len(ids) - len(set(ids)),
            "different_from_generate": sum(a.tokens != reference[a.index] for a in ok),
            "other_statuses": statuses, "tokens_per_second": len(ok) * len(reference[0]) / wall,
            "p50_latency": _percentile([a.seconds for a in ok], 50),
            "p99_latency": _percentile([a.seconds for a in ok], 99)}


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s" if x >= 1 else f"{x * 1000:.0f} ms"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def to_markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    one = rows["one"]["tokens_per_second"]
    table = []
    for key in ("one", "many", "generate", "batch"):
        r = rows[key]
        table.append([r["label"], str(r["requests"]), f"{r['tokens_per_second']:.0f}",
                      fmt_ratio(r["tokens_per_second"] / one), _s(r.get("p50_latency")), _s(r.get("p99_latency")),
                      _s(r.get("server_cpu_seconds")), _share(r.get("identical_to_one_at_a_time")),
                      _share(r.get("identical_to_generate"))])
    lines = [f"# aogpt bench serve: {result['clients']} clients, {result['requests']} requests of "
             f"{result['max_tokens']} tokens ({result['variant']}, {result['repeats']} round(s), median wall time)",
             "", markdown_table(["contender", "requests", "tokens/s", "vs one at a time", "p50 latency",
                                 "p99 latency", "server CPU", "identical to one at a time",
                                 "identical to generate()"], table), "",
             f"Throughput at {result['clients']} clients: {fmt_ratio(result['speedup'])} that of one request at a "
             f"time. Server: {result['server_threads']} torch thread(s). "
             + describe_environment(result["environment"])]
    soak = result.get("soak")
    if soak:
        lines += ["", f"Soak: {soak['clients']} clients for {soak['seconds']:.0f} s: {soak['sent']} requests sent, "
                  f"{soak['answered']} answered, {soak['lost']} lost, {soak['duplicated']} duplicated, "
                  f"{soak['different_from_generate']} different from generate(); {soak['tokens_per_second']:.0f} "
                  f"tokens/s, latency p50 {_s(soak['p50_latency'])}, p99 {_s(soak['p99_latency'])}."]
    return "\n".join(lines)
