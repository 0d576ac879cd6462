"""Training-step throughput of gpt, sigma, aogpt and encoder-mdm at equal size (issue 3).

A thin wrapper around `aogpt bench train` (src/aogpt/bench/, docs/benchmarks.md); every flag of that
command works here, e.g.

    python benchmarks/train_step.py [--quick] [--out DIR] [--json]
"""

from __future__ import annotations

import sys

from aogpt.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "train", *sys.argv[1:]]))
