"""Keep freed CPU memory for the next step instead of handing it back to the operating system.

glibc's malloc serves large blocks (above a threshold that starts at 128 KiB) with fresh `mmap`s and
returns them with `munmap` when they are freed. A training or decode step frees and re-allocates
tensors of the same sizes every time, so each step's activations land on new pages, and every page
faults on its first touch: measured on the quickstart's AO-GPT step (one thread), about 13,000 page
faults and 20 ms of kernel time a step, besides the cold caches. Raising the mmap and trim
thresholds keeps those blocks in the heap, where the next step reuses them: about 130 faults a step.
The cost is that the process keeps its peak heap until it exits: what a training run holds anyway,
but not what a long-lived server should, so `aogpt serve` keeps glibc's defaults (the command line decides).
Other platforms and C libraries are left as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest allowed value on 64-bit: blocks up to 32 MiB stay in the heap
TRIM_THRESHOLD = 2**30  # free memory at the heap's top kept up to 1 GiB

_done = False


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (once); False where that is not glibc."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD,
                                                                                         TRIM_THRESHOLD))
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt
        return False
    _done = ok
    return ok
