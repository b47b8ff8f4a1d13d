"""Random Sudoku grids and puzzles, and datasets of them that are deterministic per index and cached on disk.

Full grids come from a randomised depth-first search from the empty grid (a random digit order per cell), not from
relabelled copies of one base grid. Puzzles are made by removing cells in random order; with `unique=True` a cell is
only removed when the puzzle stays uniquely solvable: removing cell c from a unique puzzle with solution S keeps it
unique iff no solution has c != S[c], so each check is one satisfiability search with S[c] excluded at c (cheaper
than counting two solutions). Puzzle i of a dataset depends only on (seed, i) (`np.random.default_rng([seed, i])`),
never on the batch or worker split. DiffusionGemma trains on the Kaggle `rohanrao/sudoku` set; generating the
puzzles locally lets the number of givens (the difficulty) be chosen, which Kim et al. 2025 and Ye et al. 2024 both
find decides how hard the task is.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import pathlib
from collections.abc import Sequence

import numpy as np
from jaxtyping import Int

from hackable_diffusion.tasks.sudoku.exact_solver import (  # the solver's bitboards, shared with the carving
    _BIT,
    _BOX_OF,
    _COL_OF,
    _FULL,
    _PEERS_AND_SELF,
    _ROW_OF,
    _UNIT_MASKS,
    _cells_of,
    _decode,
    _initial_state,
    _Search,
)
from hackable_diffusion.tasks.sudoku.grids import MIN_UNIQUE_GIVENS, NUM_CELLS, UNITS


class GenerationError(RuntimeError):
    """Raised when no puzzle with the requested number of givens was found within the allowed attempts."""


def random_full_grid(rng: np.random.Generator) -> Int[np.ndarray, "81"]:
    """A random complete grid from a depth-first search over the empty grid with random digit orders per cell."""
    return _decode(_random_full_placed(rng))


def _random_full_placed(rng: np.random.Generator) -> list[int]:
    # The three diagonal boxes do not see each other, so random permutations there are always consistent: this is
    # the search's first 27 choices made directly. The rest is a DFS with a random digit order per cell.
    keys = rng.random((NUM_CELLS + 3, 9))
    order = np.argsort(keys, axis=1).tolist()
    cells = [0] * NUM_CELLS
    for box, perm in zip((0, 4, 8), order[NUM_CELLS:]):
        for c, d in zip(UNITS[18 + box].tolist(), perm):
            cells[c] = d + 1
    search = _Search(1, digit_order=tuple(tuple(row) for row in order[:NUM_CELLS]))
    search.run(*_initial_state(cells))
    return search.solutions[0]


def _carve(solution: list[int], removal_order: Sequence[int], target_givens: int, unique: bool) -> list[int]:
    """Blanks cells of ``solution`` in ``removal_order`` until ``target_givens`` remain (or no cell can go).

    With ``unique``, blanking cell ``c`` (digit ``d`` in the solution) keeps a unique puzzle unique iff no solution
    puts another digit at ``c``. Cheap sufficient tests come first, on the candidates implied by the givens alone
    (kept up to date incrementally): ``d`` is the only candidate of ``c`` (naked single), or ``c`` is the only place
    for ``d`` in one of its units (hidden single). Otherwise one satisfiability search with ``d`` excluded at ``c``.
    """
    cells = list(solution)
    if not unique:
        for c in removal_order[: NUM_CELLS - target_givens]:
            cells[c] = 0
        return cells
    givens = NUM_CELLS
    digit_cells = [0] * 9  # cells holding digit k+1 in the solution
    for c, v in enumerate(solution):
        digit_cells[v - 1] |= _BIT[c]
    given = _FULL  # cells that are still givens
    boards = [0] * 9  # candidates implied by the givens alone, among blank cells
    for c in removal_order:
        if givens == target_givens:
            break
        d = solution[c] - 1
        bit = _BIT[c]
        new_given = given & ~bit
        peers = _PEERS_AND_SELF[c]
        others = [k for k in range(9) if k != d and not digit_cells[k] & new_given & peers]
        blocked = 0
        for x in _cells_of(digit_cells[d] & new_given):
            blocked |= _PEERS_AND_SELF[x]
        board_d = ~(new_given | blocked) & _FULL
        forced = not others
        if not forced:
            for unit in (_UNIT_MASKS[_ROW_OF[c]], _UNIT_MASKS[9 + _COL_OF[c]], _UNIT_MASKS[18 + _BOX_OF[c]]):
                if not board_d & unit & ~bit:
                    forced = True
                    break
        if not forced:
            trial = list(boards)
            trial[d] = board_d & ~bit  # exclude the solution's digit at c: any solution left is a second one
            for k in others:
                trial[k] |= bit
            search = _Search(1)
            search.run(trial, [m & new_given for m in digit_cells], ~new_given & _FULL)
            forced = not search.solutions
        if forced:
            boards[d] = board_d
            for k in others:
                boards[k] |= bit
            given = new_given
            cells[c] = 0
            givens -= 1
    return cells


def _generate_best(rng: np.random.Generator, givens: int, unique: bool, max_attempts: int):
    """Up to ``max_attempts`` grids; returns (puzzle cells, solution cells) with ``givens`` givens, or the attempt
    that came closest (fewest givens) when none reached the target."""
    best = None
    for _ in range(max(int(max_attempts), 1)):
        sol_cells = _decode(_random_full_placed(rng)).tolist()
        cells = _carve(sol_cells, rng.permutation(NUM_CELLS).tolist(), givens, unique)
        count = NUM_CELLS - cells.count(0)
        if best is None or count < best[2]:
            best = (cells, sol_cells, count)
        if count == givens:
            break
    return best


def generate_puzzle(
    rng: np.random.Generator, givens: int, unique: bool = True, max_attempts: int = 50
) -> tuple[Int[np.ndarray, "81"], Int[np.ndarray, "81"]]:
    """One random ``(puzzle, solution)`` pair (int8, shape (81,)) with exactly ``givens`` givens.

    Cells of a fresh random full grid are blanked in random order; with ``unique=True`` a cell is only blanked when
    the puzzle stays uniquely solvable, and a new grid is tried when the removal gets stuck above ``givens``.
    Random removal ends in a minimal puzzle with about 24 givens on average (22 in ~5% of grids, 21 in ~0.3%,
    fewer practically never), so targets under 23 can need many attempts; :class:`GenerationError` is raised after
    ``max_attempts`` grids. With ``unique=False`` any ``givens`` in 0..81 is reached on the first grid.
    """
    _check_givens(givens, unique)
    cells, sol_cells, count = _generate_best(rng, int(givens), unique, max_attempts)
    if count != givens:
        raise GenerationError(
            f"no unique puzzle with {givens} givens after {max_attempts} random grids (fewest reached: {count}); "
            "raise max_attempts or ask for more givens (random removal rarely goes below ~22)."
        )
    return np.asarray(cells, np.int8), np.asarray(sol_cells, np.int8)


def _check_givens(givens: int, unique: bool) -> None:
    lo = MIN_UNIQUE_GIVENS if unique else 0
    if not lo <= int(givens) <= NUM_CELLS:
        raise ValueError(
            f"givens must be in [{lo}, {NUM_CELLS}]{' for unique puzzles' if unique else ''}, got {givens}."
        )


#: Bump when the generator changes so that old caches are not reused.
#: Bump when the generator changes so that old caches are not reused.
GENERATOR_VERSION = 1


_PARALLEL_MIN = 2000  # below this many puzzles, worker start-up costs more than it saves


_CHUNK = 500


def _default_cache_dir() -> pathlib.Path:
    default = os.path.join(os.path.expanduser("~"), ".cache", "hackable_diffusion")
    root = os.environ.get("HACKABLE_DIFFUSION_CACHE", default)
    return pathlib.Path(root) / "sudoku"


def _generate_range(args) -> dict[str, np.ndarray]:
    """Puzzles ``start..stop-1``; puzzle ``i`` depends only on ``(seed, i)``."""
    start, stop, lo, hi, seed, unique, max_attempts = args
    n = stop - start
    puzzles = np.zeros((n, NUM_CELLS), np.int8)
    solutions = np.zeros((n, NUM_CELLS), np.int8)
    targets = np.zeros(n, np.int16)
    guesses = np.zeros(n, np.int32)
    for row, i in enumerate(range(start, stop)):
        rng = np.random.default_rng([seed, i])
        target = int(rng.integers(lo, hi + 1))
        cells, sol_cells, _ = _generate_best(rng, target, unique, max_attempts)
        puzzles[row] = cells
        solutions[row] = sol_cells
        targets[row] = target
        search = _Search(2)
        search.run(*_initial_state(cells))
        guesses[row] = search.guesses
    return dict(puzzles=puzzles, solutions=solutions, target_givens=targets, guesses=guesses)


def dataset_cache_path(
    n: int,
    givens_range: tuple[int, int],
    seed: int,
    unique: bool,
    cache_dir: str | os.PathLike | None = "default",
    max_attempts: int = 50,
) -> pathlib.Path | None:
    """The ``.npz`` file :func:`generate_dataset` caches these arguments in (None when ``cache_dir`` is None)."""
    if cache_dir is None:
        return None
    lo, hi = (int(v) for v in givens_range)
    key = dict(
        version=GENERATOR_VERSION,
        n=int(n),
        lo=lo,
        hi=hi,
        seed=int(seed),
        unique=bool(unique),
        max_attempts=int(max_attempts),
    )
    folder = _default_cache_dir() if cache_dir == "default" else pathlib.Path(cache_dir)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return folder / f"sudoku_n{n}_g{lo}-{hi}_s{seed}_{'unique' if unique else 'nonunique'}_{digest}.npz"


def generate_dataset(
    n: int,
    givens_range: tuple[int, int] = (24, 50),
    seed: int = 0,
    unique: bool = True,
    num_workers: int | None = None,
    cache_dir: str | os.PathLike | None = "default",
    max_attempts: int = 50,
) -> dict[str, np.ndarray]:
    """``n`` random puzzles with a number of givens drawn uniformly from ``givens_range`` (inclusive).

    Returns a dict of numpy arrays:
      puzzles (n, 81) int8 (0 = blank), solutions (n, 81) int8, givens (n,) int16 (actual number of givens),
      target_givens (n,) int16 (the drawn target), guesses (n,) int32 (solver branching points for a two-solution
      search of the puzzle: 0 means solvable by naked/hidden singles alone).
    ``givens`` equals ``target_givens`` except for unique puzzles whose target random removal could not reach in
    ``max_attempts`` grids (only plausible for targets under ~23); those keep the closest puzzle found.

    Puzzle ``i`` depends only on ``(seed, i)``, so the result does not depend on ``num_workers``. With ``unique=False``
    puzzles are a random full grid with random cells blanked (fast; may have several solutions; ``solutions`` is the
    grid they came from). The result is cached as ``.npz`` in ``cache_dir`` (``"default"``:
    ``$HACKABLE_DIFFUSION_CACHE`` or ``~/.cache/hackable_diffusion``, subfolder ``sudoku``; ``None``: no cache), keyed
    by a hash of the arguments.
    """
    n = int(n)
    if n < 1:
        raise ValueError(f"n must be a positive number of puzzles, got {n}.")
    lo, hi = (int(v) for v in givens_range)
    if lo > hi:
        raise ValueError(f"givens_range must be (low, high) with low <= high, got {givens_range}.")
    _check_givens(lo, unique)
    _check_givens(hi, unique)
    path = dataset_cache_path(n, (lo, hi), seed, unique, cache_dir, max_attempts)
    if path is not None and path.exists():
        with np.load(path) as cached:
            return {k: cached[k] for k in cached.files}
    workers = num_workers if num_workers is not None else (os.cpu_count() or 1)
    workers = max(1, min(int(workers), -(-n // _CHUNK)))
    jobs = [(s, min(s + _CHUNK, n), lo, hi, int(seed), bool(unique), int(max_attempts)) for s in range(0, n, _CHUNK)]
    if workers == 1 or n < _PARALLEL_MIN:
        parts = [_generate_range(job) for job in jobs]
    else:
        # spawn: safe even when the parent process has started threads (JAX, grain).
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            parts = pool.map(_generate_range, jobs, chunksize=1)
    data = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    data["givens"] = np.count_nonzero(data["puzzles"], axis=1).astype(np.int16)
    if path is not None:
        save_npz_atomically(path, data)
    return data


def save_npz_atomically(path: pathlib.Path, data: dict[str, np.ndarray]) -> None:
    """Writes `data` to `path` through a temporary file and a rename, so a reader never sees half a cache file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}.npz")
    np.savez(tmp, **data)
    os.replace(tmp, path)
