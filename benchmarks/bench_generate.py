"""Generation time against steps (paper Figure 5): AO-GPT, encoder MDM, AR gpt.

A thin wrapper around `aogpt bench generate` (src/aogpt/bench/, docs/benchmarks.md); every flag of that
command works here, e.g.

    python benchmarks/bench_generate.py [--quick] [--out DIR] [--json]
"""

from __future__ import annotations

import sys

from aogpt.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "generate", *sys.argv[1:]]))
