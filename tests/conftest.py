"""Shared fixtures: a small prepared corpus, a tiny trained run, and a CLI runner."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from aogpt import capability

# Tiny models: one thread is faster than two (no synchronisation per small op) and immune to a
# busy machine, where two spinning OpenMP threads slow everything down many times over.
torch.set_num_threads(1)

WORDS = ("the king queen sword crown night day love death sleep dream ghost castle sea storm "
         "fair foul honest noble villain friend brother father mother heart blood").split()


def make_corpus(directory: Path, docs: int = 12, words: int = 400, seed: int = 0) -> Path:
    """A deterministic little text corpus: one document per .txt file."""
    import random

    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for d in range(docs):
        lines = []
        for _ in range(words // 8):
            lines.append(" ".join(rng.choice(WORDS) for _ in range(8)).capitalize() + ".")
        (directory / f"doc{d:02d}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


@dataclass
class CLIResult:
    code: int
    out: str
    err: str

    @property
    def json(self) -> dict:
        return json.loads(self.out.strip().splitlines()[-1])


@pytest.fixture
def cli(capsys):
    """Run `aogpt ...` in-process; returns exit code, stdout and stderr."""
    from aogpt.cli import main

    def run(*args: str) -> CLIResult:
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse --help / usage errors
            code = exc.code if isinstance(exc.code, int) else 1
        captured = capsys.readouterr()
        return CLIResult(code, captured.out, captured.err)

    return run


@pytest.fixture(name="make_corpus")
def make_corpus_fixture():
    return make_corpus


@pytest.fixture(scope="session")
def bytes_data(tmp_path_factory) -> Path:
    """A prepared directory (bytes tokenizer, ~50 KB of text) for end-to-end tests."""
    from aogpt.data import prepare

    root = tmp_path_factory.mktemp("data")
    out = root / "prepared"
    prepare(str(make_corpus(root / "corpus")), "bytes", out, val_fraction=0.2, progress=False)
    return out


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, bytes_data) -> Path:
    """A tiny AO-GPT trained for a few steps on `bytes_data` (a run directory with checkpoints)."""
    from aogpt.cli import main

    out = tmp_path_factory.mktemp("runs") / "tiny"
    code = main(["train", "--preset", "tiny", "--data", str(bytes_data), "--out", str(out), "--max-steps", "6",
                 "--no-progress"])
    assert code == 0
    return out


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files holding a test marked slow first, each file's tests kept together and in order:
    scripts/test.sh hands whole files to parallel processes in this order (pytest-xdist), so the
    longest start first and no process is left alone with one at the end."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


# ----------------------------------------------------------------------------- CPU classes
# (markers for what a test needs are in tests/helpers.py)
def pytest_report_header(config) -> list[str]:
    gaps = capability.emulation_gaps()
    return [capability.describe() + (f"; not emulated: {'; '.join(gaps)}" if gaps else "")]


@pytest.fixture
def as_cpu():
    """`as_cpu("avx2")`: the project's own decisions made as on that class (the switch, for one test;
    torch's kernels stay as they are)."""
    import os

    before = os.environ.get(capability.SWITCH_ENV)

    def use(name: str) -> None:
        os.environ[capability.SWITCH_ENV] = name
        capability.refresh()

    yield use
    if before is None:
        os.environ.pop(capability.SWITCH_ENV, None)
    else:
        os.environ[capability.SWITCH_ENV] = before
    capability.refresh()
