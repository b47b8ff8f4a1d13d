"""Sudoku metrics, as DiffusionGemma defines them (google-deepmind/gemma HDA `eval/sudoku_eval.py`, `SudokuAllMetrics`).

Scored on host with numpy from predicted grids (n, 81), the puzzles (0 = blank) and their solutions. Each metric is
a per-puzzle score averaged over puzzles:

- ``accuracy``: the prediction equals the solution in all 81 cells. As a guard against bad reference data it must
  also be a valid grid (rows, columns, boxes hold 1..9) that keeps every given.
- ``cell_accuracy``: correct *blank* cells / **81** (the reference's definition). Quirk: givens never count, so a
  perfect prediction scores ``blanks / 81`` (e.g. 0.63 with 30 givens), not 1, and the score is not comparable
  across difficulty buckets.
- ``blank_accuracy``: correct blank cells / number of blanks (what ``cell_accuracy`` presumably meant; 1.0 for a
  puzzle without blanks). Not in the reference.
- ``exact_mask_accuracy``: every given is preserved in the prediction.
- ``partial_mask_accuracy``: fraction of givens preserved (1.0 for a puzzle without givens).
- ``valid_accuracy``: the prediction is a valid complete grid that keeps the givens, whether or not it equals the
  stored solution (counts other solutions of non-unique puzzles). Not in the reference.

Every metric is reported over all puzzles and per difficulty bucket by number of givens, as in the reference:
``_easy`` (>= 40), ``_medium`` (30-39), ``_hard`` (< 30), with ``sudoku_count`` / ``sudoku_count_easy`` / ... giving
the bucket sizes. An optional categorical column (e.g. the Kaggle ``level``) adds the same keys per category,
suffixed ``_{name}_{value}``. A puzzle whose answer could not be extracted (``extracted=False``) scores 0 on
everything, as in the reference.

Difference: the reference emits NaN-free means because its buckets are never empty on its data; here an empty bucket
reports its count as 0 and each of its metrics as ``None`` (JSON null), so the key set is stable and no NaN appears.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jaxtyping import Bool, Int

from hackable_diffusion.tasks.sudoku.grids import NUM_CELLS, is_valid_solution, respects_givens

METRIC_NAMES = (
    "accuracy",
    "cell_accuracy",
    "blank_accuracy",
    "exact_mask_accuracy",
    "partial_mask_accuracy",
    "valid_accuracy",
)


def _grids(x, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 2 or arr.shape[1] != NUM_CELLS:
        raise ValueError(f"{name} must have shape (n, 81), got {arr.shape}.")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be integer grids (0 = blank, 1..9 digits), got dtype {arr.dtype}.")
    return arr.astype(np.int64)


def per_puzzle_scores(
    predictions: Int[np.ndarray, "n 81"],
    puzzles: Int[np.ndarray, "n 81"],
    solutions: Int[np.ndarray, "n 81"],
    extracted: Bool[np.ndarray, "n"] | None = None,
) -> dict[str, np.ndarray]:
    """Per-puzzle scores (float64, shape (n,)) for each name in :data:`METRIC_NAMES`."""
    pred = _grids(predictions, "predictions")
    puz = _grids(puzzles, "puzzles")
    sol = _grids(solutions, "solutions")
    if not pred.shape == puz.shape == sol.shape:
        raise ValueError(
            f"predictions, puzzles and solutions must have the same shape, got {pred.shape}, {puz.shape}, {sol.shape}."
        )
    n = pred.shape[0]
    ok = np.ones(n, bool) if extracted is None else np.asarray(extracted, bool)
    if ok.shape != (n,):
        raise ValueError(f"extracted must have shape ({n},), got {ok.shape}.")
    blank = puz == 0
    given = ~blank
    num_blank = blank.sum(1)
    num_given = given.sum(1)
    correct = pred == sol
    correct_blank = (correct & blank).sum(1)
    kept = (given & (pred == puz)).sum(1)
    keeps_givens = respects_givens(pred, puz)
    valid = is_valid_solution(pred) & keeps_givens
    scores = dict(
        accuracy=correct.all(1) & valid,
        cell_accuracy=correct_blank / NUM_CELLS,
        blank_accuracy=np.where(num_blank > 0, correct_blank / np.maximum(num_blank, 1), 1.0),
        exact_mask_accuracy=keeps_givens,
        partial_mask_accuracy=np.where(num_given > 0, kept / np.maximum(num_given, 1), 1.0),
        valid_accuracy=valid,
    )
    return {k: np.where(ok, v.astype(np.float64), 0.0) for k, v in scores.items()}


def difficulty_bucket(puzzles: Int[np.ndarray, "n 81"], easy_min: int = 40, medium_min: int = 30) -> np.ndarray:
    """'easy' (>= easy_min givens), 'medium' (>= medium_min), else 'hard', per puzzle (array of str)."""
    givens = np.count_nonzero(_grids(puzzles, "puzzles"), axis=1)
    return np.where(givens >= easy_min, "easy", np.where(givens >= medium_min, "medium", "hard"))


@dataclasses.dataclass(frozen=True)
class SudokuAllMetrics:
    """DiffusionGemma's Sudoku metrics with difficulty buckets; call on host-side numpy grids.

    Attributes:
      easy_min_givens: puzzles with at least this many givens are ``_easy`` (reference: 40).
      medium_min_givens: puzzles with at least this many (and fewer than ``easy_min_givens``) are ``_medium``
        (reference: 30); the rest are ``_hard``.
    """

    easy_min_givens: int = 40
    medium_min_givens: int = 30

    def __call__(
        self,
        predictions: Int[np.ndarray, "n 81"],
        puzzles: Int[np.ndarray, "n 81"],
        solutions: Int[np.ndarray, "n 81"],
        extracted: Bool[np.ndarray, "n"] | None = None,
        categories: np.ndarray | None = None,
        category_name: str = "category",
    ) -> dict[str, float | int | None]:
        """Flat dict: ``{metric}{suffix}`` (float, or None for an empty bucket) and ``sudoku_count{suffix}`` (int),
        for suffix in ``""``, ``_easy``, ``_medium``, ``_hard`` and, with ``categories``, ``_{category_name}_{value}``
        for each distinct value (sorted)."""
        if self.medium_min_givens > self.easy_min_givens:
            raise ValueError(
                f"medium_min_givens ({self.medium_min_givens}) must not exceed "
                f"easy_min_givens ({self.easy_min_givens})."
            )
        scores = per_puzzle_scores(predictions, puzzles, solutions, extracted)
        n = len(scores["accuracy"])
        buckets = difficulty_bucket(puzzles, self.easy_min_givens, self.medium_min_givens)
        groups: list[tuple[str, np.ndarray]] = [("", np.ones(n, bool))]
        groups += [(f"_{b}", buckets == b) for b in ("easy", "medium", "hard")]
        if categories is not None:
            cats = np.asarray(categories)
            if cats.shape != (n,):
                raise ValueError(f"categories must have shape ({n},) (one value per puzzle), got {cats.shape}.")
            groups += [(f"_{category_name}_{value}", cats == value) for value in sorted(set(cats.tolist()))]
        out: dict[str, float | int | None] = {}
        for suffix, member in groups:
            count = int(member.sum())
            for name in METRIC_NAMES:
                out[name + suffix] = float(scores[name][member].mean()) if count else None
            out["sudoku_count" + suffix] = count
        return out


def sudoku_metrics(
    predictions: Int[np.ndarray, "n 81"],
    puzzles: Int[np.ndarray, "n 81"],
    solutions: Int[np.ndarray, "n 81"],
    extracted: Bool[np.ndarray, "n"] | None = None,
    categories: np.ndarray | None = None,
    category_name: str = "category",
) -> dict[str, float | int | None]:
    """:class:`SudokuAllMetrics` with the reference buckets (easy >= 40 givens, medium 30-39, hard < 30)."""
    return SudokuAllMetrics()(predictions, puzzles, solutions, extracted, categories, category_name)
