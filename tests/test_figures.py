"""Every marked figure in README and docs/ equals its results file; the check fails on an altered
figure, a missing key or file, and reads the number forms the documents use."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from aogpt.figures import Figure, check, find_figures, lookup, mismatch

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_marked_figure_equals_its_results_file() -> None:
    figures, problems = check(ROOT, DOCS)
    assert not problems, "\n".join(problems)
    marked = {f.doc for f in figures}
    assert "README.md" in marked and len(figures) >= 50, f"only {len(figures)} figures marked in {sorted(marked)}"


def _copy_repo_piece(tmp_path: Path, doc: str) -> tuple[Path, list[Figure]]:
    """A copy of `doc` and of every results file its figures name, under `tmp_path`."""
    figures = find_figures((ROOT / doc).read_text(encoding="utf-8"), doc)
    for f in {f.path for f in figures}:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / f, tmp_path / f)
    (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / doc, tmp_path / doc)
    return tmp_path / doc, figures


def test_the_check_fails_on_an_altered_figure(tmp_path: Path) -> None:
    copy, figures = _copy_repo_piece(tmp_path, "README.md")
    assert not check(tmp_path, [copy])[1]  # the copy passes as the repository does
    first = next(f for f in figures if "." in f.shown)
    lines = copy.read_text(encoding="utf-8").split("\n")
    marker = f"{first.shown}{first.suffix}<!-- fig: {first.path}#{first.key}"
    changed = first.shown[:-1] + ("1" if first.shown[-1] != "1" else "2")
    assert marker in lines[first.line - 1]
    lines[first.line - 1] = lines[first.line - 1].replace(marker, marker.replace(first.shown, changed, 1), 1)
    copy.write_text("\n".join(lines), encoding="utf-8")
    problems = check(tmp_path, [copy])[1]
    assert len(problems) == 1
    assert problems[0].startswith(f"README.md:{first.line}: {changed}") and f"shows {changed}" in problems[0]


def test_the_check_fails_on_a_missing_key_or_file(tmp_path: Path) -> None:
    copy, figures = _copy_repo_piece(tmp_path, "README.md")
    first = figures[0]
    text = copy.read_text(encoding="utf-8")
    copy.write_text(text.replace(f"#{first.key} -->", f"#{first.key}_gone -->", 1), encoding="utf-8")
    problems = check(tmp_path, [copy])[1]
    assert len(problems) >= 1 and "no such key" in problems[0] and problems[0].startswith(f"README.md:{first.line}")
    copy.write_text(text, encoding="utf-8")
    (tmp_path / first.path).unlink()
    problems = check(tmp_path, [copy])[1]
    assert problems and all("no such file" in p for p in problems)


def test_number_forms_and_key_paths(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps({
        "steps": 10210, "bpb": 2.2733, "share": 0.6295, "pct": 63.0, "ratio": 5.97, "neg": -0.284,
        "rows": [{"n": 128, "ms": 2.94}, {"n": 512, "ms": 3.44, "name": "a.b"}], "text": "x", "e": 0.00494}))
    doc = tmp_path / "d.md"
    doc.write_text(
        "| **10,210**<!-- fig: r.json#steps --> | **2.27 bits/byte**<!-- fig: r.json#bpb --> |\n"
        "63%<!-- fig: r.json#share --> and 63%<!-- fig: r.json#pct -->, 6.0×<!-- fig: r.json#ratio -->, "
        "5.97x<!-- fig: r.json#ratio -->, −0.284<!-- fig: r.json#neg -->\n"
        "3.44 ms<!-- fig: r.json#rows.n=512.ms -->, 2.94<!-- fig: r.json#rows.0.ms -->, "
        "3.44<!-- fig: r.json#rows.-1.ms -->\n"
        "2,273 ms<!-- fig: r.json#bpb *1000 --> and 0.0102 M<!-- fig: r.json#steps /1e6 -->, "
        "4.9e-3<!-- fig: r.json#e -->\n")
    figures, problems = check(tmp_path, [doc])
    assert not problems, problems
    assert [f.shown for f in figures] == ["10,210", "2.27", "63", "63", "6.0", "5.97", "−0.284", "3.44", "2.94",
                                          "3.44", "2,273", "0.0102", "4.9e-3"]
    doc.write_text(
        "2.28<!-- fig: r.json#bpb -->\n6.1×<!-- fig: r.json#ratio -->\n10,211<!-- fig: r.json#steps -->\n"
        "62%<!-- fig: r.json#share -->\n1<!-- fig: r.json#text -->\n1<!-- fig: r.json#rows.n=256.ms -->\n"
        "1<!-- fig: r.json#rows.2 -->\n1<!-- fig: r.json#steps.x -->\nnothing <!-- fig: r.json#steps -->\n"
        "1<!-- fig: gone.json#steps -->\n2,274<!-- fig: r.json#bpb *1000 -->\n5.0e-3<!-- fig: r.json#e -->\n")
    problems = check(tmp_path, [doc])[1]
    assert [p.split(":")[1] for p in problems] == [str(i) for i in range(1, 13)], problems
    assert "*1000 = 2273.3" in problems[10] and "rounds to 0.0049" in problems[11]
    assert "rounds to 2.27" in problems[0] and "not a number" in problems[4] and "no element" in problems[5]
    assert "without a number" in problems[8] and "no such file" in problems[9]


def test_rounding_accepts_either_way_of_rounding_a_tie_and_nothing_else() -> None:
    fig = Figure("d", 1, "2.25", "", "f", "k")
    assert mismatch(fig, 2.245) is None and mismatch(fig, 2.255) is None
    assert mismatch(fig, 2.2449) is not None and mismatch(fig, 2.2551) is not None
    assert mismatch(Figure("d", 1, "61", "×", "f", "k"), 60.7) is None


def test_lookup_names_what_is_missing() -> None:
    with pytest.raises(KeyError, match="no key 'b'"):
        lookup({"a": 1}, "b")
    with pytest.raises(KeyError, match="no element with n = '3'"):
        lookup({"a": [{"n": 1}, {"n": 2}]}, "a.n=3")
    assert lookup({"a": [{"n": 1.0, "v": 5}, {"n": 2, "v": 6}]}, "a.n=1.v") == 5  # numbers match by value
    spaced = {"rows": {"fim both L=8": {"mean": 1}}, "list": [{"name": "a b.c", "v": 2}]}
    assert lookup(spaced, "rows.fim%20both%20L=8.mean") == 1 and lookup(spaced, "list.name=a%20b%2Ec.v") == 2
