"""Cost of one exact sequence likelihood.

Runs `aogpt bench density` (the code lives in src/aogpt/bench/; every flag of it works here, e.g. --quick).
"""

import sys

from aogpt.cli import main

if __name__ == "__main__":  # spawned worker processes re-import this file: run nothing then
    sys.exit(main(["bench", "density", *sys.argv[1:]]))
