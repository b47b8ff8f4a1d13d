"""Sudoku difficulty as a number: guess bands, the guess counts of a puzzle set (cached), and accuracy per band.

The number is the guess count of `exact_solver.count_guesses` (definitions of a guess, a backtrack and the "plain" and
"fewest" branching rules are in that module's docstring): by default the plain rule, counted to the first solution.
Bands: ``0`` (the rule's propagation alone solves the puzzle), ``1-9``, ``10-99``, ``100-999`` and ``1000+``
(:func:`guess_band`). The fewest rule needs 10-50x fewer guesses on the same puzzle (the published hardest
puzzles: a median of about 50), so its counts get finer bands, `FEWEST_BANDS` ``0``, ``1-9``, ``10-29``, ``30-49``,
``50-99``, ``100+`` (``guess_band(counts, rule="fewest")``). Counting stops at 1,000 guesses (`BAND_CAP`), where the band is known, so a puzzle costs at most
about 1,000 search nodes (~10 ms in pure Python) and a set of 5,000 a few seconds to a minute; the counts of a set are
cached on disk next to the generator's datasets. `evaluate` reports accuracy per band and per number of givens next to
the overall figures (:func:`accuracy_by_difficulty`).
"""

from __future__ import annotations

import hashlib
import os
import pathlib

import numpy as np
from jaxtyping import Bool, Int

from hackable_diffusion.tasks.sudoku.exact_solver import GuessRule, _check_rule, _count_cells
from hackable_diffusion.tasks.sudoku.generator import _default_cache_dir
from hackable_diffusion.tasks.sudoku.grids import NUM_CELLS
from hackable_diffusion.tasks.sudoku.metrics import per_puzzle_scores

GUESS_BANDS: tuple[str, ...] = ("0", "1-9", "10-99", "100-999", "1000+")
_BAND_LOWER_EDGES = (1, 10, 100, 1000)  # the first guess count of each band after "0"
BAND_CAP = 1000  # counting further never changes the band
FEWEST_BANDS: tuple[str, ...] = ("0", "1-9", "10-29", "30-49", "50-99", "100+")
_FEWEST_LOWER_EDGES = (1, 10, 30, 50, 100)
COUNTS_VERSION = 1  # bump when the solver's counting changes, so that cached counts are not reused


def bands_of(rule: GuessRule = "plain") -> tuple[str, ...]:
    """The band names of counts of `rule`: `GUESS_BANDS` (plain) or `FEWEST_BANDS` (fewest)."""
    _check_rule(rule)
    return FEWEST_BANDS if rule == "fewest" else GUESS_BANDS


def guess_band(guesses: Int[np.ndarray, "*b"] | int, rule: GuessRule = "plain") -> np.ndarray:
    """The band of each guess count of `rule` (array of str with the shape of ``guesses``; a 0-d array for a
    scalar): plain ``"0"``, ``"1-9"``, ``"10-99"``, ``"100-999"`` or ``"1000+"``; fewest ``"0"``, ``"1-9"``,
    ``"10-29"``, ``"30-49"``, ``"50-99"`` or ``"100+"``. Negative counts raise a ValueError."""
    edges = _FEWEST_LOWER_EDGES if bands_of(rule) is FEWEST_BANDS else _BAND_LOWER_EDGES
    g = np.asarray(guesses)
    if not np.issubdtype(g.dtype, np.integer):
        raise ValueError(f"guess counts must be integers, got dtype {g.dtype}.")
    if g.size and int(g.min()) < 0:
        raise ValueError(f"guess counts must be >= 0, got {int(g.min())}.")
    return np.asarray(bands_of(rule))[np.searchsorted(edges, g, side="right")]


def _grids(puzzles) -> np.ndarray:
    arr = np.asarray(puzzles)
    if arr.ndim != 2 or arr.shape[1] != NUM_CELLS:
        raise ValueError(f"puzzles must have shape (n, 81), got {arr.shape}.")
    return arr.astype(np.int8)


def guess_counts_path(
    puzzles: Int[np.ndarray, "n 81"],
    rule: GuessRule = "plain",
    max_guesses: int = BAND_CAP,
    max_solutions: int = 1,
    cache_dir: str | os.PathLike | None = "default",
) -> pathlib.Path | None:
    """The ``.npy`` file :func:`guess_counts` caches these counts in (None when ``cache_dir`` is None)."""
    if cache_dir is None:
        return None
    grids = _grids(puzzles)
    key = f"v{COUNTS_VERSION}|{rule}|{int(max_guesses)}|{int(max_solutions)}|".encode() + grids.tobytes()
    digest = hashlib.sha256(key).hexdigest()[:16]
    folder = _default_cache_dir() if cache_dir == "default" else pathlib.Path(cache_dir)
    return folder / f"guesses_{rule}_n{len(grids)}_{digest}.npy"


def guess_counts(
    puzzles: Int[np.ndarray, "n 81"],
    rule: GuessRule = "plain",
    max_guesses: int = BAND_CAP,
    max_solutions: int = 1,
    cache_dir: str | os.PathLike | None = "default",
) -> Int[np.ndarray, "n"]:
    """`exact_solver.count_guesses` of every puzzle (int64, shape (n,)), each capped at ``max_guesses`` (0: no cap).

    Cached as ``.npy`` in ``cache_dir`` (``"default"``: the generator's folder, ``$HACKABLE_DIFFUSION_CACHE/sudoku``;
    None: no cache), keyed by a hash of the puzzles and the arguments.
    """
    _check_rule(rule)
    if int(max_solutions) < 1 or int(max_guesses) < 0:
        raise ValueError(f"need max_solutions >= 1 and max_guesses >= 0, got {max_solutions}, {max_guesses}.")
    grids = _grids(puzzles)
    path = guess_counts_path(grids, rule, max_guesses, max_solutions, cache_dir)
    if path is not None and path.exists():
        return np.load(path)
    counts = np.array(
        [_count_cells(row.tolist(), rule, int(max_solutions), int(max_guesses)).guesses for row in grids], np.int64
    )
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}.npy")
        np.save(tmp, counts)
        os.replace(tmp, path)
    return counts


def accuracy_by_difficulty(
    predictions: Int[np.ndarray, "n 81"],
    puzzles: Int[np.ndarray, "n 81"],
    solutions: Int[np.ndarray, "n 81"],
    guesses: Int[np.ndarray, "n"],
    extracted: Bool[np.ndarray, "n"] | None = None,
) -> dict[str, float | int | None]:
    """Exact-grid accuracy (`metrics.per_puzzle_scores`' ``accuracy``) and puzzle count per guess band and per number
    of givens: ``accuracy_guesses_{band}`` / ``sudoku_count_guesses_{band}`` for every band of `GUESS_BANDS` (an empty
    band: count 0, accuracy None), and ``accuracy_givens_{g}`` / ``sudoku_count_givens_{g}`` for each number of givens
    ``g`` the set holds."""
    accuracy = per_puzzle_scores(predictions, puzzles, solutions, extracted)["accuracy"]
    guesses = np.asarray(guesses)
    if guesses.shape != accuracy.shape:
        raise ValueError(f"guesses must have shape ({len(accuracy)},) (one count per puzzle), got {guesses.shape}.")
    bands = guess_band(guesses)
    givens = np.count_nonzero(np.asarray(puzzles), axis=1)
    out: dict[str, float | int | None] = {}
    groups = [(f"guesses_{band}", bands == band) for band in GUESS_BANDS]
    groups += [(f"givens_{g}", givens == g) for g in sorted(set(givens.tolist()))]
    for name, member in groups:
        count = int(member.sum())
        out[f"accuracy_{name}"] = float(accuracy[member].mean()) if count else None
        out[f"sudoku_count_{name}"] = count
    return out
