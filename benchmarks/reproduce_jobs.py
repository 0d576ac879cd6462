"""`aogpt reproduce` training in one process or in several side by side: which finishes first.

Why: the default reproduction trains 53 small runs (2 layers x 64 wide, batches of 32 x 64 tokens). A
run that small cannot keep two cores busy with its own matrix products, so one process with two
threads may be slower than two processes with one thread each, each training its own run
(`--jobs 2`, `aogpt.reproduce.jobs`). This script measures it on a subset: the same findings, seeds and
steps for every contender, each in a fresh directory, contenders interleaved round by round (the
order rotated) so a change in the machine's load hits all alike. Contenders (name: processes x threads):

    1x2   one process, two threads (torch's default on two cores)
    1x1   one process, one thread (OMP_NUM_THREADS=1, how the documented full run was made)
    2x1   --jobs 2, one thread each

    python benchmarks/reproduce_jobs.py --out bench-results/reproduce-jobs [--rounds 3] [--steps 300]

Writes OUT/reproduce_jobs.{json,md}: per contender the wall seconds of every round, their median, CPU
seconds (the processes and their children), and the ratio of medians to 1x2; the load average before
and after each timed command.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

CONTENDERS = {"1x2": (1, 2), "1x1": (1, 1), "2x1": (2, 1)}
SCRIPT = """
import dataclasses, sys
from aogpt.reproduce.pipeline import reproduce
from aogpt.reproduce.scale import DEFAULT
scale = dataclasses.replace(DEFAULT, steps=int(sys.argv[2]))
reproduce(sys.argv[1], sys.argv[5].split(","), seeds=int(sys.argv[3]), jobs=int(sys.argv[4]), scale=scale,
          show_progress=False)
"""


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(out: Path, name: str, steps: int, seeds: int, findings: str, data: Path | None) -> dict:
    jobs, threads = CONTENDERS[name]
    shutil.rmtree(out, ignore_errors=True)
    if data is not None:  # the prepared corpus, reused: only training is timed
        shutil.copytree(data, out / "data")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    load = os.getloadavg()
    cpu, start = children_cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-c", SCRIPT, str(out), str(steps), str(seeds), str(jobs), findings], env=env,
                   check=True)
    return {"wall": time.perf_counter() - start, "cpu": children_cpu() - cpu, "load_before": load[0],
            "load_after": os.getloadavg()[0]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=300, help="steps per run (a multiple of 6)")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--findings", default="f3", help="comma-separated (default f3: 2 runs per seed)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {name: [] for name in CONTENDERS}
    data = None
    names = list(CONTENDERS)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            work = args.out / f"work-{name}"
            got = timed(work, name, args.steps, args.seeds, args.findings, data)
            if data is None:
                data = args.out / "data"
                shutil.rmtree(data, ignore_errors=True)
                shutil.copytree(work / "data", data)
            results[name].append(got)
            print(f"round {r + 1} {name}: {got['wall']:.1f} s wall, {got['cpu']:.1f} s CPU, load "
                  f"{got['load_before']:.2f} -> {got['load_after']:.2f}", flush=True)
    base = statistics.median(x["wall"] for x in results["1x2"])
    summary = {name: {"processes": CONTENDERS[name][0], "threads": CONTENDERS[name][1],
                      "wall": [x["wall"] for x in rows], "median_wall": statistics.median(x["wall"] for x in rows),
                      "median_cpu": statistics.median(x["cpu"] for x in rows),
                      "vs_1x2": statistics.median(x["wall"] for x in rows) / base,
                      "load": [(x["load_before"], x["load_after"]) for x in rows]}
               for name, rows in results.items()}
    meta = {"steps": args.steps, "seeds": args.seeds, "findings": args.findings, "rounds": args.rounds,
            "cpus": os.cpu_count(), "python": sys.version.split()[0]}
    (args.out / "reproduce_jobs.json").write_text(json.dumps({"meta": meta, "contenders": summary}, indent=1))
    lines = [f"Findings {args.findings}, {args.seeds} seeds, {args.steps} steps per run, {args.rounds} interleaved "
             f"rounds, {os.cpu_count()} CPUs:", "",
             "| processes x threads | median wall s | wall s per round | median CPU s | wall / 1x2 |",
             "|---|---|---|---|---|"]
    for name, s in summary.items():
        lines.append(f"| {name} | {s['median_wall']:.1f} | {', '.join(f'{w:.1f}' for w in s['wall'])} | "
                     f"{s['median_cpu']:.1f} | {s['vs_1x2']:.2f} |")
    (args.out / "reproduce_jobs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":  # spawned worker processes re-import this file: run nothing then
    sys.exit(main())
