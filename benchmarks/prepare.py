"""Time `prepare shakespeare --tokenizer gpt2` (target: <= 10 s on 2 CPU cores).

Each run starts cold inside this process: the GPT-2 encoding is rebuilt from its files and the plays
are re-read and re-cleaned, so the figure is what `aogpt prepare` costs minus interpreter start-up
and imports. Also prints the CPU time (a figure that other load on the machine inflates less than
wall time; compare it with the load average shown) and times the stages separately for one run.

    python benchmarks/prepare.py [--runs 5] [--tokenizer gpt2] [--corpus shakespeare] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from aogpt import tokenizer as tk
from aogpt.corpora import load_corpus
from aogpt.data import prepare, split_pieces


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--corpus", default="shakespeare")
    ap.add_argument("--tokenizer", default="gpt2")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

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
