"""What `python -m hackable_diffusion.evaluate` measures on a Sudoku run: held-out puzzles solved with the run's
sampler and solver settings, scored with DiffusionGemma's Sudoku metrics.

The puzzles are a CSV file (`--data`, any layout `csv_io` reads; `--subset` draws a seeded subset of its rows) or
generated unique-solution puzzles (`--givens=LO,HI --num_puzzles --puzzle_seed`, a generator seed other than the
training seed; `--solver_class=search` keeps those that make the exact solver guess). Puzzles the run trained on are
dropped. The result carries the metrics overall, by givens and by the file's `level` column, exact-grid accuracy
per guess band (`difficulty.py`: the plain depth-first solver's guesses, 0 / 1-9 / 10-99 / 100-999 / 1000+) and per
number of givens, forward passes and network evaluations per puzzle, and puzzles per second after one compile batch.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable

from absl import flags

from hackable_diffusion.recipes import sampler_report
from hackable_diffusion.tasks.sudoku.data import GeneratedPuzzles, PuzzleFile, load_held_out
from hackable_diffusion.tasks.sudoku.held_out import evaluate_puzzles

if TYPE_CHECKING:
    from hackable_diffusion.experiment import Experiment


@dataclasses.dataclass(frozen=True)
class SolvePuzzles:
    """Solves `puzzles` (a `PuzzleFile` or `GeneratedPuzzles`) with a Sudoku run; `limit`: the first N only."""

    puzzles: PuzzleFile | GeneratedPuzzles
    limit: int = 0
    batch_size: int = 0  # 0 = 256

    def __post_init__(self):
        if self.limit < 0:
            raise ValueError(f"--limit={self.limit} must be >= 0 (0: every puzzle).")
        if self.batch_size < 0:
            raise ValueError(f"--batch_size={self.batch_size} must be >= 0 (0: 256 puzzles a batch).")

    def __call__(self, exp: Experiment, params: Any, *, seed: int, load_run: Callable[[str], tuple]) -> dict:
        del load_run  # a Sudoku evaluation reads no other run
        exp.task.check_config(exp.config)  # the solver settings
        puzzles, dropped = load_held_out(self.puzzles, exp.config, limit=self.limit)
        scores = evaluate_puzzles(
            exp,
            params,
            puzzles["puzzles"],
            puzzles["solutions"],
            levels=puzzles.get("level"),
            seed=seed,
            batch_size=self.batch_size or 256,
        )
        head = {
            "data": self.puzzles.label,
            "dropped_as_in_training": dropped,
            "depth_loops": exp.model.cfg.depth_loops,
            "sampler": sampler_report(exp.config),
            "solver": exp.config.solver.to_dict(),
        }
        return {**head, **scores}


def define_flags(flag_values: flags.FlagValues) -> None:
    """The flags `evaluate` takes for a Sudoku run."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_string("data", None, "sudoku: a CSV file of puzzles (else generated puzzles: --givens etc.).", **fv)
    flags.DEFINE_list("givens", None, "sudoku: generate puzzles with LO,HI givens (inclusive), e.g. 30,36.", **fv)
    flags.DEFINE_integer("num_puzzles", 1000, "sudoku: how many puzzles to generate (with --givens).", **fv)
    flags.DEFINE_integer("puzzle_seed", 7, "sudoku: the generator seed of the puzzles (not the training seed).", **fv)
    flags.DEFINE_enum(
        "solver_class",
        "all",
        ["all", "singles", "search"],
        "sudoku, generated puzzles: keep only those the exact solver finishes by singles alone, or only those that "
        "made it guess.",
        **fv,
    )
    flags.DEFINE_integer("limit", 0, "sudoku: first N puzzles only (0 = all).", **fv)
    flags.DEFINE_integer("subset", 0, "sudoku, --data file: a seeded random subset of N rows (0 = every row).", **fv)
    flags.DEFINE_integer("subset_seed", 1, "sudoku: the seed of --subset.", **fv)


def puzzle_set(
    data: str | None,
    givens: list[str] | None,
    num_puzzles: int = 1000,
    puzzle_seed: int = 7,
    solver_class: str = "all",
    subset: int = 0,
    subset_seed: int = 1,
) -> PuzzleFile | GeneratedPuzzles:
    """`--data FILE` or `--givens=LO,HI --num_puzzles=N --puzzle_seed=S [--solver_class=search]` as a puzzle set;
    ValueError says which flags clash or are missing."""
    if data and givens:
        raise ValueError("pass either --data FILE.csv or --givens=LO,HI (generated puzzles), not both.")
    if data:
        if solver_class != "all":
            raise ValueError("--solver_class filters generated puzzles (--givens); a --data file is used whole.")
        if subset < 0:
            raise ValueError(f"--subset={subset} must be >= 0 (0: every row of the file).")
        return PuzzleFile(data, subset, subset_seed)
    if subset:
        raise ValueError("--subset picks rows of a --data file; for generated puzzles set --num_puzzles.")
    if not givens:
        raise ValueError(
            "a Sudoku run is evaluated on --data FILE.csv or --givens=LO,HI (with --num_puzzles, --puzzle_seed)."
        )
    try:
        lo, hi = (int(v) for v in givens)
    except ValueError:
        raise ValueError(f"--givens={','.join(givens)} must be two integers LO,HI, e.g. --givens=30,36.") from None
    try:
        return GeneratedPuzzles((lo, hi), num_puzzles, puzzle_seed, None if solver_class == "all" else solver_class)
    except ValueError as err:
        raise ValueError(f"--givens / --num_puzzles: {err}") from None


def from_flags(flag_values: flags.FlagValues) -> SolvePuzzles:
    """The evaluation the flags describe (`batch_size` is a flag of `evaluate` itself)."""
    f = flag_values
    puzzles = puzzle_set(f.data, f.givens, f.num_puzzles, f.puzzle_seed, f.solver_class, f.subset, f.subset_seed)
    return SolvePuzzles(puzzles, limit=f.limit, batch_size=f.batch_size)
