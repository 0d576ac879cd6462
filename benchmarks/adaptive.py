"""Puzzle solving with random, left-to-right and adaptive unmasking orders, and the log-likelihood
spread across orders.

Runs `aogpt bench adaptive` (the code lives in src/aogpt/bench/; every flag of it works here, e.g. --quick).
"""

import sys

from aogpt.cli import main

if __name__ == "__main__":  # spawned worker processes re-import this file: run nothing then
    sys.exit(main(["bench", "adaptive", *sys.argv[1:]]))
