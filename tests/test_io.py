"""Crash-safe writes: one writer per output (tested with real processes), stale locks taken over,
torn log lines dropped, leftovers of killed writes removed, file modes that follow the umask, and
operating-system failures (paths under /proc, even as root) as one-line user errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from aogpt.errors import AOGPTError
from aogpt.io import (
    atomic_dir,
    atomic_write_bytes,
    directory_lock,
    lock_file,
    read_jsonl,
    remove_stale_temporaries,
)

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
HOLDER = """
import sys, time
from aogpt.io import directory_lock
with directory_lock(sys.argv[1], "aogpt holder", inside=sys.argv[2] == "inside"):
    print("locked", flush=True)
    time.sleep(600)
"""


def hold(path: Path, inside: bool = False) -> subprocess.Popen:
    """Another process holding the lock of `path` (it prints 'locked' once it does)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), "inside" if inside else "beside"], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked", proc.stderr.read()
    return proc


@pytest.mark.parametrize("inside", [False, True])
def test_a_second_process_is_refused_and_a_killed_holders_lock_is_taken_over(tmp_path, inside):
    out = tmp_path / "out"
    out.mkdir()
    holder = hold(out, inside)
    try:
        with pytest.raises(AOGPTError) as exc, directory_lock(out, "aogpt test", inside=inside):
            pass
        assert str(exc.value).startswith(f"{out} is in use by process {holder.pid} (aogpt holder on ")
        assert "wait for it to finish, or choose another --out" in str(exc.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock = lock_file(out, inside)
    assert json.loads(lock.read_text())["pid"] == holder.pid  # the dead process's lock is still there
    with directory_lock(out, "aogpt test", inside=inside):  # ... and taken over
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()  # removed on release


def test_prepare_into_an_output_in_use_is_refused_and_changes_nothing(tmp_path, make_corpus):
    from aogpt.data import prepare
    from tests.cli.test_malformed import snapshot

    corpus = make_corpus(tmp_path / "corpus", docs=3, words=60)
    out = tmp_path / "data"
    prepare(str(corpus), "bytes", out, progress=False)  # an earlier good directory
    before = snapshot(out)
    with directory_lock(out, "aogpt prepare"):
        result = subprocess.run([sys.executable, "-m", "aogpt", "prepare", "--corpus", str(corpus), "--tokenizer",
                                 "bytes", "--out", str(out), "--no-progress"], env=ENV, capture_output=True, text=True,
                                timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: {out} is in use by process {os.getpid()} (aogpt prepare on ")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert snapshot(out) == before and not (tmp_path / ".data.partial").exists()


def test_export_into_a_file_in_use_is_refused(cli, tiny_run, tmp_path):
    target = tmp_path / "model.pt"
    with directory_lock(target, "aogpt export"):
        result = cli("export", tiny_run, "--out", target)
    assert result.code == 2 and f"{target} is in use by process {os.getpid()}" in result.err
    assert not target.exists()


def test_a_torn_last_line_is_dropped_with_a_warning_and_a_damaged_middle_is_an_error(tmp_path, capsys):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1}\n{"step": 2}\n{"ste')
    assert read_jsonl(log) == [{"step": 1}, {"step": 2}]
    assert "dropped a torn last line" in capsys.readouterr().err
    log.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(AOGPTError, match="line 2 is not a JSON record"):
        read_jsonl(log)
    assert read_jsonl(tmp_path / "missing.jsonl") == []


def test_leftovers_of_interrupted_writes_are_removed(tmp_path):
    for name in (".ckpt-0000003.tmp-abc", ".ckpt-0000006.old-123"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"half")
    (tmp_path / ".ckpt-0000009.tmp-file").write_text("x")
    (tmp_path / "ckpt-0000003").mkdir()
    (tmp_path / ".other.tmp-1").mkdir()
    removed = remove_stale_temporaries(tmp_path, "ckpt-")
    assert len(removed) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.tmp-1", "ckpt-0000003"]


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_checkpoint_files_follow_the_umask(tmp_path, umask):
    import torch

    import aogpt
    from aogpt.config import model_config

    model = aogpt.Transformer(model_config("gpt", preset="tiny", vocab_size=64))
    old = os.umask(umask)
    try:
        ckpt = aogpt.save(model, tmp_path / "ckpt")
        atomic_write_bytes(tmp_path / "file.bin", b"x")
        torch.save({}, tmp_path / "plain.pt")  # what an ordinary write gets
    finally:
        os.umask(old)
    plain = (tmp_path / "plain.pt").stat().st_mode & 0o777
    assert plain == 0o666 & ~umask
    assert (ckpt / "model.safetensors").stat().st_mode & 0o777 == plain  # safetensors alone would give 0600
    assert (ckpt / "config.json").stat().st_mode & 0o777 == plain
    assert (tmp_path / "file.bin").stat().st_mode & 0o777 == plain
    assert ckpt.stat().st_mode & 0o777 == 0o777 & ~umask


def test_paths_under_proc_are_clean_errors_even_for_root(tmp_path):
    with pytest.raises(AOGPTError, match="cannot write /proc/aogpt-test.bin"):
        atomic_write_bytes(Path("/proc/aogpt-test.bin"), b"x")
    with pytest.raises(AOGPTError, match="cannot create directory /proc/aogpt-test"):
        with atomic_dir(Path("/proc/aogpt-test/ckpt")):
            pass
    with pytest.raises(AOGPTError, match="cannot create the lock file /proc/.aogpt-test.lock"):
        with directory_lock(Path("/proc/aogpt-test"), "aogpt test"):
            pass
    with pytest.raises(AOGPTError, match="names no directory"):
        with atomic_dir(Path(".")):
            pass
