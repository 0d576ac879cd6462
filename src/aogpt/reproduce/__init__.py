"""`aogpt reproduce`: the paper's findings re-run at CPU scale, compared, and judged by the numbers.

    findings.py  the findings as data: runs, checks (claims), plots; the shared run registry
    scale.py     model size, steps and analysis sizes (default ~1 hour on 2 cores; quick ~1 minute)
    runner.py    resumable, interleaved training of the runs (Trainer.fit in pieces), budgets
    analyses.py  ensembles (Finding 6), generation perplexity (8.2), generation speed (7, 8.1)
    results.py   measurements -> checks -> verdicts (`aogpt.stats`; reads only files: a report can be rebuilt)
    report.py    DIR/report.json and the figures; markdown.py renders the same as DIR/report.md
    compare.py   overlay the curves of any runs and tabulate their final metrics (`aogpt compare`)
    pipeline.py  `reproduce(...)`: all of the above in one call

See docs/reproduce.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"compare_runs": "compare", "read_run": "compare", "FINDINGS": "findings", "RUNS": "findings",
            "reproduce": "pipeline", "DEFAULT": "scale", "QUICK": "scale", "Scale": "scale"}


def __getattr__(name: str) -> Any:  # imported on first use: `aogpt --help` stays fast
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = sorted(_EXPORTS)
