"""What Python's garbage collector costs `aogpt serve`'s engine thread, with the start-up heap frozen
(as the server does) and without (the freeze turned off), under N concurrent clients.

    python benchmarks/serve_collector.py --checkpoint RUN [--clients 16] [--max-tokens 96] [--rounds 6]
                                         [--out bench-results/serve-batch/collector.json]

Each variant is a real `aogpt serve` process (one torch thread) whose engine thread records, through
`gc.callbacks`, the CPU time of every collection and its generation; the clients send the same N
seeded requests at once, round after round. Reported per variant: the collections' seconds and
counts, and the server process's CPU seconds, in the first round after start and per round after it;
then, the server idle, the time of one full collection (`gc.collect()`, on a signal) and the objects it
walks and leaves frozen.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the server, with the engine thread's collections recorded to a file (and, for "thawed", no freeze)
BOOT = r"""
import gc, json, os, sys, threading, time
record, stats, started = sys.argv[1], {"seconds": 0.0, "collections": [0, 0, 0]}, {}
def watch(phase, info):
    if threading.current_thread().name != "aogpt-engine":
        return
    if phase == "start":
        started["t"] = time.thread_time()
    else:
        stats["seconds"] += time.thread_time() - started.pop("t", time.thread_time())
        stats["collections"][info["generation"]] += 1
        with open(record, "w") as f:
            json.dump(stats, f)
gc.callbacks.append(watch)
def full(signum, frame):  # SIGUSR1: time one full collection now (the server idle), in this thread
    t = time.thread_time()
    gc.collect()
    with open(record + ".tmp", "w") as f:
        json.dump({"seconds": time.thread_time() - t, "tracked": len(gc.get_objects()),
                   "frozen": gc.get_freeze_count()}, f)
    os.replace(record + ".tmp", record + ".full")
import signal
signal.signal(signal.SIGUSR1, full)
if sys.argv[2] == "thawed":
    gc.freeze = lambda: None
from aogpt.cli import main
sys.exit(main(sys.argv[3:]))
"""


def run(variant: str, args: argparse.Namespace) -> dict:
    from aogpt.bench.serve.clients import run_clients
    from aogpt.bench.serve.load import Server

    record = Path(tempfile.mkdtemp()) / "gc.json"

    class Instrumented(Server):
        def __init__(self) -> None:
            cmd = [sys.executable, "-c", BOOT, str(record), variant, "serve", "--checkpoint", str(args.checkpoint),
                   "--port", "0", "--threads", "1", "--max-sequences", str(max(32, args.clients)),
                   "--log-level", "warning"]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         env={**os.environ, "OMP_NUM_THREADS": "1"})
            url = self._first_line().split(" at ")[1].split()[0]
            self.host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
            self.port = int(port)

    server = Instrumented()
    bodies = [{"prompt": "", "max_tokens": args.max_tokens, "seed": i} for i in range(args.clients)]
    zero = {"seconds": 0.0, "collections": [0, 0, 0]}
    try:
        start = json.loads(record.read_text()) if record.exists() else zero  # collections while it loaded
        c0 = server.cpu_seconds()
        run_clients(server, bodies, args.clients)  # the first round after start
        first_cpu = server.cpu_seconds() - c0
        before = json.loads(record.read_text()) if record.exists() else zero
        cpu = []
        for _ in range(args.rounds):
            c0 = server.cpu_seconds()
            answers, _ = run_clients(server, bodies, args.clients)
            assert all(a.status == 200 for a in answers)
            cpu.append(server.cpu_seconds() - c0)
        after = json.loads(record.read_text())
        full = record.with_suffix(".json.full")
        server.proc.send_signal(signal.SIGUSR1)
        for _ in range(300):
            if full.exists():
                break
            time.sleep(0.1)
        collection = json.loads(full.read_text())
    finally:
        server.stop()
    return {"variant": variant, "first_round": {
                "collector_seconds": round(before["seconds"] - start["seconds"], 4),
                "collections": [a - b for a, b in zip(before["collections"], start["collections"], strict=True)],
                "server_cpu": round(first_cpu, 3)},
            "full_collection": {k: round(v, 4) for k, v in collection.items()},
            "collector_seconds": round(after["seconds"] - before["seconds"], 4),
            "collections": [a - b for a, b in zip(after["collections"], before["collections"], strict=True)],
            "server_cpu_min": round(min(cpu), 3), "server_cpu_median": round(statistics.median(cpu), 3),
            "server_cpu": [round(c, 3) for c in cpu]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    from aogpt import capability

    variants = [run(v, args) for v in ("frozen", "thawed", "frozen", "thawed")]  # interleaved
    result = {"clients": args.clients, "max_tokens": args.max_tokens, "rounds": args.rounds,
              "cpu_class": capability.cpu_class(), "load_average": [round(x, 2) for x in os.getloadavg()],
              "variants": variants,
              "frozen": _pool([v for v in variants if v["variant"] == "frozen"]),
              "thawed": _pool([v for v in variants if v["variant"] == "thawed"])}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("frozen", "thawed", "load_average")}))


def _pool(runs: list[dict]) -> dict:
    rounds = sum(len(r["server_cpu"]) for r in runs)
    first = [r["first_round"] for r in runs]
    return {"full_collection_seconds": round(statistics.mean(r["full_collection"]["seconds"] for r in runs), 4),
            "objects_walked": round(statistics.mean(r["full_collection"]["tracked"] for r in runs)),
            "objects_frozen": round(statistics.mean(r["full_collection"]["frozen"] for r in runs)),
            "first_round_collector_seconds": round(statistics.mean(f["collector_seconds"] for f in first), 4),
            "first_round_full_collections": sum(f["collections"][2] for f in first),
            "first_round_server_cpu": round(statistics.mean(f["server_cpu"] for f in first), 3),
            "collector_seconds_per_round": round(sum(r["collector_seconds"] for r in runs) / rounds, 4),
            "full_collections": sum(r["collections"][2] for r in runs), "rounds": rounds,
            "server_cpu_median": round(statistics.median(c for r in runs for c in r["server_cpu"]), 3)}


if __name__ == "__main__":
    main()
