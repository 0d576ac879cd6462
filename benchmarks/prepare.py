"""Time `prepare shakespeare --tokenizer gpt2` (target: <= 10 s on 2 CPU cores).

Each run starts cold inside this process: the GPT-2 encoding is rebuilt from its files and the plays
are re-read and re-cleaned, so the figure is what `aogpt prepare` costs minus interpreter start-up
and imports. Also prints the CPU time (a figure that other load on the machine inflates less than
wall time; compare it with the load average shown) and times the stages separately for one run.

    python benchmarks/prepare.py [--runs 5] [--tokenizer gpt2] [--corpus shakespeare] [--json]

`--workers-bench` instead times multi-worker tokenization on a synthetic corpus (`--synthetic-mb`
of random-word documents in a .jsonl, with sharding on): in-process with the tokenizer's own threads,
in-process single-threaded (gpt2 only: tiktoken threads), and `--workers` spawned processes
(start-up included), interleaved run by run, medians of `--runs`, tokens/s and the speed-up over
one thread.

    python benchmarks/prepare.py --workers-bench [--workers 2] [--synthetic-mb 40] [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from aogpt.data import shards
from aogpt.data import tokenizer as tk
from aogpt.data.corpora import load_corpus
from aogpt.data.shards import split_pieces

# aogpt.data.prepared (and torch with it) is imported inside the functions: spawned tokenizer workers
# re-import this script as their main module, and a light one keeps their start-up as cheap as under the CLI.


def prepare(*args, **kw) -> dict:
    from aogpt.data.prepared import prepare as _prepare

    return _prepare(*args, **kw)


def _stages(corpus: str, spec: str) -> dict[str, float]:
    t0 = time.perf_counter()
    docs = list(load_corpus(corpus).documents())
    t1 = time.perf_counter()
    tk._gpt2_encoding.cache_clear()
    tok = tk.load_tokenizer(spec) if not spec.startswith("bpe:") else tk.train_bpe(docs, int(spec[4:]))
    t2 = time.perf_counter()
    tok.encode_batch([p for d in docs for p in split_pieces(d)])
    t3 = time.perf_counter()
    return {"read_and_clean_s": t1 - t0, "tokenizer_s": t2 - t1, "encode_s": t3 - t2}


def _synthetic(path: Path, megabytes: float, seed: int = 0) -> int:
    """A .jsonl of random-word documents (100-5000 words), about `megabytes` MB; returns its characters."""
    import random

    rng = random.Random(seed)
    words = [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(5000)
    ] + "the of and to in a is that for it as was with be by on not".split() * 50
    chars = 0
    with open(path, "w", encoding="utf-8") as f:
        while chars < megabytes * 1e6:
            text = " ".join(rng.choices(words, k=rng.randint(100, 5000)))
            text = ".\n".join(text[i : i + 400] for i in range(0, len(text), 400)) + ".\n"
            f.write(json.dumps({"text": text}) + "\n")
            chars += len(text)
    return chars


def workers_bench(args: argparse.Namespace) -> None:
    modes = {"in-process, tokenizer threads": (1, None), "in-process, 1 thread": (1, 1)}
    modes[f"{args.workers} worker processes"] = (args.workers, None)
    times: dict[str, list[float]] = {m: [] for m in modes}
    meta: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "synthetic.jsonl"
        chars = _synthetic(corpus, args.synthetic_mb)
        tk.load_tokenizer(args.tokenizer)  # warm the GPT-2 encoding cache for every mode alike
        for r in range(args.runs):
            for name, (workers, threads) in modes.items():
                tk.GPT2Tokenizer.threads = threads
                t = time.perf_counter()
                meta = prepare(
                    str(corpus),
                    args.tokenizer,
                    Path(tmp) / f"out-{r}-{workers}-{threads}",
                    workers=workers,
                    shard_tokens=2_000_000,
                    progress=False,
                )
                times[name].append(time.perf_counter() - t)
                tk.GPT2Tokenizer.threads = None
    tokens = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
    med = {m: statistics.median(ts) for m, ts in times.items()}
    single = med["in-process, 1 thread"]
    result = {
        "benchmark": "prepare-workers",
        "tokenizer": args.tokenizer,
        "chars": chars,
        "tokens": tokens,
        "cpus": shards.default_workers(None),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "runs": args.runs,
        "median_s": {m: round(v, 3) for m, v in med.items()},
        "tokens_per_s": {m: round(tokens / v) for m, v in med.items()},
        "speedup_over_1_thread": {m: round(single / v, 3) for m, v in med.items()},
    }
    head = f"prepare {chars / 1e6:.0f} MB synthetic --tokenizer {args.tokenizer}"
    print(f"{head}: {tokens:,} tokens, medians of {args.runs} interleaved runs")
    for m in modes:
        print(f"  {m:30s} {med[m]:6.2f} s  {tokens / med[m] / 1e6:5.2f} M tokens/s  x{single / med[m]:.2f}")
    print(f"  {result['cpus']} CPUs; load average {result['load_avg_1m']}")
    if args.json:
        print(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--corpus", default="shakespeare")
    ap.add_argument("--tokenizer", default="gpt2")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--workers-bench", action="store_true", help="time 1 vs N workers on a synthetic corpus")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--synthetic-mb", type=float, default=40.0)
    args = ap.parse_args()
    if args.workers_bench:
        workers_bench(args)
        return

    times, cpu, meta = [], [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            tk._gpt2_encoding.cache_clear()
            t, c = time.perf_counter(), time.process_time()
            meta = prepare(args.corpus, args.tokenizer, Path(tmp) / f"run{i}", progress=False)
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
    stages = _stages(args.corpus, args.tokenizer)
    tokens = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
    median = statistics.median(times)
    result = {
        "benchmark": "prepare",
        "corpus": args.corpus,
        "tokenizer": args.tokenizer,
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "runs_s": [round(t, 3) for t in times],
        "median_s": round(median, 3),
        "median_cpu_s": round(statistics.median(cpu), 3),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "target_s": 10.0,
        "median_over_target": round(median / 10.0, 3),
        "tokens": tokens,
        "tokens_per_s": round(tokens / median),
        **{k: round(v, 3) for k, v in stages.items()},
    }
    print(f"prepare {args.corpus} --tokenizer {args.tokenizer}: median {median:.2f} s over {args.runs} runs")
    print(f"  {tokens:,} tokens, {tokens / median / 1e6:.2f} M tokens/s, {result['cpus']} CPUs; target 10 s")
    print(f"  CPU time (all threads) median {result['median_cpu_s']:.2f} s; load average {result['load_avg_1m']}")
    print("  stages: " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
