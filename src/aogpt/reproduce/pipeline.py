"""`reproduce`: data, plan, interleaved training, analyses and the report, in one call.

The output directory holds everything (DIR/data, DIR/runs, DIR/analyses, DIR/figures, DIR/plan.json,
DIR/report.md, DIR/report.json), so a rerun of the same command picks up where the last one stopped.
DIR/plan.json fixes the scale at the first invocation (with ``--budget-minutes``, the steps measured
then); a rerun with other scale options is refused rather than mixing two scales in one report.
Findings and seeds may be added by later invocations: their runs are trained, the rest reused.
A second `reproduce` into a DIR another one is working in is refused (`aogpt.io.directory_lock`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aogpt.device import resolve_device
from aogpt.errors import AOGPTError
from aogpt.io import directory_lock, ensure_writable_dir, read_json, write_json
from aogpt.reproduce.analyses import run_analysis
from aogpt.reproduce.findings import FINDINGS
from aogpt.reproduce.report import build_report
from aogpt.reproduce.runner import fit_budget, make_plan, prepare_data, resolve_findings, train_runs
from aogpt.reproduce.scale import DEFAULT, QUICK, Scale

PLAN_FILE = "plan.json"


def resolve_scale(out: Path, base: Scale, request: dict[str, Any], plan_for_budget: Any, data: Any,
                  jobs: int = 1) -> Scale:
    """The stored scale of DIR if the request matches it; else a new one (timed for a budget)."""
    path = out / PLAN_FILE
    if path.is_file():
        stored = read_json(path, "reproduction plan")
        if stored.get("request") != request:
            raise AOGPTError(f"{out} holds a reproduction made with other options ({stored.get('request')})",
                             "rerun with the same --quick / --budget-minutes / --device, or choose a new --out")
        return Scale.from_dict(stored["scale"])
    scale, timing = base, None
    if request["budget_minutes"] is not None:
        try:
            steps, timing = fit_budget(plan_for_budget(base), data, request["budget_minutes"], jobs=jobs)
        except AOGPTError:
            if base.seeds == 1 or request.get("seeds") is not None:
                raise
            base = base.with_seeds(1)  # the budget does not allow several seeds: one, and the report says so
            steps, timing = fit_budget(plan_for_budget(base), data, request["budget_minutes"], jobs=jobs)
        scale = base.with_steps(steps)
    write_json(path, {"request": request, "scale": scale.to_dict(), "budget_timing": timing})
    return scale


def reproduce(out: Path | str, findings: Sequence[str] | None = None, *, seeds: int | None = None,
              seed: int = 1337, quick: bool = False, budget_minutes: float | None = None, device: str = "cpu",
              show_progress: bool = True, jobs: int = 1, scale: Scale | None = None) -> dict[str, Any]:
    """Run the experiments behind `findings` (default all but the optional ones, see
    `aogpt.reproduce.findings.FINDINGS` and `OPTIONAL`) and write DIR/report.{md,json}; returns the
    report. seeds: every finding at seeds seed, seed + 1, ...; None: the scale's seeds for the
    training-recipe findings (`findings.RECIPE`) and the first for the others
    (`aogpt.reproduce.scale`). jobs: training processes side by side (`aogpt.reproduce.jobs`).
    scale: another `Scale` than the default (Python only; recorded in DIR/plan.json like --quick)."""
    if seeds is not None and seeds < 1:
        raise AOGPTError(f"--seeds must be at least 1, got {seeds}", "pass --seeds 1 or more")
    if jobs < 1:
        raise AOGPTError(f"--jobs must be at least 1, got {jobs}", "pass --jobs 1 or more")
    if budget_minutes is not None and (quick or not budget_minutes > 0):
        raise AOGPTError("--budget-minutes must be positive and cannot be combined with --quick",
                         "drop one of them")
    if scale is not None and (quick or budget_minutes is not None):
        raise AOGPTError("a given scale cannot be combined with --quick or --budget-minutes", "drop one of them")
    out = Path(out).expanduser()
    keys = resolve_findings(findings)
    resolve_device(device)  # an unknown device is refused before anything runs
    ensure_writable_dir(out)
    start = time.perf_counter()
    request = {"quick": quick, "budget_minutes": budget_minutes, "device": device}
    if seeds is not None:  # stored only when given, so that older directories keep matching
        request["seeds"] = seeds
    if scale is not None:
        request["scale"] = json.loads(json.dumps(scale.check().to_dict()))  # as plan.json will hold it
    # one writer per DIR: two would train the same runs twice and interleave their checkpoints
    with directory_lock(out, "aogpt reproduce", inside=True):
        base = scale or (QUICK if quick else DEFAULT)
        data = prepare_data(out, base.tokenizer, show_progress)
        vocab, text_vocab = int(data.tokenizer.padded_vocab_size), int(data.tokenizer.vocab_size)

        def plan_at(at: Scale) -> Any:
            count = at.seeds if seeds is None else seeds
            return make_plan(out, at, tuple(seed + i for i in range(count)), keys, vocab, device,
                             recipe_only=seeds is None, text_vocab=text_vocab)

        plan = plan_at(resolve_scale(out, base, request, plan_at, data, jobs))
        notes = train_runs(plan, data, show_progress, jobs)
        needed = list(dict.fromkeys(a for k in keys for a in FINDINGS[k].analyses))
        analyses = {name: run_analysis(plan.for_analysis(name), name, data, device, show_progress)
                    for name in needed}
        return build_report(plan, analyses, wall_seconds=time.perf_counter() - start, device=device, notes=notes,
                            request=request)
