"""The HTTP server under concurrent clients against one request at a time, and a bounded soak.

Runs `aogpt bench serve` (the code lives in src/aogpt/bench/; every flag of it works here, e.g. --quick).
"""

import sys

from aogpt.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "serve", *sys.argv[1:]]))
