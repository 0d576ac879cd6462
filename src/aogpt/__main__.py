"""`python -m aogpt ...` (also what `torchrun -m aogpt train ...` runs)."""

from aogpt.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
