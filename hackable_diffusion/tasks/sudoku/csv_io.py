"""Reading Sudoku puzzles (and solutions) from CSV files: the Kaggle and Radcliffe layouts, or headerless grids."""

from __future__ import annotations

import csv
import os
import pathlib

import numpy as np
from jaxtyping import Int

from hackable_diffusion.tasks.sudoku.exact_solver import solve
from hackable_diffusion.tasks.sudoku.grids import NUM_CELLS, is_valid_solution, respects_givens

_PUZZLE_COLUMNS = ("puzzle", "puzzles", "quizzes", "quiz")


_SOLUTION_COLUMNS = ("solution", "solutions")


_GRID_CHARS = frozenset("0123456789.")


def parse_grid(text: str) -> Int[np.ndarray, "81"]:
    """An 81-character grid string (``0`` or ``.`` for blanks; spaces ignored) as an int8 array of shape (81,)."""
    s = text.replace(" ", "").strip()
    if len(s) != NUM_CELLS or not set(s) <= _GRID_CHARS:
        raise ValueError(f"a grid must be 81 characters of 0-9 or '.', got {len(s)} characters: {text[:100]!r}.")
    return (np.frombuffer(s.replace(".", "0").encode("ascii"), np.uint8) - ord("0")).astype(np.int8)


def _looks_like_grid(field: str) -> bool:
    s = field.replace(" ", "").strip()
    return len(s) == NUM_CELLS and set(s) <= _GRID_CHARS


def _to_array(values: list[str]) -> np.ndarray:
    """Integers if every value is an integer, else floats if every value is a number, else strings."""
    for dtype in (np.int64, np.float64):
        try:
            return np.asarray(values).astype(dtype)
        except ValueError:
            continue
    return np.asarray(values, dtype=str)


def read_sudoku_csv(
    path: str | os.PathLike, limit: int | None = None, validate: bool = True, solve_missing: bool = False
) -> dict[str, np.ndarray]:
    """Reads puzzles (and solutions) from a CSV file.

    Layouts: a header with a puzzle column (``puzzle``/``quizzes``, case-insensitive) and a solution column
    (``solution``/``solutions``), e.g. Kaggle bryanpark ``quizzes,solutions``, rohanrao ``puzzle,solution`` or
    Radcliffe's ``id,puzzle,solution,clues,difficulty`` (here with a ``level`` column too); or no header, where the
    first field is the puzzle and the second (if any) the solution. Grids are 81 characters, ``0`` or ``.`` for a
    blank (spaces between digits are ignored).

    Returns ``puzzles`` and ``solutions`` as (n, 81) int8 arrays plus every other column as a numpy array (integers,
    floats or strings, whichever fits all values), keyed by its header name. ``limit`` keeps the first rows only.
    ``validate`` checks that every solution is a complete valid grid that keeps its puzzle's givens. A file
    without solutions raises unless ``solve_missing=True``, which solves each puzzle (it must be unique).
    Malformed rows raise a ValueError naming the line.
    """
    path = pathlib.Path(path)
    if limit is not None and int(limit) < 0:
        raise ValueError(f"limit must be None or >= 0, got {limit}.")
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        first = next(reader, None)
        while first is not None and not any(field.strip() for field in first):
            first = next(reader, None)
        if first is None:
            raise ValueError(f"{path}: the file is empty; expected puzzles (and solutions) as 81-character grids.")
        if _looks_like_grid(first[0]):
            names = ["puzzle", "solution"][: min(len(first), 2)] + [f"column{i}" for i in range(2, len(first))]
            pending = [(reader.line_num, first)]
        else:
            names = [h.strip() for h in first]
            pending = []
        lower = [h.lower() for h in names]
        p_col = next((lower.index(c) for c in _PUZZLE_COLUMNS if c in lower), None)
        s_col = next((lower.index(c) for c in _SOLUTION_COLUMNS if c in lower), None)
        if p_col is None:
            raise ValueError(
                f"{path}: no puzzle column in header {names}; expected one named {'/'.join(_PUZZLE_COLUMNS)}, or no "
                "header and 81-character grids in the first column."
            )
        if s_col is None and not solve_missing:
            raise ValueError(
                f"{path}: no solution column in header {names}; expected one named {'/'.join(_SOLUTION_COLUMNS)}, "
                "or pass solve_missing=True to solve the puzzles."
            )
        extra_cols = [i for i in range(len(names)) if i not in (p_col, s_col)]
        puzzles, solutions, lines = [], [], []
        extras: list[list[str]] = [[] for _ in extra_cols]

        def rows():
            yield from pending
            for row in reader:
                yield reader.line_num, row

        for line, row in rows():
            if limit is not None and len(puzzles) >= int(limit):
                break
            if not any(field.strip() for field in row):
                continue
            if len(row) != len(names):
                raise ValueError(f"{path}:{line}: expected {len(names)} fields ({','.join(names)}), got {len(row)}.")
            for col, label in ((p_col, "puzzle"), (s_col, "solution")):
                if col is None:
                    continue
                s = row[col].replace(" ", "").strip()
                if len(s) != NUM_CELLS:
                    raise ValueError(f"{path}:{line}: the {label} has {len(s)} cells, expected 81: {row[col][:100]!r}.")
                if not set(s) <= _GRID_CHARS:
                    bad = sorted(set(s) - _GRID_CHARS)
                    raise ValueError(
                        f"{path}:{line}: the {label} contains {bad}; use digits 1-9 and 0 or '.' for a blank."
                    )
                (puzzles if label == "puzzle" else solutions).append(s)
            for values, col in zip(extras, extra_cols):
                values.append(row[col].strip())
            lines.append(line)

    def to_grids(strings: list[str]) -> np.ndarray:
        if not strings:
            return np.zeros((0, NUM_CELLS), np.int8)
        raw = np.frombuffer("".join(strings).replace(".", "0").encode("ascii"), np.uint8).reshape(-1, NUM_CELLS)
        return (raw - ord("0")).astype(np.int8)

    out: dict[str, np.ndarray] = {"puzzles": to_grids(puzzles)}
    if s_col is not None:
        out["solutions"] = to_grids(solutions)
    else:
        sols = []
        for line, puzzle in zip(lines, out["puzzles"]):
            res = solve(puzzle)
            if res.num_solutions != 1:
                raise ValueError(
                    f"{path}:{line}: the puzzle has {res.num_solutions} solutions (0, or 2 and more); "
                    "solve_missing needs uniquely solvable puzzles."
                )
            sols.append(res.solutions[0])
        out["solutions"] = np.stack(sols) if sols else np.zeros((0, NUM_CELLS), np.int8)
    if validate and s_col is not None and len(lines):
        ok = is_valid_solution(out["solutions"]) & respects_givens(out["solutions"], out["puzzles"])
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            what = (
                "is not a valid complete grid"
                if not is_valid_solution(out["solutions"][i])
                else "changes a given of the puzzle"
            )
            raise ValueError(
                f"{path}:{lines[i]}: the solution {what}; fix or remove that row (in Python, "
                "read_sudoku_csv(..., validate=False) reads the file without this check)."
            )
    for values, col in zip(extras, extra_cols):
        out[names[col]] = _to_array(values)
    return out
