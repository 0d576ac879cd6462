"""Cost of one exact sequence likelihood: decoder one pass against encoder n passes.

A thin wrapper around `aogpt bench density` (src/aogpt/bench/, docs/benchmarks.md); every flag of that
command works here, e.g.

    python benchmarks/density.py [--quick] [--out DIR] [--json]
"""

from __future__ import annotations

import sys

from aogpt.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "density", *sys.argv[1:]]))
