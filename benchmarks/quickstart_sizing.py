"""The quickstart's model size against the compute a 10-minute budget holds: the study behind `--preset auto`.

Why: a 10-minute budget holds several times less compute on an AVX2-only CPU (fp32, no bf16 units)
than on a CPU with bf16 units, and one model size cannot be right for both (Hoffmann et al. 2022: the
compute-optimal parameter count grows about as the square root of the compute). This script trains
the quickstart recipe at several widths on two compute levels, two seeds each, and judges every run
on the whole held-out text, in a random order and left to right (bits per byte), and by the share of
real words in 8 random-order samples, as the quickstart does.

Compute levels (each run is one process with one thread):

- ``avx2-fp32``: `AOGPT_CPU=avx2` with PyTorch's own limits (AVX2 kernels, oneDNN and MKL limited to
  AVX2), fp32: about the matrix rate of a 2-core AVX2 laptop or cloud machine;
- ``amx-bf16``: this machine as it is (Intel Xeon with AMX), bf16 autocast.

A "10-minute budget" is turned into steps per (width, level) once, by `calibrate`: the compiled
training step's median CPU time measured with `aogpt bench train` at one thread (CPU time, because a
one-thread step's CPU time is its time on a quiet machine, whatever else the shared machine runs), and
the steps that fit 600 s less 45 s for compiling (the fixed-size quickstart's runs of 2026-11-27
compiled in 34 s and 57 s) and 5% for validation and checkpoints (what a 10-minute `aogpt train
--max-minutes 10` spends besides steps).
The runs then train that many steps, so the shared machine's load (other jobs) cannot bias them;
several run side by side (``--jobs``).

    python benchmarks/quickstart_sizing.py calibrate --out bench-results/quickstart-sizing
    python benchmarks/quickstart_sizing.py run --data data/shakespeare-bpe512 --out bench-results/quickstart-sizing
    python benchmarks/quickstart_sizing.py report --out bench-results/quickstart-sizing

Writes OUT/calibration.json, OUT/runs/<level>-<width>-s<seed>/ (each with result.json when done;
rerunning skips finished runs), OUT/sizing.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

AVX2_ENV = {"AOGPT_CPU": "avx2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
            "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
LEVELS = {"avx2-fp32": {"env": AVX2_ENV, "dtype": "fp32"}, "amx-bf16": {"env": {}, "dtype": "bf16"}}
WIDTHS = {64: 2, 96: 2, 128: 2, 192: 3, 256: 4}  # width: heads (head size 32 to 64)
BUDGET_SECONDS = 600.0
COMPILE_SECONDS = 45.0
OVERHEAD_SHARE = 0.05  # validation every 250 steps and checkpoints, measured on README's 10-minute run
SAMPLES = 8


def env_for(level: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in AVX2_ENV}
    return {**base, **LEVELS[level]["env"], "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def aogpt(level: str, *args: str, log: Path | None = None) -> str:
    cmd = [sys.executable, "-m", "aogpt", *args]
    out = subprocess.run(cmd, env=env_for(level), check=True, capture_output=True, text=True)
    if log is not None:
        log.write_text(out.stdout + out.stderr)
    return out.stdout


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def calibrate(out: Path, widths: list[int], levels: list[str], steps: int) -> dict:
    """Median compiled step (seconds) and compile time per (level, width) at one thread."""
    path = out / "calibration.json"
    cal = json.loads(path.read_text()) if path.is_file() else {}
    for level in levels:
        for width in widths:
            key = f"{level}-w{width}"
            if key in cal:
                continue
            res = last_json(aogpt(level, "bench", "train", "--preset", "quickstart", "--variants", "aogpt",
                                  "--width", str(width), "--heads", str(WIDTHS[width]), "--vocab", "512",
                                  "--paths", "compiled", "--dtype", LEVELS[level]["dtype"], "--threads", "1",
                                  "--steps", str(steps), "--warmup", "3", "--no-limit", "--no-progress",
                                  "--out", str(out / "calibration" / key), "--json"))
            contender = next(iter(res["seconds_per_step"]))
            step = float(res["seconds_per_step"][contender])
            compile_s = float(res.get("compile_seconds", {}).get(contender, 0.0))
            cpu_step = float(res.get("cpu_seconds_per_step", {}).get(contender, step))
            fit = int((BUDGET_SECONDS - COMPILE_SECONDS) * (1 - OVERHEAD_SHARE) / cpu_step)
            cal[key] = {"level": level, "width": width, "step_seconds": step, "compile_seconds": compile_s,
                        "cpu_seconds": cpu_step, "steps": fit,
                        "load": res.get("environment", {}).get("load_average")}
            print(f"{key}: {cpu_step * 1e3:.0f} ms CPU a step ({step * 1e3:.0f} ms wall), compile {compile_s:.0f} s "
                  f"-> {fit} steps in 10 minutes",
                  flush=True)
            path.write_text(json.dumps(cal, indent=1))
    return cal


def curriculum(steps: int) -> str:
    """The quickstart's order curriculum scaled to the run: left to right for 2.5% of the steps, a
    Mallows ramp from nearly left to right to nearly uniform until 15%, then the mixture."""
    l2r = max(1, round(0.025 * steps))
    return f"l2r@{l2r},mallows:4..0.05@{max(l2r + 1, round(0.15 * steps))}"


def one_run(data: Path, run: Path, level: str, width: int, seed: int, steps: int) -> dict:
    done = run / "result.json"
    if done.is_file():
        return json.loads(done.read_text())
    if run.exists():
        import shutil

        shutil.rmtree(run)
    run.mkdir(parents=True)
    start = time.perf_counter()
    trained = last_json(aogpt(
          level, "train", "--preset", "quickstart", "--variant", "aogpt", "--data", str(data), "--out",
          str(run / "train"), "--seed", str(seed), "--dtype", LEVELS[level]["dtype"], "--max-steps", str(steps),
          "--max-minutes", "0", "--compile", "on", "--set", f"n_embd={width}", "--set", f"n_head={WIDTHS[width]}",
          "--set", f"curriculum={curriculum(steps)}", "--no-progress", "--json", log=run / "train.log"))
    train_s = time.perf_counter() - start
    ev = last_json(aogpt(level, "eval", "--checkpoint", str(run / "train"), "--data", str(data), "--order",
                         "l2r,random", "--num-orders", "1", "--seed", str(seed), "--json"))
    bpb = {r["order"]: r["bpb"] for r in ev["results"]}
    words = {}
    for order in ("random", "l2r"):
        s = last_json(aogpt(level, "sample", "--checkpoint", str(run / "train"), "--order", order, "--policy",
                            "count", "--temperature", "0.8", "--top-p", "0.9", "--seed", str(seed), "-n", str(SAMPLES),
                            "--no-progress", "--word-check", str(data), "--dtype", "fp32", "--json"))
        words[order] = s["word_share"]
    result = {"level": level, "width": width, "seed": seed, "steps": steps, "train_seconds": train_s,
              "bpb_random": bpb["random"], "bpb_l2r": bpb["l2r"], "words_random": words["random"],
              "words_l2r": words["l2r"], "curriculum": curriculum(steps),
              "params": trained.get("params")}
    done.write_text(json.dumps(result, indent=1))
    print(f"{run.name}: {steps} steps in {train_s / 60:.1f} min, random {bpb['random']:.3f} / l2r {bpb['l2r']:.3f} "
          f"bits/byte, real words {100 * words['random']:.0f}% / {100 * words['l2r']:.0f}%", flush=True)
    return result


def run_grid(data: Path, out: Path, widths: list[int], levels: list[str], seeds: list[int], jobs: int) -> None:
    cal = json.loads((out / "calibration.json").read_text())
    todo = [(level, width, seed) for seed in seeds for level in levels for width in widths]
    with ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(one_run, data, out / "runs" / f"{lv}-w{w}-s{s}", lv, w, s, cal[f"{lv}-w{w}"]["steps"])
                   for lv, w, s in todo]
        for f in futures:
            f.result()


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% interval (Student's t over seeds)."""
    from scipy import stats

    m = statistics.fmean(values)
    if len(values) < 2:
        return m, math.nan
    return m, float(stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)))


def report(out: Path) -> None:
    rows = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/result.json"))]
    cal = json.loads((out / "calibration.json").read_text())
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["level"], r["width"]), []).append(r)
    lines = ["| level | width | params | steps in 10 min | tokens per parameter | random bits/byte | l2r bits/byte "
             "| real words (random) | seeds |", "|---|---|---|---|---|---|---|---|---|"]
    table = []
    for (level, width), rs in sorted(groups.items()):
        rnd, l2r = interval([r["bpb_random"] for r in rs]), interval([r["bpb_l2r"] for r in rs])
        words = interval([r["words_random"] for r in rs])
        params = rs[0].get("params") or 0
        tokens = rs[0]["steps"] * 16 * 128
        table.append({"level": level, "width": width, "params": params, "steps": rs[0]["steps"],
                      "tokens_per_param": tokens / params if params else None, "random": rnd, "l2r": l2r,
                      "words_random": words, "seeds": [r["seed"] for r in rs],
                      "step_seconds": cal[f"{level}-w{width}"]["step_seconds"]})
        lines.append(f"| {level} | {width} | {params / 1e6:.2f} M | {rs[0]['steps']:,} | "
                     f"{tokens / params if params else float('nan'):.1f} | {rnd[0]:.3f} ± {rnd[1]:.3f} | "
                     f"{l2r[0]:.3f} ± {l2r[1]:.3f} | {100 * words[0]:.0f}% ± {100 * words[1]:.0f} | {len(rs)} |")
    md = "\n".join(lines)
    (out / "sizing.md").write_text(md + "\n")
    (out / "sizing.json").write_text(json.dumps({"table": table, "runs": rows, "calibration": cal}, indent=1))
    print(md)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, key, title in ((axes[0], "random", "random order"), (axes[1], "l2r", "left to right")):
            for level in sorted({t["level"] for t in table}):
                pts = [t for t in table if t["level"] == level]
                ax.errorbar([t["params"] / 1e6 for t in pts], [t[key][0] for t in pts],
                            yerr=[0 if math.isnan(t[key][1]) else t[key][1] for t in pts], marker="o", label=level,
                            capsize=3)
            ax.set_xscale("log")
            ax.set_xlabel("parameters (M)")
            ax.set_ylabel("held-out bits per byte")
            ax.set_title(f"{title}, 10 minutes")
            ax.legend()
        fig.tight_layout()
        fig.savefig(out / "sizing.png", dpi=110)
    except Exception as exc:  # a plot never breaks the report
        print(f"no plot: {exc}", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("calibrate", "run", "report"))
    p.add_argument("--out", type=Path, default=Path("bench-results/quickstart-sizing"))
    p.add_argument("--data", type=Path, default=Path("data/shakespeare-bpe512"))
    p.add_argument("--widths", default="96,128,192")
    p.add_argument("--levels", default=",".join(LEVELS))
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--calibration-steps", type=int, default=8)
    a = p.parse_args()
    widths = [int(w) for w in a.widths.split(",")]
    levels = a.levels.split(",")
    a.out.mkdir(parents=True, exist_ok=True)
    if a.what == "calibrate":
        calibrate(a.out, widths, levels, a.calibration_steps)
    elif a.what == "run":
        run_grid(a.data, a.out, widths, levels, [int(s) for s in a.seeds.split(",")], a.jobs)
    else:
        report(a.out)


if __name__ == "__main__":
    main()
