"""How far our forward pass is from the reference implementation's vectors, written as one results file.

Why: docs/checkpoints.md quotes how close our logits come to the reference code's on its fixture
checkpoints; the test suite only asserts a tolerance (1e-5 in float32, 1e-10 in float64), so the
distance itself is measured here and written to JSON, which the suite's figure check compares the
document with. The vectors are the fixture's (`tests/fixtures/reference-checkpoints/`, produced by
running the reference code); nothing here comes from our own outputs but the side being measured.

    python benchmarks/reference_conformance.py --out bench-results/reference/conformance.json

For each architecture (AO-GPT, σ-GPT), weight set (EMA, raw) and precision the fixture has vectors
for, the largest absolute difference of the logits of all slots and of the per-token losses, loaded
both ways the tests load them: `aogpt.reference.load_reference` and `aogpt.load` of the imported
directory.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

import aogpt
from aogpt.capability import cpu_class
from aogpt.reference import import_reference, load_reference

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "reference-checkpoints"
ARCH = {"ao": "ckpt_aogpt.pt", "sg": "ckpt_sigmagpt.pt"}
DTYPES = {"f32": torch.float32, "f64": torch.float64}
WAYS = ("load_reference", "imported")


def distances(model: torch.nn.Module, expected: dict[str, np.ndarray], key: str, suffix: str) -> dict[str, float]:
    """Largest |ours - reference| of the logits of all slots and of the per-token losses."""
    idx, orders = torch.from_numpy(expected["idx"]), torch.from_numpy(expected["orders"])
    with torch.no_grad():
        logits, losses = model(idx, orders, with_last_slot=True)
    return {
        "logits": float((logits.double() - torch.from_numpy(expected[f"{key}_logits_{suffix}"]).double()).abs().max()),
        "loss_per_token": float(
            (losses.double() - torch.from_numpy(expected[f"{key}_loss_tok_{suffix}"]).double()).abs().max()),
    }


def _shown(path: Path) -> str:
    """The path relative to the repository when it lies inside it (results files name no home folders)."""
    root = Path(__file__).resolve().parents[1]
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def measure(fixture: Path) -> dict[str, Any]:
    expected = dict(np.load(fixture / "expected.npz"))
    cases: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch, file in ARCH.items():
            imported = import_reference(fixture / file, Path(tmp) / arch, warn=lambda m: None)["out"]
            for weights in ("ema", "raw"):
                for suffix, dtype in DTYPES.items():
                    key = f"{arch}_{weights}"
                    if f"{key}_logits_{suffix}" not in expected:
                        continue
                    model, _ = load_reference(fixture / file, weights=weights, dtype=dtype)
                    loaded = aogpt.load(imported, weights=weights, dtype=dtype).model
                    cases.append({"arch": arch, "weights": weights, "dtype": suffix,
                                  "load_reference": distances(model, expected, key, suffix),
                                  "imported": distances(loaded, expected, key, suffix)})
    worst = {
        suffix: {what: max(c[way][what] for c in cases if c["dtype"] == suffix for way in WAYS)
                 for what in ("logits", "loss_per_token")}
        for suffix in DTYPES
    }
    return {"written_by": "benchmarks/reference_conformance.py", "fixture": _shown(fixture),
            "max_abs_difference": worst, "cases": cases,
            "environment": {"torch": torch.__version__, "python": platform.python_version(), "cpu_class": cpu_class(),
                            "machine": platform.machine(), "threads": torch.get_num_threads()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fixture", type=Path, default=FIXTURE, help="the reference checkpoints' fixture directory")
    p.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    args = p.parse_args()
    result = measure(args.fixture.resolve())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    worst = result["max_abs_difference"]
    print(f"largest difference of the logits: float32 {worst['f32']['logits']:.2g},"
          f" float64 {worst['f64']['logits']:.2g}; of the per-token losses:"
          f" {worst['f32']['loss_per_token']:.2g}, {worst['f64']['loss_per_token']:.2g};"
          f" wrote {args.out}")


if __name__ == "__main__":
    main()
