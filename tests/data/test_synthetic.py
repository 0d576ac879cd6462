"""Synthetic tasks: grids, puzzles and the checker against brute force; the corpus, its fixed-length
documents and the whole-document training windows."""

from __future__ import annotations

import functools
import itertools
import random

import numpy as np
import pytest

from aogpt.data import PreparedData, prepare
from aogpt.data.corpora import load_corpus
from aogpt.data.synthetic import Puzzle, puzzles, solutions, task
from aogpt.errors import AOGPTError


@functools.cache
def brute_force_grids(name: str) -> list[tuple[int, ...]]:
    """Every valid grid, trying every permutation for every row and keeping the consistent prefixes."""
    t = task(name)
    rows = list(itertools.permutations(range(1, t.size + 1)))
    grids: list[tuple[int, ...]] = [()]
    for _ in range(t.size):
        grids = [g + r for g in grids for r in rows if t.consistent(g + r)]
    return grids


def test_solution_counts_match_brute_force():
    t = task("sudoku4")
    grids = brute_force_grids("sudoku4")
    assert len(grids) == 288 == t.count_solutions([0] * 16, limit=10_000)
    rng = random.Random(0)
    for _ in range(30):  # random partial grids: the counter agrees with filtering the full list
        g = list(rng.choice(grids))
        for cell in rng.sample(range(16), rng.randint(3, 16)):
            g[cell] = 0
        if rng.random() < 0.3:  # sometimes an impossible given
            g[rng.randrange(16)] = rng.randint(1, 4)
        want = sum(all(a == 0 or a == b for a, b in zip(g, full, strict=True)) for full in grids)
        assert t.count_solutions(g, limit=10_000) == want


@pytest.mark.parametrize("name", ["sudoku4", "sudoku6"])
def test_puzzles_have_one_solution_and_are_minimal(name):
    t = task(name)
    for p in puzzles(t, 12 if name == "sudoku4" else 4, seed=3):
        givens = [g or 0 for g in p.givens]
        assert t.count_solutions(givens) == 1 and t.check(p, p.solution)
        assert all(g in (0, s) for g, s in zip(givens, p.solution, strict=True))
        for cell in np.flatnonzero(givens):  # removing any given loses uniqueness
            fewer = list(givens)
            fewer[cell] = 0
            assert t.count_solutions(fewer) == 2
    assert puzzles(t, 3, seed=3) == puzzles(t, 3, seed=3) and puzzles(t, 3, seed=3) != puzzles(t, 3, seed=4)


def test_check_rejects_wrong_answers():
    t = task("sudoku4")
    p = puzzles(t, 1, seed=0)[0]
    good = list(p.solution)
    assert t.check(p, good)
    swapped = good[:]
    swapped[0], swapped[1] = swapped[1], swapped[0]  # breaks two columns (and maybe a given)
    assert not t.check(p, swapped)
    assert not t.check(p, good[:-1]) and not t.check(p, [0] + good[1:])
    other = next(g for g in brute_force_grids("sudoku4")
                 if any(a is not None and a != b for a, b in zip(p.givens, g, strict=True)))
    assert t.consistent(other) and not t.check(p, other)  # a valid grid that drops a given
    assert t.parse("12x4" + "1" * 12)[:4] == [1, 2, -1, 4]
    assert isinstance(p, Puzzle) and p.blanks == sum(g is None for g in p.givens)


def test_solutions_are_valid_deterministic_and_streams_differ():
    t = task("sudoku6")
    train = list(solutions(t, 20, seed=1, stream="train"))
    assert train == list(solutions(t, 20, seed=1, stream="train"))
    assert train != list(solutions(t, 20, seed=1, stream="val")) and train != list(solutions(t, 20, 2, "train"))
    assert all(len(s) == 36 and t.count_solutions(t.parse(s)) == 1 and t.consistent(t.parse(s)) for s in train)
    assert len(set(train)) == 20  # randomised backtracking spreads over many of the 28 million grids


def test_corpus_and_record_aligned_batches(tmp_path):
    corpus = load_corpus("synthetic:sudoku4", max_docs=50, val_docs=10, seed=5)
    docs = list(corpus.docs())
    assert [s for s, _ in docs].count("train") == 50 and [s for s, _ in docs].count("val") == 10
    assert corpus.fixed_length and all(len(text) == 16 for _, text in docs)
    meta = prepare("synthetic:sudoku4", "bytes", tmp_path / "s4", max_docs=50, val_docs=10, seed=5, progress=False)
    assert meta["record_tokens"] == 17 and meta["splits"]["train"]["tokens"] == 50 * 17
    d = PreparedData(tmp_path / "s4")
    batch = d.get_batch("train", 64, 17, 0)
    assert (batch[:, -1] == 256).all() and (batch[:, :-1] != 256).all()  # whole documents, never straddling
    starts = {tuple(row.tolist()) for row in batch}
    whole = np.asarray(d.split("train")).reshape(50, 17)
    assert starts <= {tuple(r) for r in whole.tolist()}
    assert len(starts) > 30  # uniform over the 50 documents: most of them drawn
    other = d.get_batch("train", 64, 16, 0)  # another window size: ordinary windows at any start
    assert (other == 256).any(axis=1).sum() > 32
    val = next(d.iter_eval_batches("val", 10, 17))
    assert (val[:, -1] == 256).all()
    with pytest.raises(AOGPTError, match="do not all encode to the same number"):
        prepare("synthetic:sudoku4", "gpt2", tmp_path / "g", max_docs=20, val_docs=5, progress=False)
    assert not (tmp_path / "g").exists()
    with pytest.raises(AOGPTError, match="unknown synthetic task"):
        load_corpus("synthetic:chess")
    with pytest.raises(AOGPTError, match="val-fraction"):
        load_corpus("synthetic:sudoku4", val_fraction=0.1)


def test_walk_puzzles_have_exactly_one_answer():
    t = task("walk")
    assert (t.cells, t.length) == (24, 24)
    for p in puzzles(t, 50, seed=1):
        assert t.consistent(p.solution) and t.check(p, p.solution)
        assert set(p.solution[0::2]) <= {0, 1} and set(p.solution[1::2]) <= set(range(10))
        known = [i for i, g in enumerate(p.givens) if g is not None]
        assert len([i for i in known if i % 2]) == 1 and len(known) == 13  # every step and one position
        steps = p.solution[0::2]
        # brute force over the unknown start: exactly one start reproduces the given position
        fits = []
        for start in range(10):
            sums = [(start + sum(steps[:i + 1])) % 10 for i in range(12)]
            grid = [x for pair in zip(steps, sums, strict=True) for x in pair]
            if all(g is None or g == v for g, v in zip(p.givens, grid, strict=True)):
                fits.append(tuple(grid))
        assert fits == [p.solution]
        wrong = list(p.solution)
        blank = next(i for i, g in enumerate(p.givens) if g is None)
        wrong[blank] = (wrong[blank] + 1) % 10
        assert not t.check(p, wrong) and not t.consistent(wrong)
    assert all(t.consistent(t.parse(s)) for s in solutions(t, 20, seed=0, stream="train"))
