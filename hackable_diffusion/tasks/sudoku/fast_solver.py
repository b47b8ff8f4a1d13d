"""A compiled exact Sudoku solver: `exact_solver`'s search with the same counts, ~40-65x faster, over many puzzles.

`exact_solver` is the readable reference (pure Python bitboards); this module is the same depth-first search
compiled with numba (a pinned dependency; the kernels are `fast_kernels.py`), batched over puzzles so that one call
solves or counts a whole set. It follows the reference's definitions exactly, so every number it returns equals the
reference's on the same puzzle (`tests/tasks/test_fast_solver.py` compares them):

- propagation to a fixed point: naked singles, and under the ``"fewest"`` rule hidden singles and dead units (a
  digit neither placed in a unit nor possible anywhere in it). Every step only removes candidates, so the fixed
  point, and whether it holds a contradiction, do not depend on the order singles are placed in: this module places
  queued singles cell by cell and rescans only the units whose cells changed, where the reference sweeps bit-sliced
  boards over the whole grid;
- the branch cell: the first blank in row-major order (``"plain"``) or the first among those with the fewest
  candidates (``"fewest"``), digits in increasing order (or a per-cell digit order, for random full grids);
- the counts: guesses (every digit tried at a branch cell), backtracks (tries with no solution below them before the
  search stops), solutions (capped at ``max_solutions``), nodes and branch points, and the stop at ``max_guesses``.

The generator's building blocks (a random full grid, cell removal while a puzzle stays unique, the search for a
second solution) are here too and take the same random draws as `generator` and `hard_puzzles`, so they return the
same grids and puzzles. The first call of each kernel compiles it (seconds; cached on disk after).

Norvig's constraint-propagation solver ("Solving Every Sudoku Puzzle") is the fewest rule's model, as in
`exact_solver`; nothing here differs from the reference's definitions.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jaxtyping import Bool, Int

from hackable_diffusion.tasks.sudoku.fast_kernels import (
    _IDENTITY_ORDER,
    _count_one,
    _minimize_kernel,
    _other_solution_kernel,
    _search_batch,
    _swap_kernel,
    _workspace,
)
from hackable_diffusion.tasks.sudoku.grids import NUM_CELLS, UNITS

GUESS_RULES: tuple[str, ...] = ("plain", "fewest")


_SHARED = None  # one workspace per process for the generator's many small calls (kernels hold the GIL)


def _shared():
    global _SHARED
    if _SHARED is None:
        _SHARED = (_workspace(), np.zeros(6, np.int64), np.zeros(NUM_CELLS, np.int64))
    return _SHARED


def _guesses_of(cells: np.ndarray, rule: str, max_guesses: int) -> int:
    """Guesses of one int8 puzzle to the first solution, stopped at ``max_guesses`` (no checks: the generator's)."""
    work, stats, _ = _shared()
    return _count_one(cells, rule == "fewest", rule == "plain", 1, max_guesses, work, stats)


def _unique(cells: np.ndarray) -> bool:
    work, stats, _ = _shared()
    _count_one(cells, True, False, 2, 0, work, stats)
    return stats[0] == 1


def _swap_cells(trial: np.ndarray, solution: np.ndarray, a: int) -> np.ndarray:
    """`_swap_kernel` for int8 grids: the cells where another solution of ``trial`` (``a`` blank) differs."""
    work, stats, differ = _shared()
    n = _swap_kernel(trial, solution, a, differ, work, stats)
    return differ[:n]


def _minimize_in_place(cells: np.ndarray, solution: np.ndarray, order: np.ndarray, target: int) -> None:
    _minimize_kernel(cells, solution, order, target, _shared()[0])


# ------------------------------------------------------------------------------------------------ public API


def _as_puzzles(puzzles, name: str = "puzzles") -> np.ndarray:
    """``puzzles`` as a C-contiguous int8 array of shape (n, 81), or a ValueError saying what is wrong."""
    arr = np.asarray(puzzles)
    if arr.ndim == 1 and arr.size == NUM_CELLS:
        arr = arr.reshape(1, NUM_CELLS)
    if arr.ndim != 2 or arr.shape[1] != NUM_CELLS:
        raise ValueError(f"error: {name} must have shape (n, 81) (or (81,) for one puzzle), got {arr.shape}.")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"error: {name} must hold integers 0..9 (0 = blank), got dtype {arr.dtype}.")
    if arr.size and (arr.min() < 0 or arr.max() > 9):
        row, col = np.argwhere((arr < 0) | (arr > 9))[0]
        raise ValueError(f"error: {name}[{row}] cell {col} holds {int(arr[row, col])}; use 0 (blank) or 1..9.")
    return np.ascontiguousarray(arr, np.int8)


def _check_counts(rule: str, max_solutions: int, max_guesses: int) -> None:
    if rule not in GUESS_RULES:
        raise ValueError(f"error: rule must be one of {GUESS_RULES}, got {rule!r}.")
    if int(max_solutions) < 1:
        raise ValueError(f"error: max_solutions must be >= 1, got {max_solutions}.")
    if int(max_guesses) < 0:
        raise ValueError(f"error: max_guesses must be >= 0 (0: no cap), got {max_guesses}.")


def _run(puzzles: np.ndarray, rule: str, max_solutions: int, max_guesses: int, keep: int):
    n = len(puzzles)
    sols = np.zeros((n, keep, NUM_CELLS), np.int8)
    stats = np.zeros((n, 6), np.int64)
    if n:
        _search_batch(
            puzzles, rule == "fewest", rule == "plain", int(max_solutions), int(max_guesses), _IDENTITY_ORDER,
            sols, stats, _workspace(),
        )  # fmt: skip
    return sols, stats


@dataclasses.dataclass(frozen=True)
class GuessCounts:
    """Outcome of :func:`count_guesses` per puzzle (the fields of `exact_solver.GuessCount`, as arrays of shape (n,)).

    Attributes:
      guesses: digits tried at branch points; at most ``max_guesses`` when a cap was set.
      backtracks: guesses undone because no solution lay below them.
      num_solutions: solutions found, capped at ``max_solutions`` (0 for broken puzzles and stopped searches).
      complete: False where the search stopped at ``max_guesses``.
      rule: ``"plain"`` or ``"fewest"``.
    """

    guesses: Int[np.ndarray, "n"]
    backtracks: Int[np.ndarray, "n"]
    num_solutions: Int[np.ndarray, "n"]
    complete: Bool[np.ndarray, "n"]
    rule: str


def count_guesses(
    puzzles: Int[np.ndarray, "n 81"], rule: str = "plain", max_solutions: int = 1, max_guesses: int = 0
) -> GuessCounts:
    """`exact_solver.count_guesses` of every row of ``puzzles`` (0 = blank; one puzzle of shape (81,) is a batch of
    one), with the same arguments and the same numbers."""
    _check_counts(rule, max_solutions, max_guesses)
    grids = _as_puzzles(puzzles)
    _, stats = _run(grids, rule, max_solutions, max_guesses, 1)
    stopped = stats[:, 5].astype(bool)
    return GuessCounts(
        guesses=stats[:, 3].copy(),
        backtracks=stats[:, 4].copy(),
        num_solutions=np.where(stopped, 0, np.minimum(stats[:, 0], max_solutions)),
        complete=~stopped,
        rule=rule,
    )


@dataclasses.dataclass(frozen=True)
class Solutions:
    """Outcome of :func:`solve` per puzzle (the fields of `exact_solver.SolveResult`, as arrays).

    Attributes:
      solutions: (n, max_solutions, 81) int8, the solutions found in search order; rows past ``num_solutions`` are 0.
      num_solutions: (n,) solutions found, capped at ``max_solutions`` (1: unique, 0: none, for max_solutions=2).
      nodes: (n,) search nodes (the root plus one per tried digit).
      guesses: (n,) branch points (cells where the search chose between digits).
    """

    solutions: Int[np.ndarray, "n k 81"]
    num_solutions: Int[np.ndarray, "n"]
    nodes: Int[np.ndarray, "n"]
    guesses: Int[np.ndarray, "n"]


def solve(puzzles: Int[np.ndarray, "n 81"], max_solutions: int = 2) -> Solutions:
    """`exact_solver.solve` of every row of ``puzzles``: up to ``max_solutions`` solutions each (the default 2 tells
    unique from ambiguous), found by the fewest rule's search."""
    _check_counts("fewest", max_solutions, 0)
    grids = _as_puzzles(puzzles)
    sols, stats = _run(grids, "fewest", max_solutions, 0, int(max_solutions))
    return Solutions(solutions=sols, num_solutions=stats[:, 0].copy(), nodes=stats[:, 1].copy(),
                     guesses=stats[:, 2].copy())  # fmt: skip


def is_unique(puzzles: Int[np.ndarray, "n 81"]) -> Bool[np.ndarray, "n"]:
    """True for each row of ``puzzles`` that has exactly one solution."""
    return solve(puzzles, max_solutions=2).num_solutions == 1


# ----------------------------------------------------------------------------------- the generator's building blocks


def random_full_grid(rng: np.random.Generator) -> Int[np.ndarray, "81"]:
    """`generator.random_full_grid`: the same grid from the same ``rng`` state (and the same draws taken from it)."""
    keys = rng.random((NUM_CELLS + 3, 9))
    order = np.argsort(keys, axis=1)
    cells = np.zeros(NUM_CELLS, np.int8)
    for box, perm in zip((0, 4, 8), order[NUM_CELLS:]):
        cells[UNITS[18 + box]] = perm + 1
    sols = np.zeros((1, 1, NUM_CELLS), np.int8)
    stats = np.zeros((1, 6), np.int64)
    digit_order = np.ascontiguousarray(order[:NUM_CELLS], np.int8)
    _search_batch(cells[None], True, False, 1, 0, digit_order, sols, stats, _shared()[0])
    return sols[0, 0]


def other_solution(
    cells: Int[np.ndarray, "81"], solution: Int[np.ndarray, "81"], cell: int
) -> Int[np.ndarray, "81"] | None:
    """A solution of ``cells`` (with ``cell`` blank) that puts another digit than ``solution[cell]`` at ``cell``, the
    first the fewest rule's search finds; None when there is none (then blanking ``cell`` of the puzzle whose unique
    solution is ``solution`` keeps it unique)."""
    grid = _as_puzzles(cells, "cells")[0]
    sol = _as_puzzles(solution, "solution")[0]
    out = np.zeros(NUM_CELLS, np.int8)
    found = _other_solution_kernel(grid, sol, int(cell), out, _workspace(), np.zeros(6, np.int64))
    return out if found else None


def minimize(
    cells: Int[np.ndarray, "81"], solution: Int[np.ndarray, "81"], order: Int[np.ndarray, "k"], target: int
) -> Int[np.ndarray, "81"]:
    """A copy of the unique puzzle ``cells`` (solution ``solution``) with givens blanked in ``order`` while it stays
    unique and has more than ``target`` givens (`hard_puzzles`' removal; from the full grid, `generator._carve`)."""
    out = _as_puzzles(cells, "cells")[0].copy()
    sol = _as_puzzles(solution, "solution")[0]
    _minimize_kernel(out, sol, np.ascontiguousarray(order, np.int64), int(target), _workspace())
    return out


def carve(solution: Int[np.ndarray, "81"], removal_order: Int[np.ndarray, "k"], target_givens: int) -> np.ndarray:
    """`generator._carve` with ``unique=True``: cells of the full grid ``solution`` blanked in ``removal_order`` while
    the puzzle stays unique, down to ``target_givens``."""
    return minimize(solution, solution, removal_order, target_givens)
