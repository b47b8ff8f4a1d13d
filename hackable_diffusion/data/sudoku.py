"""Sudoku data layer: exact solver, random grid/puzzle generator, CSV readers, validity and token helpers.

Follows the DiffusionGemma Sudoku task (google-deepmind/gemma HDA `data/sudoku/*`, `eval/sudoku_eval.py`): grids
are 81 cells in row-major order, 0 is a blank and 1..9 are digits; difficulty buckets are by the number of givens.
The reference trains on Kaggle `rohanrao/sudoku`; here training puzzles are generated locally (Kim et al. 2025 and
Ye et al. 2024 both stress that the puzzle source decides how hard the task is), and
a 5,000-puzzle sample of the Kaggle 3M set (`hackable_diffusion/data/files/kaggle3m_curated_5000.csv`, CC0, shipped
with the package) is read for evaluation.

Deliberate differences from the usual recipes:
- Full grids come from a randomised depth-first search from the empty grid (a random digit order per cell), not
  from relabelled/permuted copies of one base grid.
- Puzzles are made by removing cells in random order; with ``unique=True`` a cell is only removed when the puzzle
  stays uniquely solvable. Removal of cell ``c`` from a unique puzzle with solution ``S`` keeps it unique iff no
  solution has ``c != S[c]``, so each check is one satisfiability search with ``S[c]`` excluded at ``c`` (cheaper
  than counting two solutions).
- Puzzle ``i`` of a dataset depends only on ``(seed, i)`` (``np.random.default_rng([seed, i])``), never on the
  batch or worker split.

Solver internals: one 81-bit Python int per digit holds the cells where that digit is still possible; naked singles
come from a bit-sliced count over the nine boards, hidden singles from the 27 unit masks, and the search branches on
a cell with the fewest candidates (a bivalue cell when there is one).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import multiprocessing
import os
import pathlib
from collections.abc import Sequence

import numpy as np
from jaxtyping import Bool, Int

# ----------------------------------------------------------------------------------------------------------------
# Geometry
# ----------------------------------------------------------------------------------------------------------------

NUM_CELLS = 81
MIN_UNIQUE_GIVENS = 17  # No uniquely solvable Sudoku has fewer givens (McGuire et al. 2012).

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


# ----------------------------------------------------------------------------------------------------------------
# Input checking
# ----------------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------------
# Solver core (bitboards: boards[d] = cells where digit d+1 is still possible, among unsolved cells)
# ----------------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------------
# Public solver API
# ----------------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------------
# Generator
# ----------------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------------
# Datasets (deterministic per index, multiprocess, cached)
# ----------------------------------------------------------------------------------------------------------------

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
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}.npz")
        np.savez(tmp, **data)
        os.replace(tmp, path)
    return data


# ----------------------------------------------------------------------------------------------------------------
# Validity helpers (vectorised over leading axes)
# ----------------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------------
# Token layout for models
# ----------------------------------------------------------------------------------------------------------------


def grid_to_tokens(grid: Int[np.ndarray, "*b 81"], mask_id: int) -> Int[np.ndarray, "*b 81"]:
    """Cells as tokens: digit ``d`` -> token ``d`` (1..9), blank -> ``mask_id``. Returns int32."""
    g = _as_grids(grid, "grid").astype(np.int32)
    if 1 <= int(mask_id) <= 9:
        raise ValueError(f"mask_id must not collide with the digit tokens 1..9, got {mask_id}.")
    return np.where(g == 0, np.int32(mask_id), g)


def tokens_to_grid(tokens: Int[np.ndarray, "*b 81"]) -> Int[np.ndarray, "*b 81"]:
    """Inverse of :func:`grid_to_tokens`: tokens 1..9 become digits, every other token a blank (0). Returns int8."""
    t = _as_grids(tokens, "tokens")
    return np.where((t >= 1) & (t <= 9), t, 0).astype(np.int8)


def structure_indices() -> dict[str, np.ndarray]:
    """Row, column and box index (0..8) of each of the 81 cells, for optional structure embeddings."""
    return dict(row=ROW_INDEX, col=COL_INDEX, box=BOX_INDEX)


# ----------------------------------------------------------------------------------------------------------------
# CSV readers
# ----------------------------------------------------------------------------------------------------------------

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
