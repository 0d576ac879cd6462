"""README's quickstart figures, read from the quickstart's own logs into one results file.

Why: README quotes a quickstart run (steps, bits per byte, real words, the speed table) and the
figure check of the suite (`aogpt.figures`) compares every quoted number with a results file; the
quickstart prints these numbers but writes them nowhere as a whole, so this script reads them off a
log of `bash scripts/quickstart.sh` (the lines it prints, nothing recomputed) and writes them as
JSON. A run reported from another machine without its log goes in by hand with `--reported FILE`
(a JSON object with a "source" that says where its numbers come from); it is copied as it is.

    python benchmarks/quickstart_results.py \\
        --log amx=bench-results/quickstart/amx-native.log --log avx2-switch=bench-results/quickstart/avx2-switch.log \\
        --reported avx2-epyc=bench-results/quickstart/avx2-epyc-reported.json \\
        --out bench-results/quickstart/quickstart.json

A log's run is described by the matching `--about NAME=TEXT` (the machine, its load, the date:
the log does not say them).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any


def _one(pattern: str, text: str, *, cast: Any = str) -> Any:
    m = re.search(pattern, text, re.M)
    if m is None:
        raise SystemExit(f"error: the log has no line matching {pattern!r} (is it a whole quickstart log?)")
    return m.group(1) if cast is str else cast(m.group(1).replace(",", ""))


def _words(line_start: str, text: str) -> dict[str, Any]:
    """'words in all 8 samples: 238 of 262 words ... (91%)' after the line that starts a kind."""
    at = text.index(line_start)
    words = re.compile(r"words in (?:the filled words of )?all \d+ samples: (\d+) of (\d+) words.*\((\d+)%\)")
    m = words.search(text, at)
    if m is None:
        raise SystemExit(f"error: no word count after {line_start!r}")
    real, total, shown = map(int, m.groups())
    return {"real": real, "of": total, "share": real / total, "percent_printed": shown}


def read_log(path: Path) -> dict[str, Any]:
    """The figures one quickstart log printed, under the names README uses."""
    text = path.read_text(encoding="utf-8")
    train = re.search(
        r"trained aogpt \(([\d.]+) M parameters\) for ([\d,]+) of ([\d,]+) planned steps: ([\d,]+) tokens", text)
    if train is None:
        raise SystemExit(f"error: {path} has no 'trained aogpt' line (is it a whole quickstart log?)")
    tokens = int(train.group(4).replace(",", ""))
    run: dict[str, Any] = {
        "log": str(path),
        "precision": _one(r"^precision: (.*)$", text),
        "width": _one(r"^size: width (\d+)", text, cast=int),
        "heads": _one(r"^size: width \d+, (\d+) heads", text, cast=int),
        "params_millions": float(train.group(1)),
        "tokens_per_param_predicted": _one(r"^size: .*?: ([\d.]+) tokens per parameter", text, cast=float),
        "compile_seconds": _one(r"^compiled the training step in (\d+) s", text, cast=int),
        "steps": int(train.group(2).replace(",", "")),
        "planned_steps": int(train.group(3).replace(",", "")),
        "tokens": tokens,
        "tokens_millions": tokens / 1e6,
        # what `aogpt train` printed at its end: the first batches of the held-out text only
        "train_validation_bpb": {
            "l2r_ema": _one(r"left to right, ema weights: .*, ([\d.]+) bits/byte", text, cast=float),
            "any_ema": _one(r"any order, ema weights: .*, ([\d.]+) bits/byte", text, cast=float),
        },
        # step 3, `aogpt eval`: the whole held-out text
        "heldout_tokens": _one(r"order=l2r K=1 M=1: .* tokens (\d+)", text, cast=int),
        "bpb_l2r": _one(r"order=l2r K=1 M=1: .*bits/byte ([\d.]+)", text, cast=float),
        "bpb_random": _one(r"order=random K=1 M=1: .*bits/byte ([\d.]+)", text, cast=float),
        "words": {
            "l2r": _words("-- left to right:", text),
            "random": _words("-- random order:", text),
            "infill": _words("-- infilling:", text),
        },
        "passage_bpb": _one(r"the model gives the original ([\d.]+) bits/byte", text, cast=float),
        "speed": [
            {"n": int(n), "T": int(t), "aogpt_ms": float(a), "gpt_ms": None if g == "-" else float(g),
             "encoder_over_aogpt": float(e), "encoder_estimated": bool(est),
             "aogpt_over_gpt": float(r) if r else None}
            for n, t, a, g, e, est, r in re.findall(
                r"^\| (\d+) \| (\d+) \| auto \| ([\d.]+) \| ([\d.]+|-) \| ([\d.]+)x( \(est\.\))? \| "
                r"(?:([\d.]+)x)? *\|$", text, re.M)
        ],
        "speed_load_average": [json.loads(m) for m in re.findall(r"load average (\[[\d., ]+\])", text)],
    }
    wall = _one(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    *hours, minutes, seconds = wall.split(":")
    run["wall"] = {"printed": wall, "minutes": int(minutes) + 60 * int(hours[0] if hours else 0),
                   "seconds": float(seconds)}
    run["wall"]["total_seconds"] = 60 * run["wall"]["minutes"] + run["wall"]["seconds"]
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--log", action="append", default=[], metavar="NAME=LOG", help="a quickstart log")
    p.add_argument("--about", action="append", default=[], metavar="NAME=TEXT", help="the machine, load and date")
    p.add_argument("--reported", action="append", default=[], metavar="NAME=JSON", help="a run entered by hand")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    about = dict(a.split("=", 1) for a in args.about)
    runs: dict[str, Any] = {}
    for item in args.log:
        name, log = item.split("=", 1)
        runs[name] = {"about": about.get(name, ""), **read_log(Path(log))}
    for item in args.reported:
        name, file = item.split("=", 1)
        reported = json.loads(Path(file).read_text(encoding="utf-8"))
        if not reported.get("source"):
            raise SystemExit(f"error: {file} does not say where its numbers come from (add a \"source\")")
        runs[name] = {"reported_in": file, **reported}
    out = {"written_by": "benchmarks/quickstart_results.py (read off the logs; nothing recomputed)", "runs": runs}
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
