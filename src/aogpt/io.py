"""Crash-safe writes, one writer per output, tolerant reading of append-only logs.

- A write goes to a temporary sibling and is renamed into place, so an interrupted run never
  leaves a half-written file or directory where a good one stood (`atomic_dir`,
  `atomic_write_bytes`). Files and directories get the modes the umask allows, like any file the
  user creates (`follow_umask`), not the 0600/0700 of temporary files.
- `directory_lock(path, what)` holds an advisory lock on an output for as long as a command writes
  it: a second writer is refused with ``error: <path> is in use by process N (...)``; the lock of a
  process that died (even by kill -9) is released by the kernel and taken over by the next writer.
- `read_jsonl` reads an append-only log; a torn last line (a power cut, a full disk) is dropped
  with a warning instead of failing the reader.
- Failures of the operating system (a read-only disk, a path under /proc, no permission) become
  one-line user errors naming the path, even for root, for whom ``os.access`` always says yes.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aogpt.errors import AOGPTError

LOCK_FILE = ".aogpt.lock"


def ensure_writable_dir(path: Path, flag: str = "--out") -> None:
    """Create `path` (and parents) or raise a user error saying why it cannot be written."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AOGPTError(f"cannot create directory {path}: {exc.strerror or exc}", f"choose a writable {flag}") \
            from None
    if not os.access(path, os.W_OK):
        raise AOGPTError(f"directory {path} is not writable", f"choose a writable {flag}")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def follow_umask(path: Path) -> None:
    """Give `path` the mode a plain ``open``/``mkdir`` would (0666/0777 less the umask), so files
    written through temporary names (0600) or by libraries that restrict them stay readable by the
    people the user shares with."""
    full = 0o777 if Path(path).is_dir() else 0o666
    os.chmod(path, full & ~_umask())


def _os_error(action: str, path: Path, exc: OSError, flag: str) -> AOGPTError:
    return AOGPTError(f"cannot {action} {path}: {exc.strerror or exc}", f"choose a writable {flag}")


@contextlib.contextmanager
def atomic_dir(final: Path, overwrite: bool = True, flag: str = "--out") -> Iterator[Path]:
    """Yield a temporary directory that replaces `final` only if the block finishes without error."""
    final = Path(final)
    if final.name in ("", ".", ".."):
        raise AOGPTError(f"{str(final)!r} names no directory that can be replaced", f"give {flag} a folder name")
    ensure_writable_dir(final.parent, flag)
    if final.exists() and not overwrite:
        raise AOGPTError(f"{final} already exists", "remove it or pass --overwrite")
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    except OSError as exc:
        raise _os_error("write into", final.parent, exc, flag) from None
    try:
        yield tmp
        for item in tmp.rglob("*"):
            follow_umask(item)
        follow_umask(tmp)
        replace_dir(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def replace_dir(src: Path, final: Path) -> None:
    """Rename directory `src` over `final`; an existing `final` is moved aside first, then deleted."""
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
        os.replace(src, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, final)


def remove_stale_temporaries(directory: Path, prefix: str) -> list[Path]:
    """Delete what interrupted atomic writes left in `directory`: ``.<prefix>*.tmp-*`` and
    ``.<prefix>*.old-*`` entries. Only call it while holding the directory's lock (another writer's
    temporaries are not stale). Returns what was removed."""
    removed = []
    for pattern in (f".{prefix}*.tmp-*", f".{prefix}*.old-*"):
        for item in Path(directory).glob(pattern):
            if item.is_dir() and not item.is_symlink():
                shutil.rmtree(item, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    item.unlink()
            removed.append(item)
    return removed


def atomic_write_bytes(path: Path, data: bytes, flag: str = "--out") -> None:
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    except OSError as exc:
        raise _os_error("write", path, exc, flag) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would make shared files unreadable
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _os_error("write", path, exc, flag) from None
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
    except OSError as exc:
        raise AOGPTError(f"cannot read {what} {path}: {exc.strerror or exc}", "check the path") from None


def read_jsonl(path: Path, warn: bool = True) -> list[dict[str, Any]]:
    """The records of an append-only JSON-lines log. A last line that does not parse (torn by a
    crash mid-write) is dropped, with a warning on stderr; a bad line before the last means the
    file was damaged otherwise, which is a user error."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not an object")
        except ValueError:
            if i == len(lines) - 1:
                if warn:
                    print(f"warning: {path}: dropped a torn last line ({len(line)} characters; the writer was "
                          "interrupted)", file=sys.stderr)
                break
            raise AOGPTError(f"{path}: line {i + 1} is not a JSON record", "repair or remove that line") from None
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------- locks


def lock_file(path: Path, inside: bool = False) -> Path:
    """Where the lock of output `path` lives: ``<parent>/.<name>.lock`` beside it (outputs that are
    replaced by a rename, whose contents would move), or ``<path>/.aogpt.lock`` inside a directory
    that is only ever added to (a run directory)."""
    path = Path(path).absolute()
    return path / LOCK_FILE if inside else path.parent / f".{path.name}.lock"


def _holder(fd: int) -> str:
    """'process N (what, on host, since time)' from a lock file, as well as it can be read."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        return (f"process {int(info['pid'])} ({info.get('what', 'aogpt')} on {info.get('host', '?')}, "
                f"since {info.get('since', '?')})")
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (it is still starting)"


@contextlib.contextmanager
def directory_lock(path: Path, what: str, *, inside: bool = False, flag: str = "--out") -> Iterator[Path]:
    """Hold the advisory lock of output `path` (a directory or a file) while the block writes it.

    `what` says who holds it (``"aogpt train"``); a second process asking for the same lock gets
    ``AOGPTError("<path> is in use by process N (what, on host, since ...)")`` at once. The lock is
    ``flock`` on `lock_file(path, inside)`: the kernel releases it when its process ends, however
    it ends, so a lock left by a killed process is simply taken over. The lock file is removed on
    exit. Usage::

        with directory_lock(out, "aogpt reproduce"):
            ...  # write into out

    Only writers take it; readers (`aogpt eval`, `aogpt sample`) never wait for it.
    """
    path = Path(path)
    lock = lock_file(path, inside)
    ensure_writable_dir(lock.parent, flag)
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise _os_error("create the lock file", lock, exc, flag) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise AOGPTError(f"{path} is in use by {holder}",
                             f"wait for it to finish, or choose another {flag}") from None
        except OSError as exc:  # a file system without locks: go on unlocked rather than refuse
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                os.close(fd)
                raise _os_error("lock", lock, exc, flag) from None
            print(f"warning: cannot lock {lock} ({exc.strerror}); make sure no other command writes {path}",
                  file=sys.stderr)
        # the previous holder removes the file on exit: if it did so after our open, we locked an
        # orphan and must start over on the new file
        try:
            current = os.stat(lock)
        except FileNotFoundError:
            os.close(fd)
            continue
        mine = os.fstat(fd)
        if (current.st_ino, current.st_dev) == (mine.st_ino, mine.st_dev):
            break
        os.close(fd)
    since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    record = json.dumps({"pid": os.getpid(), "what": what, "host": socket.gethostname(), "since": since})
    os.ftruncate(fd, 0)
    os.pwrite(fd, record.encode("utf-8"), 0)
    try:
        yield lock
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)  # before unlocking: a waiter that opened it re-checks the inode
        os.close(fd)
