"""Independent random streams from one user seed: `draw_seed(seed, *labels)` names each stream.

Evaluation's order draws, the harness's continuation draws and its generation requests each take
the stream of their own labels, so a result depends on the seed and on what is drawn, never on what
else ran before it or on how the work was batched.
"""

from __future__ import annotations

import hashlib
from typing import Any


def draw_seed(seed: int, *labels: Any) -> int:
    """A stable 63-bit seed for (seed, labels): independent streams per draw, whatever else runs."""
    digest = hashlib.blake2b(repr((seed, *labels)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1
