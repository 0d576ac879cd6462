"""`aogpt bench serve`: the server under concurrent clients, against the same requests one at a time
and against `generate()` decoding them as one batch (``--workload mixed``: the mixed soak of
`aogpt.bench.serve.soak` instead).

The server is `aogpt serve` in a process of its own on the loopback interface; the clients are
threads of this process, one keep-alive HTTP connection each. Every request asks for an
unconditional sample of ``max_tokens`` tokens in a random order with its own seed, so each has one
right answer: what `aogpt.generate` gives for that seed, computed here in-process first.

Contenders, interleaved round by round (medians over rounds; latencies pooled):

- the server, requests sent one at a time (one client);
- the server, N concurrent clients (continuous batching);
- in-process: `generate()` per request (no HTTP), and `generate()` on the same requests N at a time
  (``seed=[...]``, one seed per sample: each sample what its request gets alone). The last is what
  batching buys without a server; the server's goal is to come within `BATCH_GOAL` of it.

Every contender's outputs are compared with `generate()`'s, request by request. Each row has its
wall time and CPU time (the server's process, or this one's for the in-process rows): on a machine
shared with other work the CPU times are the steadier measure.

Then, with ``--duration``, a soak: N clients send the same requests in a loop for that long
(bounded in time and count), and every answer is checked: lost (no answer or not 200), duplicated
(a response id seen twice), or different from `generate()`.
"""

from __future__ import annotations

import gc
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
SPEEDUP_GOAL = 4.0  # N concurrent requests against the same requests one at a time (throughput)
BATCH_GOAL = 1.25  # N concurrent requests against generate() on them N at a time (wall time)


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
    kwargs = [to_generate(CompletionRequest(**body), cfg, tokenizer, max_samples=1)[0] for body in bodies]
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, label)

    def in_process_one() -> list[list[int]]:
        return [generate(model, **kw).tokens[0].tolist() for kw in kwargs]

    def in_process_batch() -> list[list[int]]:  # the same requests, `clients` at a time: one seed per sample
        tokens = []
        for at in range(0, requests, clients):
            group = kwargs[at:at + clients]
            batch = {**group[0], "seed": [kw["seed"] for kw in group], "num_samples": len(group),
                     "batch_size": len(group)}
            tokens += generate(model, **batch).tokens.tolist()
        return tokens

    env = environment("cpu", "fp32")  # the server and the in-process rows load the weights in fp32
    timings: dict[str, list[dict[str, Any]]] = {"generate": [], "batch": []}
    rounds: dict[str, list[dict[str, Any]]] = {"one": [], "many": []}
    reference: list[list[int]] = []
    server = Server(checkpoint, threads, clients)
    kernels = {"in_process": _decode_kernels(model), "server": _server_health(server).get("decode_kernels")}
    gc.collect()  # as `aogpt serve` does: the heap so far frozen while timing, so that no contender is timed
    gc.freeze()   # with Python's collector walking it (one full collection over it takes a tenth of a second)
    try:
        for _ in range(repeats):  # every contender once per round, in the same order
            for key, run in (("generate", in_process_one), ("batch", in_process_batch)):
                wall, cpu = time.perf_counter(), time.process_time()
                outputs = run()
                timings[key].append({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
                                     "outputs": outputs})
                reference = reference or outputs  # the right answers: the first round's generate() per request
                tick("generate() one at a time" if key == "generate" else f"generate() {clients} at a time")
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
        gc.unfreeze()
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
                      "cpu_seconds": statistics.median(cpu) if cpu else None,
                      "identical_to_generate": sum(t == reference[i] for i, t in outputs) / len(outputs),
                      "identical_to_one_at_a_time": sum(t == first_one[i] for i, t in outputs) / len(outputs)}
    for key, label in (("generate", "in-process generate(), one request at a time"),
                       ("batch", f"in-process generate() on the same requests, {clients} at a time")):
        wall = statistics.median(t["wall"] for t in timings[key])
        outputs = [(i, t) for r in timings[key] for i, t in enumerate(r["outputs"])]
        rows[key] = {"label": label, "clients": 1 if key == "generate" else clients, "requests": len(outputs),
                     "wall_seconds": wall, "tokens_per_second": tokens / wall,
                     "cpu_seconds": statistics.median(t["cpu"] for t in timings[key]),
                     "identical_to_generate": sum(t == reference[i] for i, t in outputs) / len(outputs),
                     "identical_to_one_at_a_time": sum(t == first_one[i] for i, t in outputs) / len(outputs)}
    many, one, batch = rows["many"], rows["one"], rows["batch"]
    result = {"checkpoint": str(checkpoint), "variant": cfg.variant, "clients": clients, "requests": requests,
              "max_tokens": max_tokens, "repeats": repeats, "server_threads": threads, "environment": env,
              "rows": rows, "speedup": many["tokens_per_second"] / one["tokens_per_second"],
              "versus_batch": many["wall_seconds"] / batch["wall_seconds"],
              "cpu_speedup": _ratio(one["cpu_seconds"], many["cpu_seconds"]),
              "cpu_versus_batch": _ratio(many["cpu_seconds"], batch["cpu_seconds"]), "decode_kernels": kernels,
              "soak": soak}
    result["goals"] = {f"{clients} concurrent at least {SPEEDUP_GOAL:g}x one at a time":
                       result["speedup"] >= SPEEDUP_GOAL,
                       f"{clients} concurrent within {BATCH_GOAL:g}x of generate() {clients} at a time":
                       result["versus_batch"] <= BATCH_GOAL,
                       "outputs identical to generate()": all(r["identical_to_generate"] == 1.0 for r in rows.values())}
    result["files"] = write_outputs(out, "serve", to_markdown(result), result)
    return result


def _decode_kernels(model: Any) -> str:
    """The kernels this process's decode path measured (each process measures its own at start)."""
    from aogpt.decode.runner import describe_kernels
    from aogpt.inference import for_inference

    return describe_kernels(for_inference(model))


def _server_health(server: Server) -> dict[str, Any]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        conn.request("GET", "/health")
        return json.loads(conn.getresponse().read())
    except (OSError, http.client.HTTPException, ValueError):
        return {}
    finally:
        conn.close()


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


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
                      fmt_ratio(r["tokens_per_second"] / one), _s(r["wall_seconds"]), _s(r.get("cpu_seconds")),
                      _s(r.get("p50_latency")), _s(r.get("p99_latency")), _share(r.get("identical_to_one_at_a_time")),
                      _share(r.get("identical_to_generate"))])
    n = result["clients"]
    env = result["environment"]
    lines = [f"# aogpt bench serve: {n} clients, {result['requests']} requests of {result['max_tokens']} tokens in a "
             f"random order ({result['variant']}, {result['repeats']} round(s), median wall time)", "",
             markdown_table(["contender", "requests", "tokens/s", "vs one at a time", "wall", "CPU", "p50 latency",
                             "p99 latency", "identical to one at a time", "identical to generate()"], table), "",
             f"{n} concurrent clients: {fmt_ratio(result['speedup'])} the throughput of one request at a time (goal "
             f"at least {SPEEDUP_GOAL:g}x) and {fmt_ratio(result['versus_batch'])} the wall time of generate() on the "
             f"same requests {n} at a time (goal at most {BATCH_GOAL:g}x); in CPU time "
             f"{fmt_ratio(result['cpu_speedup'])} less than one at a time and {fmt_ratio(result['cpu_versus_batch'])} "
             f"that of generate() {n} at a time (CPU: the server's process for its rows, this one's for the "
             f"in-process rows).",
             "", "Goals: " + "; ".join(f"{goal}: {'met' if ok else 'NOT met'}" for goal, ok in result["goals"].items())
             + ".", "",
             f"Server: {result['server_threads']} torch thread(s). " + describe_environment(env)]
    kernels = result.get("decode_kernels") or {}
    if kernels.get("server") == kernels.get("in_process"):
        lines += ["", f"Decode kernels (the server's and this process's): {kernels.get('server')}."]
    else:  # each process measures its kernels at start; on a busy machine the choice can differ
        lines += ["", f"Decode kernels: the server's {kernels.get('server')}; this process's (the in-process rows) "
                  f"{kernels.get('in_process')}."]
    soak = result.get("soak")
    if soak:
        lines += ["", f"Soak: {soak['clients']} clients for {soak['seconds']:.0f} s: {soak['sent']} requests sent, "
                  f"{soak['answered']} answered, {soak['lost']} lost, {soak['duplicated']} duplicated, "
                  f"{soak['different_from_generate']} different from generate(); {soak['tokens_per_second']:.0f} "
                  f"tokens/s, latency p50 {_s(soak['p50_latency'])}, p99 {_s(soak['p99_latency'])}."]
    return "\n".join(lines)
