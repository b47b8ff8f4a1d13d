"""Hard Sudoku puzzles: seeded, unique-solution puzzles in a givens range that need at least a number of guesses.

Puzzle i of a set depends only on (seed, i) (`np.random.default_rng([seed, i, SALT])`), never on the worker split,
and is made as follows (the figures that chose this method are in `results/sudoku/README.md`, "Difficulty and hard
puzzles"):

1. a random full grid (`generator`'s randomised depth-first search) and a target number of givens t drawn uniformly
   from the givens range;
2. cells removed in random order while the puzzle stays unique, down to t or to a minimal puzzle
   (`generator._carve`, the method of `generator.generate_puzzle`);
3. when the puzzle has more givens than the range allows or fewer guesses than `min_guesses` (`exact_solver
   .count_guesses` under `rule`, to the first solution), a hill-climb on the same solution grid for up to
   `climb_steps` moves. A move takes a random given a out, finds a second solution of what is left (one search that
   excludes the solution's digit at a), puts back the solution's digit at a random cell b where that second solution
   differs (which rules it out), keeps the result only if it is unique, then removes givens in random order while the
   puzzle stays unique and has more than t givens. A move is accepted when the givens above the range drop, or stay
   and the guess count (capped at `min_guesses`) does not drop; the climb stops as soon as the puzzle is in range and
   reaches `min_guesses`;
4. otherwise a new grid; after `max_grids` grids a `GenerationError`.

Swapping one clue for another while keeping the solution is the usual local move of low-clue and hard-puzzle searches;
tdoku's `generate` (t-dillon/tdoku) instead drops clues and re-completes the puzzle, keeps a pool of the best-scored
puzzles, and scores difficulty by the geometric mean of a solver's guesses over random permutations of the puzzle.
Here the solution grid stays fixed during a climb, one puzzle is grown at a time, and the score is the guess count of
one fixed rule, so with the plain rule a count that depends on the digit labels and the cell order is what is selected
for; the counts of both rules are stored with every puzzle.

Sets are cached as `.npz` next to the generator's (`$HACKABLE_DIFFUSION_CACHE/sudoku`), keyed by a hash of the
arguments and `HARD_VERSION`; a pool of processes makes large sets.

Every search of the method (full grid, uniqueness, second solution, guess counts) runs in the compiled solver
`fast_solver` by default (``solver="fast"``); ``solver="reference"`` runs the same steps in the pure-Python
`exact_solver` and `generator`. Both take the same draws from the generator and return the same puzzle.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import pathlib
from collections.abc import Callable

import numpy as np
from jaxtyping import Bool, Int

from hackable_diffusion.tasks.sudoku import fast_solver
from hackable_diffusion.tasks.sudoku.exact_solver import (
    _BIT,
    GUESS_RULES,
    GuessRule,
    _count_cells,
    _decode,
    _initial_state,
    _Search,
)
from hackable_diffusion.tasks.sudoku.generator import (
    GenerationError,
    _carve,
    _default_cache_dir,
    _random_full_placed,
    save_npz_atomically,
)
from hackable_diffusion.tasks.sudoku.grids import MIN_UNIQUE_GIVENS, NUM_CELLS

HARD_VERSION = 1  # bump when the method changes, so that old caches are not reused
SALT = 0x5D0C  # third word of every puzzle's seed: streams apart from `generator.generate_dataset`'s
REPORT_CAP = 100_000  # the stored guess counts stop here (a plain count of 10^5 takes ~1 s, ~30 ms compiled)
SOLVERS: tuple[str, ...] = ("fast", "reference")  # `fast_solver` (compiled) or `exact_solver` (pure Python)


@dataclasses.dataclass(frozen=True)
class HardSpec:
    """What a hard set asks for.

    Attributes:
      givens: (low, high) inclusive range of the number of givens.
      min_guesses: every puzzle needs at least this many guesses under `rule` (to the first solution).
      rule: ``"plain"`` or ``"fewest"`` (`exact_solver.count_guesses`).
      climb_steps: hill-climb moves on a grid before a new one is drawn (0: rejection sampling alone).
      max_grids: grids tried for one puzzle before `GenerationError`.
    """

    givens: tuple[int, int] = (17, 23)
    min_guesses: int = 100
    rule: GuessRule = "plain"
    climb_steps: int = 0
    max_grids: int = 2000

    def __post_init__(self):
        lo, hi = (int(v) for v in self.givens)
        object.__setattr__(self, "givens", (lo, hi))
        if not MIN_UNIQUE_GIVENS <= lo <= hi <= NUM_CELLS:
            raise ValueError(f"givens must satisfy {MIN_UNIQUE_GIVENS} <= low <= high <= 81, got {self.givens}.")
        if self.rule not in GUESS_RULES:
            raise ValueError(f"rule must be one of {GUESS_RULES}, got {self.rule!r}.")
        if self.min_guesses < 0 or self.climb_steps < 0 or self.max_grids < 1:
            raise ValueError(
                f"need min_guesses >= 0, climb_steps >= 0 and max_grids >= 1, got {self.min_guesses}, "
                f"{self.climb_steps}, {self.max_grids}."
            )


@dataclasses.dataclass(frozen=True)
class HardPuzzle:
    """One puzzle of a hard set and how it was found."""

    puzzle: Int[np.ndarray, "81"]
    solution: Int[np.ndarray, "81"]
    grids: int  # grids drawn for it (1 = the first)
    moves: int  # hill-climb moves tried, over all its grids


def _other_solution(cells: list[int], solution: list[int], cell: int) -> list[int] | None:
    """A solution of ``cells`` (``cell`` blank) with another digit than ``solution[cell]`` at ``cell``, or None."""
    boards, placed, unsolved = _initial_state(cells)
    boards[solution[cell] - 1] &= ~_BIT[cell]
    search = _Search(1)
    search.run(boards, placed, unsolved)
    return _decode(search.solutions[0]).tolist() if search.solutions else None


def _is_unique(cells: list[int]) -> bool:
    search = _Search(2)
    search.run(*_initial_state(cells))
    return len(search.solutions) == 1


def _minimize(cells: list[int], solution: list[int], order: list[int], target: int) -> list[int]:
    """Blanks givens of ``cells`` in ``order`` while the puzzle stays unique and has more than ``target`` givens."""
    givens = NUM_CELLS - cells.count(0)
    for c in order:
        if givens <= target:
            break
        if not cells[c]:
            continue
        cells[c] = 0
        if _other_solution(cells, solution, c) is None:
            givens -= 1
        else:
            cells[c] = solution[c]
    return cells


def _move(cells: list[int], solution: list[int], rng: np.random.Generator, target: int) -> list[int] | None:
    """One hill-climb move (module docstring, step 3): a unique puzzle, or None when the swap left it ambiguous."""
    given = [c for c in range(NUM_CELLS) if cells[c]]
    a = given[int(rng.integers(len(given)))]
    trial = list(cells)
    trial[a] = 0
    other = _other_solution(trial, solution, a)
    if other is not None:
        differ = [c for c in range(NUM_CELLS) if c != a and other[c] != solution[c]]
        b = differ[int(rng.integers(len(differ)))]
        trial[b] = solution[b]
        if not _is_unique(trial):
            return None
    return _minimize(trial, solution, rng.permutation(NUM_CELLS).tolist(), target)


def _move_fast(cells: np.ndarray, solution: np.ndarray, rng: np.random.Generator, target: int) -> np.ndarray | None:
    """`_move` on int8 grids with `fast_solver`'s kernels: the same draws from ``rng`` and the same result."""
    given = np.flatnonzero(cells)
    a = int(given[int(rng.integers(len(given)))])
    trial = cells.copy()
    trial[a] = 0
    differ = fast_solver._swap_cells(trial, solution, a)
    if len(differ):
        b = int(differ[int(rng.integers(len(differ)))])
        trial[b] = solution[b]
        if not fast_solver._unique(trial):
            return None
    fast_solver._minimize_in_place(trial, solution, rng.permutation(NUM_CELLS), target)
    return trial


def _carve_fast(solution: np.ndarray, order: np.ndarray, target: int) -> np.ndarray:
    """`generator._carve` (unique) of the int8 grid ``solution`` with `fast_solver`: the same puzzle."""
    cells = solution.copy()
    fast_solver._minimize_in_place(cells, solution, order, target)
    return cells


@dataclasses.dataclass(frozen=True)
class _Steps:
    """The searches of `generate_hard_puzzle`: ``full_grid(rng)``, ``carve(solution, order, target)``,
    ``givens(cells)``, ``guesses(cells, rule, cap)`` and ``move(cells, solution, rng, target)``."""

    full_grid: Callable
    carve: Callable
    givens: Callable
    guesses: Callable
    move: Callable


_STEPS = {
    "reference": _Steps(
        full_grid=lambda rng: _decode(_random_full_placed(rng)).tolist(),
        carve=lambda solution, order, target: _carve(solution, order.tolist(), target, True),
        givens=lambda cells: NUM_CELLS - cells.count(0),
        guesses=lambda cells, rule, cap: _count_cells(cells, rule, 1, cap).guesses,
        move=_move,
    ),
    "fast": _Steps(
        full_grid=fast_solver.random_full_grid,
        carve=_carve_fast,
        givens=np.count_nonzero,
        guesses=lambda cells, rule, cap: int(fast_solver._guesses_of(cells, rule, cap)),
        move=_move_fast,
    ),
}  # fmt: skip


def generate_hard_puzzle(rng: np.random.Generator, spec: HardSpec, solver: str = "fast") -> HardPuzzle:
    """One puzzle of ``spec`` from ``rng`` (module docstring); `GenerationError` after ``spec.max_grids`` grids.
    ``solver``: ``"fast"`` (compiled, `fast_solver`) or ``"reference"`` (pure Python); the puzzle is the same."""
    if solver not in SOLVERS:
        raise ValueError(f"error: solver must be one of {SOLVERS}, got {solver!r}.")
    steps = _STEPS[solver]
    lo, hi = spec.givens
    need = int(spec.min_guesses)

    def score(cells) -> tuple[int, int]:  # (givens above the range, guesses capped at `need`)
        excess = max(0, int(steps.givens(cells)) - hi)
        guesses = steps.guesses(cells, spec.rule, need) if need else 0
        return excess, guesses

    moves = 0
    for grid in range(1, spec.max_grids + 1):
        solution = steps.full_grid(rng)
        target = int(rng.integers(lo, hi + 1))
        cells = steps.carve(solution, rng.permutation(NUM_CELLS), target)
        excess, guesses = score(cells)
        for _ in range(spec.climb_steps):
            if not excess and guesses >= need:
                break
            moves += 1
            trial = steps.move(cells, solution, rng, target)
            if trial is None:
                continue
            t_excess, t_guesses = score(trial)
            if t_excess < excess or (t_excess == excess and t_guesses >= guesses):
                cells, excess, guesses = trial, t_excess, t_guesses
        if not excess and guesses >= need:
            return HardPuzzle(np.asarray(cells, np.int8), np.asarray(solution, np.int8), grid, moves)
    raise GenerationError(
        f"no puzzle with {lo}-{hi} givens and >= {need} {spec.rule} guesses in {spec.max_grids} grids; raise "
        "max_grids or climb_steps, or ask for fewer guesses or more givens."
    )


def _generate_range(args) -> dict[str, np.ndarray]:
    """Puzzles ``start..stop-1`` of a set; puzzle ``i`` depends only on ``(seed, i)``."""
    start, stop, seed, spec = args
    found = [generate_hard_puzzle(np.random.default_rng([seed, i, SALT]), spec) for i in range(start, stop)]
    puzzles = np.stack([f.puzzle for f in found])
    counts = fast_solver.count_guesses(puzzles, spec.rule, 1, REPORT_CAP)
    return dict(
        puzzles=puzzles,
        solutions=np.stack([f.solution for f in found]),
        guesses=counts.guesses.astype(np.int64),
        guesses_complete=counts.complete.astype(bool),
        backtracks=counts.backtracks.astype(np.int64),
        plain_guesses=fast_solver.count_guesses(puzzles, "plain", 1, REPORT_CAP).guesses.astype(np.int64),
        fewest_guesses=fast_solver.count_guesses(puzzles, "fewest", 1, REPORT_CAP).guesses.astype(np.int64),
        grids=np.array([f.grids for f in found], np.int32),
        moves=np.array([f.moves for f in found], np.int32),
    )


def _generate_job(args) -> tuple[int, dict[str, np.ndarray]]:
    return args[0], _generate_range(args)


def hard_cache_path(
    n: int, spec: HardSpec, seed: int, cache_dir: str | os.PathLike | None = "default"
) -> pathlib.Path | None:
    """The ``.npz`` file :func:`generate_hard_dataset` caches these arguments in (None when ``cache_dir`` is None)."""
    if cache_dir is None:
        return None
    key = dict(version=HARD_VERSION, n=int(n), seed=int(seed), **dataclasses.asdict(spec))
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    folder = _default_cache_dir() if cache_dir == "default" else pathlib.Path(cache_dir)
    lo, hi = spec.givens
    return folder / f"sudoku_hard_n{n}_g{lo}-{hi}_m{spec.min_guesses}_{spec.rule}_s{seed}_{digest}.npz"


def generate_hard_dataset(
    n: int,
    spec: HardSpec = HardSpec(),
    seed: int = 0,
    num_workers: int | None = None,
    cache_dir: str | os.PathLike | None = "default",
    chunk: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, np.ndarray]:
    """``n`` puzzles of ``spec`` (module docstring), cached.

    Returns a dict of numpy arrays: puzzles (n, 81) int8 (0 = blank), solutions (n, 81) int8, givens (n,) int16;
    guesses, backtracks (n,) int64 under ``spec.rule`` to the first solution, stopped at `REPORT_CAP` (then
    guesses_complete is False); plain_guesses, fewest_guesses (n,): the counts of each rule (same cap); grids, moves
    (n,) int32: the
    grids drawn and the hill-climb moves tried per puzzle. ``chunk``: puzzles per task of the worker pool (0: about
    20 tasks per worker, 10 to 500 puzzles each); ``progress(done, n)`` is called after each task.
    """
    n = int(n)
    if n < 1:
        raise ValueError(f"n must be a positive number of puzzles, got {n}.")
    path = hard_cache_path(n, spec, seed, cache_dir)
    if path is not None and path.exists():
        with np.load(path) as cached:
            return {k: cached[k] for k in cached.files}
    workers = max(1, int(num_workers if num_workers is not None else (os.cpu_count() or 1)))
    size = int(chunk) or min(500, max(10, -(-n // (20 * workers))))
    jobs = [(s, min(s + size, n), int(seed), spec) for s in range(0, n, size)]
    parts: dict[int, dict[str, np.ndarray]] = {}
    done = 0

    def collect(part_start: int, part: dict[str, np.ndarray]) -> None:
        nonlocal done
        parts[part_start] = part
        done += len(part["puzzles"])
        if progress is not None:
            progress(done, n)

    if workers == 1 or len(jobs) == 1:
        for job in jobs:
            collect(job[0], _generate_range(job))
    else:  # spawn: safe even when the parent process has started threads (JAX, grain)
        with multiprocessing.get_context("spawn").Pool(min(workers, len(jobs))) as pool:
            for start, part in pool.imap_unordered(_generate_job, jobs):
                collect(start, part)
    data = {k: np.concatenate([parts[s][k] for s in sorted(parts)]) for k in parts[0]}
    data["givens"] = np.count_nonzero(data["puzzles"], axis=1).astype(np.int16)
    if path is not None:
        save_npz_atomically(path, data)
    return data


def in_spec(data: dict[str, np.ndarray], spec: HardSpec) -> Bool[np.ndarray, "n"]:
    """True for each puzzle of ``data`` that lies in ``spec``'s givens range and reaches its minimum guess count."""
    lo, hi = spec.givens
    givens = np.count_nonzero(data["puzzles"], axis=1)
    return (givens >= lo) & (givens <= hi) & (data["guesses"] >= spec.min_guesses)
