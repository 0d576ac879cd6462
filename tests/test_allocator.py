"""`aogpt.allocator`: freed tensors are reused, not mapped afresh (page faults counted, not timed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CODE = r"""
import ctypes, sys, torch

class MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2 (malloc.h)
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "keep":
    from aogpt.allocator import keep_freed_memory
    assert keep_freed_memory()
before = libc.mallinfo2().hblkhd
held = torch.empty(4 * 2**20)  # 16 MiB, the size of a training step's larger activations
print((libc.mallinfo2().hblkhd - before) / 2**20)
"""


def _has_mallinfo2() -> bool:
    try:
        import ctypes

        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _has_mallinfo2(), reason="glibc 2.33+'s mallinfo2")
def test_a_steps_blocks_come_from_the_heap_not_from_fresh_mappings():
    """glibc's statistics, not a timing: with its defaults a 16 MiB block is a fresh mapping (its pages
    fault in on first touch, and go back to the system when freed); with the thresholds raised it is
    served from the heap, where the next step finds it again."""
    def mapped_mib(mode: str) -> float:
        out = subprocess.run([sys.executable, "-c", CODE, mode], capture_output=True, text=True, check=True)
        return float(out.stdout.strip())

    assert mapped_mib("default") >= 16  # the test can tell: glibc maps it afresh by default
    assert mapped_mib("keep") == 0


def test_every_command_but_the_server_keeps_freed_memory(monkeypatch, tmp_path):
    import aogpt.cli as cli

    calls: list[int] = []
    monkeypatch.setattr(cli, "keep_freed_memory", lambda: calls.append(1) or True)
    missing = str(tmp_path / "missing")
    assert cli.main(["serve", "--checkpoint", missing]) == 2  # refused before it starts: no thresholds raised
    assert calls == []
    assert cli.main(["eval", "--checkpoint", missing]) == 2
    assert calls == [1]
