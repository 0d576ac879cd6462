"""The conformance vectors are vendored under tests/fixtures/reference-checkpoints so that a clone
runs its tests anywhere; when ../shared is beside the clone, the copy must equal the original."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "fixtures" / "reference-checkpoints"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "reference-checkpoints"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_vendored_fixtures_are_complete():
    names = {p.name for p in HERE.iterdir()}
    assert {"ckpt_aogpt.pt", "ckpt_sigmagpt.pt", "expected.npz", "summary.json", "reference_shapes.json"} <= names


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/fixtures is not beside this clone")
def test_vendored_fixtures_equal_the_shared_originals():
    for original in SHARED.iterdir():
        assert digest(HERE / original.name) == digest(original), original.name
