"""An exact Sudoku solver: depth-first search with naked- and hidden-single propagation over bitboards.

One 81-bit Python int per digit holds the cells where that digit is still possible; naked singles come from a
bit-sliced count over the nine boards, hidden singles from the 27 unit masks, and the search branches on a cell with
the fewest candidates (a bivalue cell when there is one). It counts search nodes and guesses, which `solver_class`
turns into the "singles" / "search" split of the reports, and it is what the generator uses to keep puzzles unique.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from jaxtyping import Int

from hackable_diffusion.tasks.sudoku.grids import BOX_INDEX, COL_INDEX, NUM_CELLS, ROW_INDEX, UNITS, _as_grid

_FULL = (1 << NUM_CELLS) - 1


_BIT = tuple(1 << c for c in range(NUM_CELLS))


_UNIT_MASKS = tuple(sum(_BIT[int(c)] for c in unit) for unit in UNITS)
# Peers of a cell (same row, column or box) *including* the cell itself.
_PEERS_AND_SELF = tuple(
    _UNIT_MASKS[int(ROW_INDEX[c])] | _UNIT_MASKS[9 + int(COL_INDEX[c])] | _UNIT_MASKS[18 + int(BOX_INDEX[c])]
    for c in range(NUM_CELLS)
)


_ROW_OF = tuple(int(r) for r in ROW_INDEX)


_COL_OF = tuple(int(c) for c in COL_INDEX)


_BOX_OF = tuple(int(b) for b in BOX_INDEX)


def _cells_of(mask: int):
    """Yields the cell indices of the set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class _Search:
    """Depth-first search with naked- and hidden-single propagation. Counts nodes and guesses."""

    __slots__ = ("max_solutions", "solutions", "nodes", "guesses", "digit_order")

    def __init__(self, max_solutions: int, digit_order=None):
        self.max_solutions = max_solutions
        self.solutions: list[list[int]] = []  # each: 9 ints, placed[d] = cells holding digit d+1
        self.nodes = 0
        self.guesses = 0
        # Optional per-cell order in which to try digits (tuple of 81 tuples of 0..8): randomises the search.
        self.digit_order = digit_order

    def run(self, boards: list[int], placed: list[int], unsolved: int) -> None:
        self.nodes += 1
        # ---- propagation to a fixed point --------------------------------------------------------------------
        while unsolved:
            ones = twos = threes = fours = 0
            for b in boards:
                fours |= threes & b
                threes |= twos & b
                twos |= ones & b
                ones |= b
            if unsolved & ~ones:
                return  # a cell has no candidate left
            singles = ones & ~twos
            if singles:
                for d in range(9):
                    s = boards[d] & singles
                    if not s:
                        continue
                    b = boards[d]
                    placed_d = 0
                    for c in _cells_of(s):
                        if not (b >> c) & 1:
                            return  # two singles with the same digit see each other
                        b &= ~_PEERS_AND_SELF[c]
                        placed_d |= _BIT[c]
                    boards[d] = b
                    placed[d] |= placed_d
                    unsolved &= ~placed_d
                    keep = ~placed_d
                    for k in range(9):
                        if k != d:
                            boards[k] &= keep
                continue
            # Hidden singles: a digit with exactly one possible cell in some unit. The same scan finds dead units
            # (a digit neither placed in a unit nor possible anywhere in it).
            found = False
            for d in range(9):
                b = boards[d]
                done = placed[d]
                hidden = 0
                for unit in _UNIT_MASKS:
                    x = b & unit
                    if x:
                        if not x & (x - 1):
                            hidden |= x
                    elif not done & unit:
                        return
                if not hidden:
                    continue
                placed_d = 0
                for c in _cells_of(hidden):
                    if not (b >> c) & 1:
                        return  # the same digit is the only option for two cells that see each other
                    b &= ~_PEERS_AND_SELF[c]
                    placed_d |= _BIT[c]
                boards[d] = b
                placed[d] |= placed_d
                unsolved &= ~placed_d
                keep = ~placed_d
                for k in range(9):
                    if k != d:
                        boards[k] &= keep
                found = True  # keep scanning: hidden singles of other digits stay forced (or expose a conflict)
            if not found:
                break  # no singles left: branch
        if not unsolved:
            # Every cell placed without contradiction; the peer clearing guarantees validity.
            self.solutions.append(list(placed))
            return
        # ---- branch on a cell with fewest candidates -------------------------------------------------------
        fewest = twos & ~threes or threes & ~fours
        if fewest:
            cell = (fewest & -fewest).bit_length() - 1
        else:
            cell, best = -1, 10
            for c in _cells_of(unsolved):
                n = 0
                for b in boards:
                    n += (b >> c) & 1
                if n < best:
                    cell, best = c, n
                    if n == 4:
                        break
        bit = _BIT[cell]
        order = self.digit_order[cell] if self.digit_order is not None else range(9)
        candidates = [d for d in order if boards[d] & bit]
        self.guesses += 1
        keep = ~bit
        for d in candidates:
            child = [b & keep for b in boards]
            child[d] = boards[d] & ~_PEERS_AND_SELF[cell]
            child_placed = list(placed)
            child_placed[d] |= bit
            self.run(child, child_placed, unsolved & keep)
            if len(self.solutions) >= self.max_solutions:
                return


def _initial_state(cells: Sequence[int]):
    """Bitboard state of a puzzle given as 81 ints; returns None if two givens conflict."""
    boards = [_FULL] * 9
    placed = [0] * 9
    unsolved = _FULL
    for c, v in enumerate(cells):
        if v:
            d = v - 1
            bit = _BIT[c]
            if not boards[d] & bit:
                return None
            boards[d] &= ~_PEERS_AND_SELF[c]
            placed[d] |= bit
            unsolved &= ~bit
    keep = unsolved
    boards = [b & keep for b in boards]
    return boards, placed, unsolved


def _decode(placed: Sequence[int]) -> np.ndarray:
    grid = np.zeros(NUM_CELLS, dtype=np.int8)
    for d, mask in enumerate(placed):
        for c in _cells_of(mask):
            grid[c] = d + 1
    return grid


@dataclasses.dataclass(frozen=True)
class SolveResult:
    """Outcome of :func:`solve`.

    Attributes:
      solutions: up to ``max_solutions`` solved grids (int8, shape (81,)), in search order.
      num_solutions: ``len(solutions)``; the search stops there, so it is a count capped at ``max_solutions``.
      nodes: search nodes visited (the root plus one per tried branch).
      guesses: branching points (cells where the search had to choose between two or more digits). A puzzle solved
        by naked and hidden singles alone has ``guesses == 0``; this is the solver's difficulty measure.
    """

    solutions: list[np.ndarray]
    num_solutions: int
    nodes: int
    guesses: int

    @property
    def difficulty(self) -> float:
        """Guesses per node (0 for a puzzle solved by singles; approaches 1 when most nodes branch)."""
        return self.guesses / max(self.nodes, 1)


def solve(puzzle: Int[np.ndarray, "81"], max_solutions: int = 2) -> SolveResult:
    """Exact solver: finds up to ``max_solutions`` solutions of ``puzzle`` (0 = blank).

    With the default ``max_solutions=2`` the result tells whether the puzzle is unique (1), ambiguous (2) or
    unsolvable (0). Conflicting givens give 0 solutions.
    """
    if int(max_solutions) < 1:
        raise ValueError(f"max_solutions must be >= 1, got {max_solutions}.")
    grid = _as_grid(puzzle)
    search = _Search(int(max_solutions))
    state = _initial_state(grid.tolist())
    if state is not None:
        search.run(*state)
    else:
        search.nodes = 1
    sols = [_decode(p) for p in search.solutions]
    return SolveResult(solutions=sols, num_solutions=len(sols), nodes=search.nodes, guesses=search.guesses)


def is_unique(puzzle: Int[np.ndarray, "81"]) -> bool:
    """True iff ``puzzle`` has exactly one solution."""
    return solve(puzzle, max_solutions=2).num_solutions == 1


def solver_class(puzzles: Int[np.ndarray, "n 81"]) -> np.ndarray:
    """Per puzzle, ``"singles"`` when the exact solver finishes it by naked and hidden singles alone (no guess) and
    ``"search"`` when it had to branch: a split that says whether a model's failures sit on puzzles that need
    look-ahead. Shape (n,), dtype str."""
    grids = np.asarray(puzzles).reshape(-1, 81)
    return np.array(["singles" if solve(p, max_solutions=1).guesses == 0 else "search" for p in grids])
