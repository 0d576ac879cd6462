"""The recipe sweep that chose the quickstart preset (its table is in docs/training.md).

Runs `aogpt bench recipe` (the code lives in src/aogpt/bench/training/recipe.py; every flag of it works here),
e.g. `python benchmarks/recipe.py --cpu-seconds 600 --eval-bytes 100000 --out runs/recipe`.
"""

import sys

from aogpt.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "recipe", *sys.argv[1:]]))
