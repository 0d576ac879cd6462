"""Every reference in the documentation and the docstrings resolves inside the repository."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
VENDORED = ROOT / "tests" / "fixtures"  # verbatim copies of external files (checked against ../shared)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
PATH = re.compile(r"`((?:src|tests|docs|benchmarks|scripts|aogpt)/[\w./-]+\.(?:py|md|sh|json|toml|yaml))`")
DOC_REF = re.compile(r"\bdocs/([\w-]+\.md)\b")
DOTTED = re.compile(r"`(aogpt(?:\.\w+)+)(?![\w*])")


def _dotted_exists(name: str) -> bool:
    """`aogpt.a.b.attr`: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _resolve(path: str) -> Path:
    return ROOT / "src" / path if path.startswith("aogpt/") else ROOT / path


def broken_references() -> list[str]:
    broken = []
    for doc in (d for d in DOCS if d.is_file()):
        text = doc.read_text(encoding="utf-8")
        for target in LINK.findall(text):
            if "://" not in target and not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)}: link {target}")
        for target in PATH.findall(text):
            if not _resolve(target).exists():
                broken.append(f"{doc.relative_to(ROOT)}: path {target}")
        for target in DOTTED.findall(text.split("## Where things moved")[0]):  # old names listed on purpose
            if not _dotted_exists(target):
                broken.append(f"{doc.relative_to(ROOT)}: name {target}")
    for source in sorted((ROOT / "src").rglob("*.py")) + sorted((ROOT / "scripts").glob("*.sh")):
        text = source.read_text(encoding="utf-8")
        for name in DOC_REF.findall(text):
            if not (ROOT / "docs" / name).is_file():
                broken.append(f"{source.relative_to(ROOT)}: docs/{name}")
        for target in PATH.findall(text):
            if not _resolve(target).exists():
                broken.append(f"{source.relative_to(ROOT)}: path {target}")
    return broken


def test_every_doc_and_docstring_reference_resolves() -> None:
    assert not broken_references(), "\n".join(broken_references())


def test_design_notes_live_in_the_repository() -> None:
    """Code and docs cite docs/design.md, never an external DESIGN.md."""
    assert (ROOT / "docs" / "design.md").is_file()
    citing = [p for p in [*ROOT.joinpath("src").rglob("*.py"), *ROOT.joinpath("docs").glob("*.md"), ROOT / "README.md"]
              if "DESIGN.md" in p.read_text(encoding="utf-8") and VENDORED not in p.parents]
    assert not citing, citing
