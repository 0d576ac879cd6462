"""Crash-safe file and directory writes.

A write goes to a temporary sibling and is renamed into place, so an interrupted run never leaves a
half-written file or directory where a good one stood.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aogpt.errors import AOGPTError


def ensure_writable_dir(path: Path) -> None:
    """Create `path` (and parents) or raise a user error saying why it cannot be written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AOGPTError(f"cannot create directory {path}: {exc.strerror}", "choose a writable --out") from None
    if not os.access(path, os.W_OK):
        raise AOGPTError(f"directory {path} is not writable", "choose a writable --out")


@contextlib.contextmanager
def atomic_dir(final: Path, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary directory that replaces `final` only if the block finishes without error."""
    final = Path(final)
    ensure_writable_dir(final.parent)
    if final.exists() and not overwrite:
        raise AOGPTError(f"{final} already exists", "remove it or pass --overwrite")
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        replace_dir(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def replace_dir(src: Path, final: Path) -> None:
    """Rename directory `src` over `final`; an existing `final` is moved aside first, then deleted."""
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
        os.replace(src, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, final)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would make shared checkpoints unreadable
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: Path, what: str = "file") -> Any:
    path = Path(path)
    if not path.is_file():
        raise AOGPTError(f"{what} {path} is missing", "check the path")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AOGPTError(f"{what} {path} is not valid JSON ({exc})", "recreate it") from None
