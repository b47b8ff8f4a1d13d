"""Sudoku grids: the 81 cells, their units, and validity checks vectorised over leading axes.

A grid is 81 cells in row-major order, 0 a blank and 1..9 digits, as in DiffusionGemma's Sudoku task (docs/reference.md
§6). These are the host-side (numpy) facts every other part of the task builds on: the solver, the generator, the
metrics, the repairs of the solver loop and the rules constraint.
"""

from __future__ import annotations

import numpy as np
from jaxtyping import Bool, Int

NUM_CELLS = 81
MIN_UNIQUE_GIVENS = 17  # No uniquely solvable Sudoku has fewer givens (McGuire et al. 2012).

#: Row, column and 3x3-box index (0..8) of every cell, row-major.
#: Row, column and 3x3-box index (0..8) of every cell, row-major. Useful as structure embeddings for models.
ROW_INDEX: np.ndarray = np.repeat(np.arange(9, dtype=np.int32), 9)


COL_INDEX: np.ndarray = np.tile(np.arange(9, dtype=np.int32), 9)


BOX_INDEX: np.ndarray = (ROW_INDEX // 3) * 3 + COL_INDEX // 3
for _a in (ROW_INDEX, COL_INDEX, BOX_INDEX):
    _a.setflags(write=False)

#: The 27 units (9 rows, 9 columns, 9 boxes) as cell indices, shape (27, 9).
UNITS: np.ndarray = np.concatenate(
    [
        np.arange(81).reshape(9, 9),
        np.arange(81).reshape(9, 9).T,
        np.array(
            [[r * 9 + c for r in range(br, br + 3) for c in range(bc, bc + 3)] for br in (0, 3, 6) for bc in (0, 3, 6)]
        ),
    ]
).astype(np.int32)
UNITS.setflags(write=False)


def _as_grid(grid, name: str = "puzzle") -> np.ndarray:
    """Returns ``grid`` as an int8 array of shape (81,), or raises a ValueError saying what is wrong."""
    arr = np.asarray(grid)
    if arr.size != NUM_CELLS:
        raise ValueError(f"{name} must have 81 cells (shape (81,) or (9, 9)), got shape {arr.shape}.")
    if not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and np.all(np.mod(arr, 1) == 0):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"{name} must hold integers 0..9 (0 = blank), got dtype {arr.dtype}.")
    arr = arr.reshape(NUM_CELLS)
    if arr.min() < 0 or arr.max() > 9:
        bad = int(np.flatnonzero((arr < 0) | (arr > 9))[0])
        raise ValueError(f"{name} cell {bad} holds {int(arr[bad])}; cells must be 0 (blank) or 1..9.")
    return arr.astype(np.int8)


def _as_grids(grids, name: str) -> np.ndarray:
    arr = np.asarray(grids)
    if arr.ndim == 0 or arr.shape[-1] != NUM_CELLS:
        if arr.ndim >= 2 and arr.shape[-2:] == (9, 9):
            arr = arr.reshape(*arr.shape[:-2], NUM_CELLS)
        else:
            raise ValueError(f"{name} must have a last axis of 81 cells (or last axes (9, 9)), got shape {arr.shape}.")
    return arr


def is_valid_solution(grid: Int[np.ndarray, "*b 81"]) -> Bool[np.ndarray, "*b"]:
    """True where ``grid`` is a complete valid Sudoku (every row, column and box holds 1..9 once)."""
    g = _as_grids(grid, "grid")
    units = np.sort(g[..., UNITS], axis=-1)
    return np.all(units == np.arange(1, 10), axis=(-2, -1))


def conflicting_cells(grid: Int[np.ndarray, "*b 81"], *, whole_units: bool = False) -> Bool[np.ndarray, "*b 81"]:
    """True at each filled cell whose digit appears again in the cell's row, column or box (blanks never conflict);
    with `whole_units`, at every cell of a row, column or box that holds a repeated digit.

    A complete grid that keeps a unique puzzle's givens and has no conflict is that puzzle's solution, so these are
    the cells a solver can re-decide without knowing the answer.
    """
    g = _as_grids(grid, "grid")
    units = g[..., UNITS]  # (*b, 27, 9)
    digit_counts = (units[..., None] == np.arange(1, 10)).sum(axis=-2)  # (*b, 27, 9 digits)
    repeated = (units > 0) & (np.take_along_axis(digit_counts, np.clip(units - 1, 0, 8), axis=-1) > 1)
    if whole_units:
        repeated = np.broadcast_to(repeated.any(axis=-1, keepdims=True), repeated.shape)
    out = np.zeros(g.shape, bool)
    for u, cells in enumerate(UNITS):
        out[..., cells] |= repeated[..., u, :]
    return out


def respects_givens(grid: Int[np.ndarray, "*b 81"], puzzle: Int[np.ndarray, "*b 81"]) -> Bool[np.ndarray, "*b"]:
    """True where ``grid`` keeps every given (non-zero cell) of ``puzzle``."""
    g = _as_grids(grid, "grid")
    p = _as_grids(puzzle, "puzzle")
    return np.all((p == 0) | (g == p), axis=-1)


# -- grids as text: the puzzles and answers of lm-eval's `hd_sudoku_solve` task ------------------------------------

TEXT_BLANK = "."  # a blank cell in a grid's text


def grid_to_text(grid: Int[np.ndarray, " 81"]) -> str:
    """81 cells (0 = blank) -> 81 characters, digits and `.` for blanks."""
    return "".join(TEXT_BLANK if int(v) == 0 else str(int(v)) for v in grid)


def text_to_grid(text: str) -> Int[np.ndarray, " 81"]:
    """The last 81 cell characters (digits, `.` or `0` for blanks) of `text` -> an (81,) int8 grid (0 = blank); any
    other characters (a label, spaces, newlines) are ignored. A ValueError when there are fewer than 81."""
    cells = [c for c in text if c.isdigit() or c == TEXT_BLANK]
    if len(cells) < NUM_CELLS:
        raise ValueError(
            f"a Sudoku puzzle needs 81 cells (digits, '.' or '0' for blanks); got {len(cells)} in {text!r}."
        )
    return np.array([0 if c == TEXT_BLANK else int(c) for c in cells[-NUM_CELLS:]], dtype=np.int8)
