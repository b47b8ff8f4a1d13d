"""An exact Sudoku solver: depth-first search with naked- and hidden-single propagation over bitboards.

One 81-bit Python int per digit holds the cells where that digit is still possible; naked singles come from a
bit-sliced count over the nine boards, hidden singles from the 27 unit masks, and the search branches on a cell with
the fewest candidates (a bivalue cell when there is one). It counts search nodes and guesses, which `solver_class`
turns into the "singles" / "search" split of the reports, and it is what the generator uses to keep puzzles unique.

Difficulty as a number (`count_guesses`): the number of guesses the search makes under one of two fixed branching
rules. Definitions:

- a *guess* is each assignment of a digit to a cell that propagation did not force, counting every digit tried: a
  branch cell whose third digit finally works costs 3 guesses. Placements made by propagation are never guesses, so
  a solved grid, a grid one cell short and any puzzle the rule's propagation finishes all count 0.
- a *backtrack* is each guess that is undone because the search below it found no solution (a wrong guess). In a
  search for one solution that is every undo; when the search goes on for a second solution, the guesses it leaves
  after finding the first are not counted as backtracks.
- rule ``"plain"``: naked singles to a fixed point (a blank whose row, column and box leave one digit gets it;
  repeated until none is left; a blank with no digit left is a dead end), no other inference; then branch on the
  first blank in row-major order, digits in increasing order: the least propagation under which a blank with one
  digit left is forced rather than guessed. Measured with it on Norvig's `top95` file (the
  magictour top 95, 17-30 givens), counting to the first solution: median 1,335 guesses, 2,634 on its 76 puzzles
  with 17-23 givens (`results/sudoku/README.md`, "Difficulty and hard puzzles"). A counter with no propagation at
  all (a try counts only when the cell had two or more digits left, as in tdoku's `solver_basic`) needed a median of
  ~240,000 on those 76 puzzles.
- rule ``"fewest"``: the solver above, which follows Norvig's constraint-propagation solver: naked and hidden singles
  to a fixed point (a dead end also when a unit has no place left for a digit), then a branch on the first cell in
  row-major order among those with the fewest candidates, digits in increasing order (his `search` takes the minimum
  of (number of values, square name), the same cell). What it adds is the counting.

Both rules count the search to the first solution by default (``max_solutions=1``: how much a solver guesses to
solve the puzzle); ``max_solutions=2`` counts the whole tree of a unique puzzle (solve and prove uniqueness). Counted
to the first solution, both numbers depend on the digit labels, which do not change the puzzle's logic: over 6
random relabellings of each of 30 `top95` puzzles the largest count was a median 9.4x the smallest under the plain
rule and 5.6x under the fewest rule. The whole-tree count does not depend on the labels (neither rule's choice of
cell looks at them); the plain count also depends on the cell order, so a symmetry of the grid changes it.

This module is the readable reference. `fast_solver` is the same search compiled (numba) and batched over puzzles,
with the same counts and solutions (its tests compare the two on the same puzzles) at ~40-65x the speed; the hard-puzzle
generator (`hard_puzzles`) runs on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

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
    """Depth-first search with naked- and hidden-single propagation. Counts nodes, branch points, tries and wrong
    tries; ``rule="plain"`` drops the hidden singles and branches on the first unsolved cell (see `count_guesses`)."""

    __slots__ = (
        "max_solutions",
        "solutions",
        "nodes",
        "guesses",
        "digit_order",
        "hidden_singles",
        "first_cell",
        "tries",
        "backtracks",
        "max_tries",
        "stopped",
    )

    def __init__(self, max_solutions: int, digit_order=None, rule: str = "fewest", max_tries: int = 0):
        self.max_solutions = max_solutions
        self.solutions: list[list[int]] = []  # each: 9 ints, placed[d] = cells holding digit d+1
        self.nodes = 0
        self.guesses = 0  # branch points
        # Optional per-cell order in which to try digits (tuple of 81 tuples of 0..8): randomises the search.
        self.digit_order = digit_order
        self.hidden_singles = rule == "fewest"
        self.first_cell = rule == "plain"
        self.tries = 0  # digits tried at branch points (each one a guess)
        self.backtracks = 0  # tries whose subtree held no solution
        self.max_tries = max_tries  # > 0: stop before try max_tries + 1 and set `stopped`
        self.stopped = False

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
            if not self.hidden_singles:
                break  # the plain rule: naked singles only
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
        # ---- branch on a cell with fewest candidates (the plain rule: the first unsolved cell) ---------------
        fewest = unsolved if self.first_cell else twos & ~threes or threes & ~fours
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
            if self.max_tries and self.tries >= self.max_tries:
                self.stopped = True
                return
            self.tries += 1
            found = len(self.solutions)
            child = [b & keep for b in boards]
            child[d] = boards[d] & ~_PEERS_AND_SELF[cell]
            child_placed = list(placed)
            child_placed[d] |= bit
            self.run(child, child_placed, unsolved & keep)
            if self.stopped:
                return
            if len(self.solutions) == found:
                self.backtracks += 1
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


GuessRule = Literal["plain", "fewest"]
GUESS_RULES: tuple[str, ...] = ("plain", "fewest")


@dataclasses.dataclass(frozen=True)
class GuessCount:
    """Outcome of :func:`count_guesses` (definitions in the module docstring).

    Attributes:
      guesses: digits tried at branch points (all tries). At most ``max_guesses`` when a cap was set.
      backtracks: guesses undone because no solution lay below them.
      num_solutions: solutions found (capped at ``max_solutions``; 0 for a broken puzzle or a stopped search).
      complete: False when the search stopped at ``max_guesses`` (then the true count is >= ``guesses``).
      rule: the branching rule, ``"plain"`` or ``"fewest"``.
    """

    guesses: int
    backtracks: int
    num_solutions: int
    complete: bool
    rule: str


def _check_rule(rule: str) -> None:
    if rule not in GUESS_RULES:
        raise ValueError(f"rule must be one of {GUESS_RULES}, got {rule!r}.")


def _count_cells(cells: list[int], rule: str, max_solutions: int, max_guesses: int) -> GuessCount:
    search = _Search(max_solutions, rule=rule, max_tries=max_guesses)
    state = _initial_state(cells)
    if state is not None:
        search.run(*state)
    return GuessCount(
        guesses=search.tries,
        backtracks=search.backtracks,
        num_solutions=0 if search.stopped else len(search.solutions),
        complete=not search.stopped,
        rule=rule,
    )


def count_guesses(
    puzzle: Int[np.ndarray, "81"], rule: GuessRule = "plain", max_solutions: int = 1, max_guesses: int = 0
) -> GuessCount:
    """Guesses and backtracks of the depth-first search of ``puzzle`` (0 = blank) under ``rule`` (module docstring).

    ``max_solutions=1`` counts the search to the first solution, 2 to the second one or the end of the tree (a
    unique puzzle's whole tree). ``max_guesses > 0`` stops the search once that many guesses are made (the result
    then has ``complete=False`` and ``guesses == max_guesses``): enough to tell whether a puzzle reaches a threshold
    or which band (`difficulty.guess_band`) it falls in, at bounded cost.
    """
    _check_rule(rule)
    if int(max_solutions) < 1:
        raise ValueError(f"max_solutions must be >= 1, got {max_solutions}.")
    if int(max_guesses) < 0:
        raise ValueError(f"max_guesses must be >= 0 (0: no cap), got {max_guesses}.")
    return _count_cells(_as_grid(puzzle).tolist(), rule, int(max_solutions), int(max_guesses))
