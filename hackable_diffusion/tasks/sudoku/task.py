"""The Sudoku task (`config.data.task="sudoku"`): `tasks.Task` for puzzles, with the capabilities `HasCanvasSampler`,
`RewardTask`, `RecordsCommitOrder`, `RestrictsRolloutTokens` and `ScoresLmEvalPuzzles` (`tasks/capabilities.py`).

Masking diffusion over the 81 cells in place (Ye et al. 2024; Kim et al. 2025), DiffusionGemma's prompt + canvas
layout, or the autoregressive baseline (`layouts.py`), on generated puzzles (`data.py`). Scores: DiffusionGemma's
Sudoku metrics (`metrics.py`) split by givens, by a CSV's `level` column and by whether the exact solver needed a
guess; exact-grid accuracy per guess band of the plain depth-first rule and per number of givens (`difficulty.py`);
forward passes and network evaluations per puzzle, puzzles per second; and the held-out loss bound in bits per blank
cell (`held_out.py`, which `evaluation.py` shares). There is no tokenizer: `vocab.SudokuVocab` is a fixed vocabulary
of 13 ids.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

import ml_collections
import numpy as np
from jaxtyping import Int

from hackable_diffusion.tasks.puzzle_task import PuzzleTask
from hackable_diffusion.tasks.sudoku import data as data_lib
from hackable_diffusion.tasks.sudoku import evaluation, layouts, rewards
from hackable_diffusion.tasks.sudoku.held_out import evaluate_elbo, held_out_scores
from hackable_diffusion.tasks.sudoku.inference import SolverSettings, SudokuSolution, puzzle_sampler, solve_puzzles
from hackable_diffusion.tasks.sudoku.lm_eval_requests import PuzzleAnswerer
from hackable_diffusion.tasks.sudoku.recipes import sudoku_config, upgrade_saved_config
from hackable_diffusion.tasks.sudoku.vocab import NON_DIGIT_IDS

if TYPE_CHECKING:
    from hackable_diffusion.experiment import Experiment


@dataclasses.dataclass(frozen=True)
class SudokuTask(PuzzleTask):
    name: ClassVar[str] = "sudoku"
    layouts: ClassVar = layouts
    data: ClassVar = data_lib
    evaluation: ClassVar = evaluation
    eval_count_key: ClassVar[str] = "num_puzzles"

    def check_sampler(self, config: ml_collections.ConfigDict) -> None:
        SolverSettings.from_config(config).check(layouts.layout_of(config), config.sampler.num_steps)

    def upgrade_saved_config(self, config: ml_collections.ConfigDict) -> None:
        upgrade_saved_config(config)

    def train_iterator_options(self, config: ml_collections.ConfigDict) -> dict:
        return {"augment_symmetry": bool(config.data.get("augment_symmetry", False))}

    def held_out_loss(self, exp: Experiment, params, num_batches: int) -> dict:
        return evaluate_elbo(exp, params, num_batches=num_batches)

    def held_out_scores(self, exp: Experiment, params, num: int) -> dict:
        return held_out_scores(exp, params, num)

    def default_config(self) -> ml_collections.ConfigDict:
        return sudoku_config()

    # -- capabilities (tasks/capabilities.py) -----------------------------------------------------------------------
    def canvas_sampler(self, exp: Experiment, config: ml_collections.ConfigDict):
        """`HasCanvasSampler`: the in-place sampler over the 81 cells with the solver's rules and views (what
        distillation's teacher runs); `config` holds the sampler and solver settings."""
        return puzzle_sampler(config, exp.process, SolverSettings.from_config(config))

    def lm_eval_puzzle_answerer(self, exp: Experiment, params, *, seed: int, batch_size: int) -> PuzzleAnswerer:
        """`ScoresLmEvalPuzzles`: lm-eval's `hd_sudoku_solve` requests answered with the run's solver."""
        return PuzzleAnswerer(exp, params, seed=seed, batch_size=batch_size)

    # RL (`python -m hackable_diffusion.rl`; `rewards.py`): `RewardTask`, `RecordsCommitOrder`, `RestrictsRolloutTokens`
    def rl_prompts(self, exp: Experiment) -> Int[np.ndarray, "n 81"]:
        """The training puzzles (0 = blank): the run's generated training set."""
        digits = exp.tokenizer.decode(exp.data.train_tokens)
        return np.where(exp.data.train_fixed, digits, 0).astype(np.int8)

    def rollout(self, exp: Experiment, params, prompts, *, seed: int, config) -> Int[np.ndarray, "n 81"]:
        """One grid per puzzle from the run's solver (`config.sampler`, `config.solver`), all rows in one batch."""
        return rollout_solution(exp, params, prompts, seed=seed, config=config, record_order=False).predictions

    def rollout_with_commit_order(
        self, exp: Experiment, params, prompts, *, seed: int, config
    ) -> tuple[Int[np.ndarray, "n 81"], Int[np.ndarray, "n 81"]]:
        """`rollout`'s grids and the pass that wrote each cell (-1 for givens), from the in-place sampler."""
        solution = rollout_solution(exp, params, prompts, seed=seed, config=config, record_order=True)
        return solution.predictions, solution.commit_pass

    def rollout_forbidden_tokens(self, exp: Experiment) -> tuple[int, ...]:
        """`RestrictsRolloutTokens`: every layout's sampler draws digits only."""
        return NON_DIGIT_IDS

    def reward(self, prompts, completions, *, shaped: bool = False) -> np.ndarray:
        return rewards.sudoku_reward(prompts, completions, shaped=shaped)

    def policy_rows(self, exp: Experiment, prompts, completions, commit_pass=None) -> dict[str, np.ndarray]:
        return rewards.policy_rows(prompts, completions, layout=layouts.layout_of(exp.config), commit_pass=commit_pass)

    def report(self, exp: Experiment, params) -> str:
        num = exp.config.eval.num_puzzles or 16
        scores = held_out_scores(exp, params, num)
        return (
            f"Solved held-out puzzles ({exp.config.sampler.selection.rule}, "
            f"{scores['sudoku_forward_passes_per_puzzle']:.1f} forward passes each): accuracy "
            f"{scores['sudoku_accuracy']:.3f}, blank accuracy {scores['sudoku_blank_accuracy']:.3f} over "
            f"{min(num, len(exp.data.eval_puzzles))} puzzles"
        )


def rollout_solution(exp: Experiment, params, prompts, *, seed: int, config, record_order: bool) -> SudokuSolution:
    """The run's solver on RL's prompts: all rows in one batch, without the untimed warm-up batch (rollouts are not
    timed)."""
    return solve_puzzles(
        exp,
        params,
        prompts,
        seed=seed,
        batch_size=len(prompts),
        config=config,
        warm_up=False,
        record_order=record_order,
    )
