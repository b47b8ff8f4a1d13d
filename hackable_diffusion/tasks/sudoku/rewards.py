"""Sudoku as an RL environment: the puzzles RL trains on, completions from the run's solver, a verifiable reward.

The reward is the exact checker: 1.0 for a grid that is complete, keeps every given and breaks no row, column or box
rule (for a unique puzzle, its solution), else 0.0. `shaped=True` adds partial credit below that: a grid that keeps
the givens earns 0.5 x the fraction of the puzzle's blanks holding a digit that conflicts with no other cell, so a
nearly right grid scores more than a wrong one; a grid that changes a given earns 0. Garbage (wrong shape aside:
digits outside 0..9, blanks) never raises: out-of-range cells count as blanks.
"""

from __future__ import annotations

import numpy as np
from jaxtyping import Bool, Float, Int

from hackable_diffusion.data.tokenizers import MASK_ID
from hackable_diffusion.tasks.sudoku.grids import conflicting_cells
from hackable_diffusion.tasks.sudoku.vocab import SudokuVocab

SHAPED_CREDIT = 0.5  # the most partial credit a wrong grid can earn


def _clean(grids: np.ndarray) -> np.ndarray:
    g = np.asarray(grids).astype(np.int64)
    return np.where((g >= 1) & (g <= 9), g, 0).astype(np.int8)


def sudoku_reward(
    puzzles: Int[np.ndarray, "n 81"], grids: Int[np.ndarray, "n 81"], *, shaped: bool = False
) -> Float[np.ndarray, " n"]:
    """1.0 for an exact grid, else 0.0 (`shaped`: partial credit, see the module docstring)."""
    puzzles, grids = _clean(puzzles), _clean(grids)
    if puzzles.shape != grids.shape or puzzles.ndim != 2 or puzzles.shape[1] != 81:
        raise ValueError(f"puzzles and grids must be (n, 81) arrays of one shape, got {puzzles.shape}, {grids.shape}.")
    blank = puzzles == 0
    keeps_givens = np.all(blank | (grids == puzzles), axis=-1)
    conflicts = conflicting_cells(grids)
    complete = np.all(grids != 0, axis=-1)
    exact = keeps_givens & complete & ~conflicts.any(axis=-1)
    if not shaped:
        return exact.astype(np.float32)
    good = blank & (grids != 0) & ~conflicts
    fraction = good.sum(-1) / np.maximum(blank.sum(-1), 1)
    partial = np.where(keeps_givens, SHAPED_CREDIT * fraction, 0.0)
    return np.where(exact, 1.0, partial).astype(np.float32)


def policy_rows(
    puzzles: Int[np.ndarray, "n 81"],
    grids: Int[np.ndarray, "n 81"],
    *,
    layout: str,
    commit_pass: Int[np.ndarray, "n 81"] | None = None,
) -> dict[str, np.ndarray]:
    """The rows the policy scored, exactly as sampled (the reward reads the same grids): in place, the 81 cells (the
    sampler holds the givens) with the filled blanks as the completion, blanks a solver left empty not part of it
    (nothing was generated there); AR, [the puzzle as a prompt (MASK at blanks); the 81 cells the sampler wrote, a
    changed given included], all 81 the completion (the AR sampler draws every cell; one that is not a digit is
    refused). `commit_pass` (in place only: the pass that wrote each cell) is passed through as `commit_pass`."""
    vocab = SudokuVocab()
    puzzles, grids = _clean(puzzles), _clean(grids)
    filled = np.where(puzzles != 0, puzzles, grids)
    cells = vocab.encode(filled)
    generated: Bool[np.ndarray, "n 81"] = (puzzles == 0) & (filled != 0)
    if layout == "in_place":
        rows = {"tokens": cells, "completion": generated}
        if commit_pass is not None:
            rows["commit_pass"] = np.asarray(commit_pass, np.int32).reshape(cells.shape)
        return rows
    if commit_pass is not None:
        raise ValueError(f"commit passes are recorded for the in-place layout alone, not {layout!r}.")
    if layout == "ar":
        if np.any(grids == 0):
            raise ValueError(
                "an AR Sudoku row must hold the 81 digits its sampler wrote (every cell is drawn); got a grid with "
                "empty or non-digit cells."
            )
        prompt = np.where(puzzles != 0, vocab.encode(puzzles), MASK_ID).astype(np.int32)
        n = len(grids)
        return {
            "tokens": np.concatenate([prompt, vocab.encode(grids)], axis=1).astype(np.int32),
            "completion": np.concatenate([np.zeros((n, 81), bool), np.ones((n, 81), bool)], axis=1),
        }
    raise ValueError(f"RL on Sudoku supports the in-place and AR layouts, not {layout!r}.")
