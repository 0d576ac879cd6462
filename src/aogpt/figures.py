"""Figures quoted in documents, checked against the results files they were measured into.

A document marks a measured number by writing, right after it, where it comes from::

    2.27<!-- fig: bench-results/quickstart/quickstart.json#runs.amx.bpb_l2r -->

The path is relative to the repository root and names a JSON file; the key is dot-separated, each
segment a dict key, a list index, or ``field=value`` (the first list element whose ``field`` equals
``value``). The marker renders as nothing, so the reader sees the number; `check` reads the file and
says where a shown number is not the stored one rounded to the decimals shown. Between the number
and its marker may stand bold markers, a unit or a trailing ``x``/``×``/``%`` ("**10,210**", "6.0×",
"45 s", "63%"); thousands separators are read as such, and so is an exponent
("4.9e-3"). A figure shown with ``%`` whose stored value
is a fraction (at most 1 in size) is compared as that fraction times 100, so a results file can keep
shares as fractions. A figure in other units than its file's names the factor after the key:
``198.7<!-- fig: train.json#seconds_per_step.aogpt/auto/compiled *1000 -->`` (milliseconds from
seconds; ``/1e6`` for millions).

Why a checker and not a convention: documents and results files drift apart as code and runs
change; a number that names its file can be compared by the suite, and fails the suite when either
side changes alone.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import unquote

# The number, then (optionally) closing bold, a unit or x / × / %, then the marker.
MARKER = re.compile(
    r"(?P<number>[-+−]?\d(?:[\d,]*\d)?(?:\.\d+)?(?:e[-+−]?\d+)?)"
    r"(?P<suffix>\**[ \u00a0]?(?:[x×%]|[A-Za-zµ/]{1,12})?\**)"
    r"<!--\s*fig:\s*(?P<path>[^#\s]+)#(?P<key>\S+?)(?:\s+(?P<scale>[*/])\s*(?P<factor>\d[\d.e+-]*))?\s*-->"
)
OPEN_MARKER = re.compile(r"<!--\s*fig:")


@dataclass(frozen=True)
class Figure:
    """One marked number: where it is (document, line), what it shows, and where it comes from."""

    doc: str
    line: int
    shown: str
    suffix: str
    path: str
    key: str
    scale: str = ""  # "*1000" or "/1e6": the stored value times or over this before it is compared

    def __str__(self) -> str:
        scale = f" {self.scale}" if self.scale else ""
        return f"{self.doc}:{self.line}: {self.shown}{self.suffix} <- {self.path}#{self.key}{scale}"


def find_figures(text: str, doc: str = "") -> list[Figure]:
    """Every marked number in `text`. A marker that does not follow a number is a figure too, with
    nothing shown, so that `check` reports it instead of skipping it."""
    figures = []
    for lineno, line in enumerate(text.splitlines(), 1):
        matched = set()
        for m in MARKER.finditer(line):
            matched.add(m.start("path"))
            scale = f"{m['scale']}{m['factor']}" if m["scale"] else ""
            figures.append(Figure(doc, lineno, m["number"], m["suffix"], m["path"], m["key"], scale))
        for m in OPEN_MARKER.finditer(line):
            rest = re.match(r"<!--\s*fig:\s*(?P<path>[^#\s]*)#?(?P<key>\S*?)\s*-->", line[m.start():])
            if rest and m.start() + rest.start("path") not in matched:
                figures.append(Figure(doc, lineno, "", "", rest["path"], rest["key"]))
    return figures


def lookup(data: Any, key: str) -> Any:
    """The value at a dot-separated key path; KeyError naming the first segment that is not there.
    Segments are percent-decoded: a key with a space or a dot is written with ``%20`` or ``%2E``
    (``rows.fim%20both%20L=8%20smaller``), the ``=`` of a ``field=value`` segment as it is."""
    value = data
    for segment in key.split("."):
        if isinstance(value, dict):
            name = unquote(segment)
            if name not in value:
                raise KeyError(f"no key {name!r} (has {', '.join(map(str, list(value)[:12]))})")
            value = value[name]
        elif isinstance(value, list):
            if "=" in segment:
                field, want = map(unquote, segment.split("=", 1))
                found = [v for v in value if isinstance(v, dict) and field in v and _same(v[field], want)]
                if not found:
                    raise KeyError(f"no element with {field} = {want!r}")
                value = found[0]
            elif re.fullmatch(r"-?\d+", segment) and -len(value) <= int(segment) < len(value):
                value = value[int(segment)]
            else:
                raise KeyError(f"no element {segment!r} in a list of {len(value)}")
        else:
            raise KeyError(f"{segment!r} asked of a {type(value).__name__}, not a dict or list")
    return value


def _same(stored: Any, want: str) -> bool:
    """Whether a stored field equals the text of a ``field=value`` segment (numbers by value)."""
    if str(stored) == want:
        return True
    try:
        return isinstance(stored, (int, float)) and not isinstance(stored, bool) and float(want) == stored
    except ValueError:
        return False


def parse_number(shown: str) -> Decimal:
    """The number a document shows: thousands separators dropped, a typographic minus read as one."""
    return Decimal(shown.replace(",", "").replace("−", "-"))


def mismatch(figure: Figure, stored: Any) -> str | None:
    """Why `stored` is not what `figure` shows (None when it is): the stored value, rounded to the
    decimals shown, must be the shown number (either way of rounding a tie is accepted)."""
    if not figure.shown:
        return "a marker without a number before it"
    if isinstance(stored, bool) or not isinstance(stored, (int, float)):
        return f"the stored value is {stored!r}, not a number"
    shown = parse_number(figure.shown)
    exponent = shown.as_tuple().exponent
    decimals = -exponent if isinstance(exponent, int) and exponent < 0 else 0
    value = Decimal(repr(float(stored)))
    if figure.scale:
        factor = Decimal(figure.scale[1:])
        value = value * factor if figure.scale[0] == "*" else value / factor
    elif "%" in figure.suffix and abs(value) <= 1:
        value *= 100
    if abs(value - shown) <= Decimal(5).scaleb(-decimals - 1) * Decimal("1.000001"):
        return None
    scaled = f" {figure.scale} = {value.normalize()}" if figure.scale else ""
    return f"shows {figure.shown}, the file has {stored!r}{scaled} (rounds to {round(value, decimals)})"


def check(root: Path, docs: list[Path]) -> tuple[list[Figure], list[str]]:
    """Every figure in `docs` and the problems found: `doc:line: shown <- file#key: why` for a number
    that differs from its file, a file that is missing or not JSON, or a key that is not there."""
    figures: list[Figure] = []
    problems: list[str] = []
    cache: dict[str, Any] = {}
    for doc in docs:
        name = str(doc.relative_to(root)) if doc.is_relative_to(root) else str(doc)
        for figure in find_figures(doc.read_text(encoding="utf-8"), name):
            figures.append(figure)
            try:
                if figure.path not in cache:
                    cache[figure.path] = json.loads((root / figure.path).read_text(encoding="utf-8"))
                why = mismatch(figure, lookup(cache[figure.path], figure.key))
            except FileNotFoundError:
                why = "no such file"
            except json.JSONDecodeError as e:
                why = f"not JSON ({e})"
            except KeyError as e:
                why = f"no such key: {e.args[0]}"
            if why:
                problems.append(f"{figure}: {why}")
    return figures, problems


__all__ = ["Figure", "check", "find_figures", "lookup", "mismatch", "parse_number"]
