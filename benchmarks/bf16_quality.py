"""bf16 against fp32 training quality: the quickstart preset, several seeds per precision.

Why: `dtype auto` trains in bf16 autocast on CPUs with native bf16 (`aogpt.precision.auto_precision`).
That is only a good default if the model it trains is as good as fp32's. This script trains the
quickstart preset (a fixed number of steps, no time limit, one thread per run) for every
(seed, precision) pair, the precisions alternating seed by seed so a change in the machine's load
hits both alike, and compares the validation curves: the mean difference between precisions
against the seed-to-seed spread within each.

    python benchmarks/bf16_quality.py --data data/shakespeare-bpe512 --out bench-results/bf16-quality

Writes OUT/bf16_quality.{json,md,png}; the runs' directories stay under OUT/runs (rerunning skips
finished runs, so an interrupted sweep resumes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

KEY = "val/l2r/ema"


def train(data: Path, run: Path, precision: str, seed: int, steps: int, eval_every: int,
          compile_lowp: str = "on") -> float:
    """One `aogpt train` run in its own one-thread process; its wall time in seconds. fp32 runs take
    the plain eager path; bf16/auto runs `--compile compile_lowp` (the fast path a long run takes)."""
    if (run / "done.json").is_file():
        return json.loads((run / "done.json").read_text())["seconds"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "aogpt", "train", "--preset", "quickstart", "--variant", "aogpt",
           "--data", str(data), "--out", str(run), "--dtype", precision, "--seed", str(seed),
           "--max-steps", str(steps), "--max-minutes", "0", "--eval-interval", str(eval_every),
           "--ckpt-interval", str(steps), "--keep-last", "1", "--no-progress",
           "--compile", "off" if precision in ("fp32", "float32") else compile_lowp]
    if run.exists():
        import shutil

        shutil.rmtree(run)  # an unfinished run: start it again
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    (run / "done.json").write_text(json.dumps({"seconds": seconds}))
    return seconds


def curve(run: Path, key: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("kind") == "eval" and key in row:
            out[int(row["step"])] = float(row[key])
    return out


def summarize(curves: dict[str, list[dict[int, float]]], seconds: dict[str, list[float]]) -> dict:
    """Per step: each precision's mean and seed standard deviation, and the difference of the means."""
    precisions = list(curves)
    steps = sorted(set.intersection(*(set(c) for runs in curves.values() for c in runs)))
    rows = []
    for s in steps:
        vals = {p: [c[s] for c in curves[p]] for p in precisions}
        row = {"step": s}
        for p in precisions:
            row[f"{p}_mean"] = statistics.fmean(vals[p])
            row[f"{p}_sd"] = statistics.stdev(vals[p]) if len(vals[p]) > 1 else 0.0
        a, b = precisions[0], precisions[1]
        row["difference"] = row[f"{b}_mean"] - row[f"{a}_mean"]
        row["spread"] = max(row[f"{p}_sd"] for p in precisions)
        row["within_spread"] = abs(row["difference"]) <= 2 * row["spread"]
        rows.append(row)
    return {"key": KEY, "precisions": precisions, "rows": rows,
            "seconds": {p: statistics.median(v) for p, v in seconds.items()}}


def markdown(summary: dict, seeds: list[int], load: list[float]) -> str:
    """The comparison table, in nats per token."""
    a, b = summary["precisions"]
    lines = [f"# bf16 against fp32 training: quickstart preset, seeds {seeds}", "",
             f"Validation loss ({summary['key']}, nats per token, EMA weights) mean ± seed standard deviation; "
             f"difference = {b} − {a}; 'within' means |difference| ≤ 2 × the larger seed spread. "
             f"One thread per run, runs alternating precision; load average at start/end "
             f"{load[0]:.2f} / {load[1]:.2f}.", "",
             f"| step | {a} | {b} | difference | within |", "|---|---|---|---|---|"]
    for r in summary["rows"]:
        lines.append(f"| {r['step']} | {r[f'{a}_mean']:.4f} ± {r[f'{a}_sd']:.4f} | {r[f'{b}_mean']:.4f} ± "
                     f"{r[f'{b}_sd']:.4f} | {r['difference']:+.4f} | {'yes' if r['within_spread'] else 'no'} |")
    sec = summary["seconds"]
    lines += ["", f"Median wall time of a run: {a} {sec[a]:.0f} s, {b} {sec[b]:.0f} s "
              f"({sec[a] / sec[b]:.2f}x)."]
    return "\n".join(lines)


def plot(curves: dict[str, list[dict[int, float]]], path: Path, key: str = KEY) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for colour, (p, runs) in zip(("tab:blue", "tab:orange"), curves.items(), strict=False):
        for i, c in enumerate(runs):
            xs = sorted(c)
            ax.plot(xs, [c[x] for x in xs], color=colour, alpha=0.8, label=p if i == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel(f"{key} (nats / token)")
    ax.set_title("quickstart preset: bf16 autocast against fp32, one line per seed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="prepared bpe:512 Shakespeare")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--precisions", default="float32,bfloat16")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--key", default=KEY, help=f"the validation curve compared (default {KEY}; e.g. val/any/ema)")
    p.add_argument("--compile", default="on", choices=("on", "off"),
                   help="torch.compile the low-precision runs (default on: the fast path; fp32 runs stay eager)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time, each in its own one-thread process")
    p.add_argument("--skip", default="", help="PRECISION:SEED,... runs not to start (e.g. one already running)")
    p.add_argument("--report", action="store_true",
                   help="train nothing: compare the runs' curves as far as they got (steps every run reached)")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    precisions = args.precisions.split(",")
    skip = {tuple(x.split(":")) for x in args.skip.split(",") if x}
    load = [os.getloadavg()[0]]
    # seeds in rounds, both precisions per round
    todo = [(q, seed) for seed in seeds for q in precisions if (q, str(seed)) not in skip]
    seconds: dict[str, list[float]] = {q: [] for q in precisions}
    if not args.report:
        from concurrent.futures import ThreadPoolExecutor

        def one(q: str, seed: int) -> tuple[str, float]:
            return q, train(args.data, args.out / "runs" / f"{q}-seed{seed}", q, seed, args.steps, args.eval_every,
                            args.compile)

        with ThreadPoolExecutor(args.jobs) as pool:
            for q, sec in pool.map(lambda qs: one(*qs), todo):
                print(f"{q}: a run took {sec:.0f} s", flush=True)
    for q in precisions:  # every finished run's time, this invocation's or an earlier one's
        done = [args.out / "runs" / f"{q}-seed{seed}" / "done.json" for seed in seeds]
        seconds[q] = [json.loads(f.read_text())["seconds"] for f in done if f.is_file()] or [float("nan")]
    curves = {q: [curve(args.out / "runs" / f"{q}-seed{seed}", args.key) for seed in seeds] for q in precisions}
    load.append(os.getloadavg()[0])
    summary = summarize(curves, seconds)
    summary["key"] = args.key
    summary.update(seeds=seeds, steps=args.steps, load_average=load, curves=curves)
    stem = "bf16_quality" + ("" if args.key == KEY else "_" + args.key.replace("/", "_"))
    (args.out / f"{stem}.json").write_text(json.dumps(summary, indent=1))
    (args.out / f"{stem}.md").write_text(markdown(summary, seeds, load) + "\n")
    plot(curves, args.out / f"{stem}.png", args.key)
    print(markdown(summary, seeds, load))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
