"""lm-eval generation requests answered by a Sudoku run (the task's `ScoresLmEvalPuzzles` capability): the context is a
puzzle (81 cells as text, `.` = blank), the answer the 81 digits that `inference.solve_puzzles` fills in with the run's
sampler and `config.solver` settings (rules, repairs, restarts, parallel attempts), exactly as `evaluate` solves them.
The puzzle documents and the answer check of the `hd_sudoku_solve` task are `evals.local_tasks`'; the grids' text is
`grids.grid_to_text` / `text_to_grid`.

lm-eval has no place for a per-request cost, so the forward passes of every answered puzzle are kept here and reported
through the adapter's model info (mean and max per puzzle, network evaluations per puzzle).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from hackable_diffusion.tasks.sudoku.grids import grid_to_text, text_to_grid
from hackable_diffusion.tasks.sudoku.inference import SolverSettings, solve_puzzles

if TYPE_CHECKING:
    from hackable_diffusion.experiment import Experiment


@dataclasses.dataclass
class PuzzleAnswerer:
    """Answers puzzle texts with the run's solver; `passes` / `network_passes` grow with every answered puzzle."""

    exp: Experiment
    params: object
    seed: int = 0
    batch_size: int = 64
    passes: list[int] = dataclasses.field(default_factory=list)
    network_passes: list[int] = dataclasses.field(default_factory=list)

    def __call__(self, contexts: Sequence[str], progress: Callable[[int], None] | None = None) -> list[str]:
        if not contexts:
            return []
        try:
            puzzles = np.stack([text_to_grid(c) for c in contexts])
        except ValueError as err:
            raise ValueError(
                f"this is a Sudoku run: every generation request must be a puzzle ({err}). Use the task "
                "hd_sudoku_solve, or a text run for text tasks."
            ) from None
        solution = solve_puzzles(self.exp, self.params, puzzles, seed=self.seed, batch_size=self.batch_size)
        self.passes += [int(s) for s in solution.steps]
        self.network_passes += [int(s) for s in solution.network_passes]
        if progress is not None:
            progress(len(contexts))
        return [grid_to_text(g) for g in solution.predictions]

    def info(self) -> dict:
        c = self.exp.config
        out = {
            "solver": dataclasses.asdict(SolverSettings.from_config(c)),
            "sampler": {"num_steps": c.sampler.num_steps, "selection": dict(c.sampler.selection)},
            "puzzles_answered": len(self.passes),
        }
        if self.passes:
            views = SolverSettings.from_config(c).views
            out["forward_passes_per_puzzle"] = float(np.mean(self.passes))
            out["max_forward_passes_per_puzzle"] = int(np.max(self.passes))
            out["network_evaluations_per_puzzle"] = float(np.mean(self.network_passes)) * views
        return out
