"""The gap length an any-order model chooses, against the true one and a fixed guess.

Runs `aogpt bench gap-length` (the code lives in src/aogpt/bench/; every flag of it works here).
``--alphabet-corpus FILE`` instead writes the positive control's corpus (docs/generation.md, "Gaps of
unknown length"): 3,000 documents of 50..70 letters of the alphabet in cyclic order, separated by
spaces, each starting at a random letter (seed 0), one document per blank-line-separated block. There
the text after a gap says exactly how many letters are missing, so a model that has learnt the text
knows every gap's length.
"""

import random
import string
import sys
from pathlib import Path

from aogpt.cli import main


def alphabet_corpus(path: Path, documents: int = 3000, seed: int = 0) -> None:
    rng = random.Random(seed)
    docs = []
    for _ in range(documents):
        start = rng.randrange(26)
        docs.append(" ".join(string.ascii_lowercase[(start + i) % 26] for i in range(rng.randint(50, 70))))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--alphabet-corpus"] and len(sys.argv) == 3:
        alphabet_corpus(Path(sys.argv[2]))
        sys.exit(0)
    sys.exit(main(["bench", "gap-length", *sys.argv[1:]]))
