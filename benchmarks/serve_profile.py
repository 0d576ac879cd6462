"""Where a served batch's time goes: the engine serving N concurrent requests against `generate()`
decoding the same requests N at a time (one seed per sample), in one process, interleaved round by
round, as CPU seconds of the thread that does the work, split into parts.

    python benchmarks/serve_profile.py --checkpoint RUN [--clients 16] [--max-tokens 96] [--rounds 7]
                                       [--freeze] [--out bench-results/serve-batch/profile.json]

Parts (each timed around the library function that does it, on the working thread's CPU clock):
``forward`` (the decode path's step: linear layers, norms, the head, and within it ``attention``),
``stacking`` (laying the requests' rows end to end and their logits apart again, the engine only),
``planning`` (each generation's step counts and step layouts), ``draws`` (sampling the tokens),
``collector`` (Python's garbage collector on that thread), ``rest`` (everything else: each request's
own `generate` set-up and loop, the engine's loop and switches). Then the same N requests over HTTP
(uvicorn in a thread of this process, on the same engine): the event loop's CPU (``http``).

The lowest-CPU round of each contender is reported (another process on the core only ever slows a
round down). `--freeze` freezes the start-up heap for Python's collector first, as `aogpt serve`
does. It instruments functions by name, so it also runs on older trees of the library (the
baseline in docs/serve.md), given one whose `generate` takes a list of seeds.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import sys
import threading
import time
from pathlib import Path

import torch


def thread_cpu(tid: int) -> float:
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--freeze", action="store_true")
    p.add_argument("--label", default="")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    torch.set_num_threads(1)

    import aogpt.decode.runner as runner
    import aogpt.generation.decoder as decoder
    import aogpt.generation.generate as generation
    import aogpt.kv_cache as kv_cache
    import aogpt.serve.engine as engine_module
    from aogpt.checkpoint import load
    from aogpt.serve.engine import Engine, EngineLimits, Job, job_size
    from aogpt.serve.protocol import CompletionRequest, to_generate

    loaded = load(args.checkpoint)
    model, tokenizer, cfg = loaded.model, loaded.tokenizer, loaded.config
    kwargs = [to_generate(CompletionRequest(prompt="", max_tokens=args.max_tokens, seed=i), cfg, tokenizer,
                          max_samples=1)[0] for i in range(args.clients)]
    parts: collections.Counter = collections.Counter()
    worker: dict[str, int] = {}  # the thread whose parts are counted

    def timed(owner, name: str, part: str) -> None:
        if not hasattr(owner, name):
            return
        f = getattr(owner, name)

        def wrapper(*a, **k):
            if threading.get_ident() != worker.get("id"):
                return f(*a, **k)
            t = time.thread_time()
            try:
                return f(*a, **k)
            finally:
                parts[part] += time.thread_time() - t
        setattr(owner, name, wrapper)

    timed(runner.SmallStepModel, "forward_slots", "forward")
    timed(kv_cache.KVCache, "attend_rows", "attention")
    batching = sys.modules.get("aogpt.serve.batching")
    timed(batching.StackedCaches, "attend_rows", "attention (stacked)")
    timed(engine_module, "run_together", "stacking+forward")
    timed(generation, "step_counts", "planning")
    timed(decoder, "plan_steps", "planning")
    timed(decoder, "sample_tokens", "draws")
    timed(engine_module, "draw_together", "draws")

    def collector(phase: str, info: dict) -> None:
        if threading.get_ident() == worker.get("id"):
            if phase == "start":
                worker["gc"] = time.thread_time()
            else:
                parts["collector"] += time.thread_time() - worker.pop("gc", time.thread_time())
    gc.callbacks.append(collector)

    engine = Engine(model, EngineLimits(max_sequences=max(32, args.clients)), threads=1).start()
    kernels = getattr(getattr(engine.runner, "choice", None), "describe", lambda: "reference")()

    def served() -> None:
        jobs = [engine.submit(Job(kw, *job_size(kw, cfg), steps=False)) for kw in kwargs]
        for job in jobs:
            job.finished.wait()

    def batch() -> None:
        generation.generate(model, **{**kwargs[0], "seed": [kw["seed"] for kw in kwargs],
                                      "num_samples": len(kwargs), "batch_size": len(kwargs)})

    served()
    batch()
    if args.freeze:
        gc.collect()
        gc.freeze()
    rounds: dict[str, list[dict[str, float]]] = {"served": [], "batch": []}
    for _ in range(args.rounds):
        for name, run in (("batch", batch), ("served", served)):
            tid = engine._loop.native_id if name == "served" else threading.get_native_id()
            worker["id"] = engine._loop.ident if name == "served" else threading.get_ident()
            parts.clear()
            cpu = thread_cpu(tid) if name == "served" else time.thread_time()
            run()
            cpu = (thread_cpu(tid) if name == "served" else time.thread_time()) - cpu
            row = {"cpu": cpu, **parts}
            if "attention (stacked)" in row:  # the stacked forward's attention is the one that counts there
                row["attention"] = row.pop("attention (stacked)")
            if "stacking+forward" in row:
                row["stacking"] = row.pop("stacking+forward") - row.get("forward", 0.0)
            row["rest"] = cpu - sum(row.get(k, 0.0) for k in ("forward", "stacking", "planning", "draws", "collector"))
            rounds[name].append({k: round(v, 4) for k, v in row.items()})
    best = {name: min(rs, key=lambda r: r["cpu"]) for name, rs in rounds.items()}

    http_rounds = _http(engine, loaded, args, thread_cpu)
    engine.stop()
    result = {"label": args.label, "checkpoint": args.checkpoint, "clients": args.clients,
              "max_tokens": args.max_tokens, "rounds": args.rounds, "freeze": args.freeze, "decode_kernels": kernels,
              "best": best, "ratio": round(best["served"]["cpu"] / best["batch"]["cpu"], 3),
              "http": min(http_rounds, key=lambda r: r["engine"]), "all": rounds, "http_all": http_rounds,
              "cpu_class": _cpu_class(), "load_average": [round(x, 2) for x in os.getloadavg()]}
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(json.dumps({k: result[k] for k in ("label", "best", "ratio", "http", "decode_kernels", "load_average")}))


def _http(engine, loaded, args, thread_cpu) -> list[dict[str, float]]:
    """The same requests from N client threads over HTTP to uvicorn on this engine: CPU of the engine's
    thread and of the event loop's, per round."""
    import http.client

    import uvicorn

    from aogpt.cli.serve import bind
    from aogpt.serve.app import create_app

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_app(engine, loaded.tokenizer, "profile", own_engine=False),
                                           log_level="warning", lifespan="on"))
    loop = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    loop.start()
    while not server.started:
        time.sleep(0.01)
    port = sock.getsockname()[1]

    def ask(seed: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "", "max_tokens": args.max_tokens,
                                                            "seed": seed}), {"Content-Type": "application/json"})
        assert conn.getresponse().status == 200
        conn.close()

    out = []
    for _ in range(max(3, args.rounds // 2)):
        e0, l0 = thread_cpu(engine._loop.native_id), thread_cpu(loop.native_id)
        clients = [threading.Thread(target=ask, args=(i,)) for i in range(args.clients)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        out.append({"engine": round(thread_cpu(engine._loop.native_id) - e0, 3),
                    "http": round(thread_cpu(loop.native_id) - l0, 3)})
    server.should_exit = True
    loop.join(30)
    return out


def _cpu_class() -> str:
    from aogpt import capability

    return capability.cpu_class()


if __name__ == "__main__":
    main()
