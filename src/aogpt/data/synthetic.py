"""Synthetic tasks where the unmasking order matters: generated, solved and checked by the library.

A task makes *solutions* (the training corpus, one fixed-length document each) and *puzzles* (some
cells given, the rest blank: an infilling problem with exactly one answer), and checks an answer.
Everything is deterministic from a seed (`random.Random`, no global state), so
``aogpt prepare --corpus synthetic:NAME`` writes the same files on every machine.

Sudoku (``sudoku4``: 4x4 with 2x2 boxes, ``sudoku6``: 6x6 with 2x3 boxes): a grid is written row by
row as its digits, one character per cell ("1234341221434321"), so the bytes tokenizer gives one
token per cell and a document of ``size**2 + 1`` tokens with its end-of-text token. Solutions are
drawn by randomised backtracking (every valid grid can come out). A puzzle starts from a fresh
solution and removes givens in a random order, keeping each removal only while the solution stays
unique: the result is *minimal* (no given can go), the hardest kind of puzzle for its solution.
An answer is correct when it is a valid grid that keeps every given (the solution is unique, so
that is the solution).

Running sums (``walk``): twelve random steps a_i in {0, 1} and the positions of a walk that takes
them, modulo 10, from a random start c: s_i = (c + a_0 + ... + a_i) mod 10, written interleaved as
a_0 s_0 a_1 s_1 ... (24 digits, 25 tokens). A puzzle gives every step and one position s_j (a random
j), which fixes the answer: each blank s_i follows from a known neighbour (s_i = s_(i-1) + a_i,
s_(i-1) = s_i - a_i), while computing it directly needs the exact count of steps between it and
s_j, which a small network does not get right in one pass. A carry chain, in short. An answer is
correct when every digit equals the solution.

Why order matters here: given a puzzle, some blank cells follow from the givens at a glance (a
Sudoku cell whose row, column and box leave one digit; a running sum next to a known one), others
only after further cells are filled. A model that reveals a hard cell early must guess; one that
reveals the cells it is sure of first (`aogpt.generation.adaptive`) turns hard cells into easy ones.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from aogpt.errors import AOGPTError

DEFAULT_TRAIN = 20_000  # solutions in the training split
DEFAULT_VAL = 1_000


@dataclass(frozen=True)
class Puzzle:
    """An infilling problem: `givens` has a digit for every given cell and None for every blank."""

    givens: tuple[int | None, ...]
    solution: tuple[int, ...]

    @property
    def blanks(self) -> int:
        return sum(g is None for g in self.givens)


class Task:
    """What every synthetic task offers: `cells` per document, one character per cell (`text`,
    `parse`), random solutions, puzzles with one answer, and a checker."""

    name: str
    cells: int
    summary: str = ""  # what a puzzle is, in one phrase (for reports)

    @property
    def length(self) -> int:
        """Characters per document (one per cell)."""
        return self.cells

    def solution(self, rng: random.Random) -> tuple[int, ...]:
        raise NotImplementedError

    def puzzle(self, rng: random.Random) -> Puzzle:
        raise NotImplementedError

    def check(self, puzzle: Puzzle, answer: list[int] | tuple[int, ...]) -> bool:
        raise NotImplementedError

    def text(self, grid: tuple[int, ...] | list[int]) -> str:
        return "".join(str(d) for d in grid)

    def parse(self, text: str) -> list[int]:
        """Digits of an answer text; a character that is no digit reads as -1 (never correct)."""
        return [int(ch) if ch.isdigit() else -1 for ch in text[: self.cells]]


@dataclass(frozen=True)
class RunningSums(Task):
    """`pairs` random steps in 0..steps-1 interleaved with their running sums modulo `modulus`
    (module docstring)."""

    name: str
    pairs: int
    modulus: int = 10
    steps: int = 2

    @property
    def summary(self) -> str:  # type: ignore[override]
        return (f"walks of {self.pairs} steps (running sums modulo {self.modulus}): every step and one position "
                "given, the other positions blank")

    @property
    def cells(self) -> int:  # type: ignore[override]
        return 2 * self.pairs

    def solution(self, rng: random.Random) -> tuple[int, ...]:
        total, out = rng.randrange(self.modulus), []
        for _ in range(self.pairs):
            a = rng.randrange(self.steps)
            total = (total + a) % self.modulus
            out += [a, total]
        return tuple(out)

    def puzzle(self, rng: random.Random) -> Puzzle:
        solution = self.solution(rng)
        anchor = 2 * rng.randrange(self.pairs) + 1
        givens = tuple(d if i % 2 == 0 or i == anchor else None for i, d in enumerate(solution))
        return Puzzle(givens, solution)

    def check(self, puzzle: Puzzle, answer: list[int] | tuple[int, ...]) -> bool:
        return tuple(answer) == puzzle.solution  # the givens fix the answer

    def consistent(self, grid: list[int] | tuple[int, ...]) -> bool:
        """Every running sum follows from the one before it and its digit (the start is free)."""
        return all((grid[2 * i - 1] + grid[2 * i]) % self.modulus == grid[2 * i + 1] for i in range(1, self.pairs))


@dataclass(frozen=True)
class Sudoku(Task):
    """A size x size Sudoku with boxes of box_rows x box_cols cells; digits 1..size."""

    name: str
    box_rows: int
    box_cols: int

    @property
    def summary(self) -> str:  # type: ignore[override]
        return (f"minimal {self.size}x{self.size} Sudoku puzzles (no given can be removed without losing "
                "uniqueness)")

    @property
    def size(self) -> int:
        return self.box_rows * self.box_cols

    @property
    def cells(self) -> int:  # type: ignore[override]
        return self.size * self.size

    def units(self, cell: int) -> tuple[int, int, int]:
        """(row, column, box) of a cell."""
        r, c = divmod(cell, self.size)
        return r, c, (r // self.box_rows) * self.box_rows + c // self.box_cols

    def _candidates(self, grid: list[int], used: list[list[int]], cell: int) -> int:
        r, c, b = self.units(cell)
        return ((1 << self.size) - 1) & ~(used[0][r] | used[1][c] | used[2][b])

    def _used(self, grid: list[int]) -> list[list[int]]:
        used = [[0] * self.size for _ in range(3)]
        for cell, d in enumerate(grid):
            if d:
                for kind, unit in enumerate(self.units(cell)):
                    used[kind][unit] |= 1 << (d - 1)
        return used

    def _search(self, grid: list[int], used: list[list[int]], rng: random.Random | None, limit: int) -> int:
        """Fill `grid` in place (depth first, the most constrained blank first); returns the number of
        solutions found, stopping at `limit`. With `rng` the digits are tried in random order and the
        first solution is left in `grid`."""
        best, best_mask, best_count = -1, 0, self.size + 1
        for cell, d in enumerate(grid):
            if not d:
                mask = self._candidates(grid, used, cell)
                count = mask.bit_count()
                if count < best_count:
                    best, best_mask, best_count = cell, mask, count
                    if count <= 1:
                        break
        if best < 0:
            return 1
        digits = [d + 1 for d in range(self.size) if best_mask >> d & 1]
        if rng is not None:
            rng.shuffle(digits)
        found = 0
        r, c, b = self.units(best)
        for d in digits:
            bit = 1 << (d - 1)
            grid[best] = d
            used[0][r] |= bit
            used[1][c] |= bit
            used[2][b] |= bit
            found += self._search(grid, used, rng, limit - found)
            if found >= limit:
                if rng is not None:
                    return found  # keep the solution in place
            used[0][r] &= ~bit
            used[1][c] &= ~bit
            used[2][b] &= ~bit
            grid[best] = 0
            if found >= limit:
                return found
        return found

    def count_solutions(self, givens: list[int], limit: int = 2) -> int:
        """How many grids complete `givens` (0 = blank), counting at most `limit`."""
        grid = list(givens)
        if not self.consistent(grid):
            return 0
        return self._search(grid, self._used(grid), None, limit)

    def solution(self, rng: random.Random) -> tuple[int, ...]:
        """A random valid grid."""
        grid = [0] * self.cells
        self._search(grid, self._used(grid), rng, 1)
        return tuple(grid)

    def puzzle(self, rng: random.Random) -> Puzzle:
        """A minimal puzzle with a unique solution (module docstring)."""
        solution = self.solution(rng)
        givens = list(solution)
        cells = list(range(self.cells))
        rng.shuffle(cells)
        for cell in cells:
            keep = givens[cell]
            givens[cell] = 0
            if self.count_solutions(givens) != 1:
                givens[cell] = keep
        return Puzzle(tuple(d or None for d in givens), solution)

    def consistent(self, grid: list[int] | tuple[int, ...]) -> bool:
        """No digit twice in a row, column or box (blanks, 0, ignored)."""
        seen: set[tuple[int, int, int]] = set()
        for cell, d in enumerate(grid):
            if d:
                for kind, unit in enumerate(self.units(cell)):
                    if (kind, unit, d) in seen:
                        return False
                    seen.add((kind, unit, d))
        return True

    def check(self, puzzle: Puzzle, answer: list[int] | tuple[int, ...]) -> bool:
        """Whether `answer` (digits, one per cell) is a valid grid keeping every given."""
        if len(answer) != self.cells or any(not 1 <= d <= self.size for d in answer):
            return False
        if any(g is not None and g != a for g, a in zip(puzzle.givens, answer, strict=True)):
            return False
        return self.consistent(answer)



TASKS: dict[str, Task] = {t.name: t for t in (Sudoku("sudoku4", 2, 2), Sudoku("sudoku6", 2, 3),
                                              RunningSums("walk", 12))}
PREFIX = "synthetic:"


def task(name: str) -> Task:
    """A task by name (``sudoku4``, ``sudoku6``, ``walk``); an unknown name is a user error."""
    if name not in TASKS:
        raise AOGPTError(f"unknown synthetic task {name!r}", f"use one of: {', '.join(TASKS)}")
    return TASKS[name]


def parse_corpus_name(corpus: str) -> Task | None:
    """The task of ``synthetic:NAME``, None for any other corpus name."""
    if not corpus.startswith(PREFIX):
        return None
    return task(corpus[len(PREFIX):])


def solutions(t: Task, count: int, seed: int, stream: str) -> Iterator[str]:
    """`count` solution texts from the named stream of `seed` (train and val streams differ)."""
    rng = random.Random(f"{t.name}:{stream}:{seed}")
    for _ in range(count):
        yield t.text(t.solution(rng))


def puzzles(t: Task, count: int, seed: int) -> list[Puzzle]:
    """`count` puzzles from `seed` (a stream of their own: not the corpus's solutions)."""
    rng = random.Random(f"{t.name}:puzzles:{seed}")
    return [t.puzzle(rng) for _ in range(count)]


__all__ = ["DEFAULT_TRAIN", "DEFAULT_VAL", "PREFIX", "TASKS", "Puzzle", "RunningSums", "Sudoku", "Task",
           "parse_corpus_name", "puzzles", "solutions", "task"]
