"""The Sudoku task (`config.data.task="sudoku"`): `tasks.Task` for puzzles, and the held-out scores.

Masking diffusion over the 81 cells in place (Ye et al. 2024; Kim et al. 2025), DiffusionGemma's prompt + canvas
layout, or the autoregressive baseline (`layouts.py`), on generated puzzles (`data.py`). Scores: DiffusionGemma's
Sudoku metrics (`metrics.py`) split by givens, by a CSV's `level` column and by whether the exact solver needed a
guess; exact-grid accuracy per guess band of the plain depth-first rule and per number of givens (`difficulty.py`);
forward passes and network evaluations per puzzle, puzzles per second; and the held-out loss bound in bits per blank
cell. There is no tokenizer: `vocab.SudokuVocab` is a fixed vocabulary of 13 ids.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jaxtyping import Int

from hackable_diffusion.tasks.sudoku import data as data_lib
from hackable_diffusion.tasks.sudoku import difficulty, layouts, rewards
from hackable_diffusion.tasks.sudoku.exact_solver import solver_class
from hackable_diffusion.tasks.sudoku.grids import respects_givens
from hackable_diffusion.tasks.sudoku.inference import SolverSettings, solve_puzzles
from hackable_diffusion.tasks.sudoku.metrics import sudoku_metrics
from hackable_diffusion.tasks.sudoku.recipes import upgrade_saved_config

if TYPE_CHECKING:
    from hackable_diffusion.experiment import Experiment


@dataclasses.dataclass(frozen=True)
class SudokuTask:
    name: str = "sudoku"
    records_commit_order: bool = True  # rollout(record_order=True): RL's trajectory scorer

    def check_config(self, config: ml_collections.ConfigDict) -> None:
        data_lib.check_data_config(config)
        layouts.check_layout(config)
        SolverSettings.from_config(config).check(layouts.layout_of(config), config.sampler.num_steps)

    def upgrade_saved_config(self, config: ml_collections.ConfigDict) -> None:
        upgrade_saved_config(config)

    def build_data(self, config: ml_collections.ConfigDict, workdir: str) -> data_lib.SudokuData:
        layouts.check_layout(config)
        return data_lib.build_data(config)

    def adapt_objective(self, config, model, objective):
        return layouts.adapt_objective(config, model, objective)

    def train_iterator(self, exp: Experiment, process_index: int, process_count: int):
        return data_lib.make_train_iterator(
            exp.data.train_tokens,
            exp.data.train_fixed,
            exp.config.data.batch_size,
            exp.config.seed,
            process_index=process_index,
            process_count=process_count,
            augment_symmetry=bool(exp.config.data.get("augment_symmetry", False)),
        )

    def eval_fn(self, exp: Experiment, workdir: str):
        config = exp.config

        def evaluate(params, ema_params):
            use = ema_params if ema_params is not None else params
            out = evaluate_elbo(exp, use, num_batches=config.eval.num_batches)
            if config.eval.num_puzzles and jax.process_count() == 1:
                out.update(held_out_scores(exp, use, config.eval.num_puzzles))
            return {k: v for k, v in out.items() if isinstance(v, (int, float))}

        return evaluate

    def default_config(self) -> ml_collections.ConfigDict:
        from hackable_diffusion.tasks.sudoku.recipes import sudoku_config

        return sudoku_config()

    def define_evaluation_flags(self, flag_values) -> None:
        from hackable_diffusion.tasks.sudoku import evaluation

        evaluation.define_flags(flag_values)

    def evaluation_from_flags(self, flag_values):
        from hackable_diffusion.tasks.sudoku import evaluation

        return evaluation.from_flags(flag_values)

    # -- RL from verifiable rewards (`python -m hackable_diffusion.rl`; `rewards.py`) -------------------------------
    def canvas_sampler(self, exp: Experiment, config: ml_collections.ConfigDict):
        """The in-place sampler over the 81 cells with the solver's rules and views (what distillation's teacher
        runs); `config` holds the sampler and solver settings."""
        from hackable_diffusion.tasks.sudoku.inference import puzzle_sampler

        return puzzle_sampler(config, exp.process, SolverSettings.from_config(config))

    def rl_prompts(self, exp: Experiment) -> Int[np.ndarray, "n 81"]:
        """The training puzzles (0 = blank): the run's generated training set."""
        digits = exp.tokenizer.decode(exp.data.train_tokens)
        return np.where(exp.data.train_fixed, digits, 0).astype(np.int8)

    def rollout(self, exp: Experiment, params, prompts, *, seed: int, config, record_order: bool = False):
        """One grid per puzzle from the run's solver (`config.sampler`, `config.solver`), all rows in one batch;
        with `record_order`, (grids, the pass that wrote each cell: -1 for givens) from the in-place sampler."""
        solution = solve_puzzles(
            exp,
            params,
            prompts,
            seed=seed,
            batch_size=len(prompts),
            config=config,
            warm_up=False,
            record_order=record_order,
        )
        return (solution.predictions, solution.commit_pass) if record_order else solution.predictions

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


def held_out_scores(exp: Experiment, params, num_puzzles: int) -> dict[str, float]:
    """Accuracy, blank accuracy and passes on the first `num_puzzles` of the run's held-out generated set."""
    out = evaluate_puzzles(
        exp,
        params,
        exp.data.eval_puzzles[:num_puzzles],
        exp.data.eval_solutions[:num_puzzles],
        seed=exp.config.seed,
        batch_size=exp.config.eval.batch_size,
    )
    return {f"sudoku_{k}": out[k] for k in ("accuracy", "blank_accuracy", "forward_passes_per_puzzle")}


def evaluate_puzzles(
    exp: Experiment,
    params,
    puzzles: Int[np.ndarray, "n 81"],
    solutions: Int[np.ndarray, "n 81"],
    *,
    levels: np.ndarray | None = None,
    seed: int = 0,
    batch_size: int = 256,
    config: ml_collections.ConfigDict | None = None,
) -> dict[str, Any]:
    """DiffusionGemma's Sudoku metrics (split by givens, by `levels` when given, and by whether the exact solver
    needed a guess: `_solver_singles` / `_solver_search`), exact-grid accuracy per guess band of the plain rule
    (`_guesses_0` .. `_guesses_1000+`, `difficulty.guess_counts`, cached in the run's data cache) and per number of
    givens (`_givens_23`, ...), plus forward passes per puzzle and puzzles per second; `config` (default: the run's)
    holds the sampler and solver settings."""
    config = config or exp.config
    solution = solve_puzzles(exp, params, puzzles, seed=seed, batch_size=batch_size, config=config)
    out: dict[str, Any] = dict(
        sudoku_metrics(solution.predictions, puzzles, solutions, categories=levels, category_name="level")
    )
    by_solver = sudoku_metrics(
        solution.predictions, puzzles, solutions, categories=solver_class(puzzles), category_name="solver"
    )
    out.update({k: v for k, v in by_solver.items() if "_solver_" in k})  # "singles" / "search": see solver_class
    guesses = difficulty.guess_counts(puzzles, "plain", cache_dir=config.data.get("cache_dir") or "default")
    out.update(difficulty.accuracy_by_difficulty(solution.predictions, puzzles, solutions, guesses))
    out["guess_bands_rule"] = "plain, to the first solution (exact_solver.count_guesses)"
    out["forward_passes_per_puzzle"] = float(solution.steps.mean())
    out["max_forward_passes_per_puzzle"] = int(solution.steps.max())
    out["batch_forward_passes"] = solution.batch_forward_passes
    # network evaluations: a pass with K symmetry views runs the model on K copies of the grid
    views = SolverSettings.from_config(config).views
    out["network_evaluations_per_puzzle"] = float(solution.network_passes.mean()) * views
    out["puzzles_per_second"] = float(len(puzzles) / max(solution.seconds, 1e-9))
    out["solve_seconds"] = solution.seconds
    out["givens_kept"] = bool(respects_givens(solution.predictions, puzzles).all())
    out.update(solution.search or {})
    return out


def evaluate_elbo(
    exp: Experiment, params, *, num_batches: int | None = None, seed: int = 0, batch_size: int | None = None
) -> dict[str, float]:
    """The held-out loss bound in bits per blank cell: the masking ELBO over the blanks (in place); the canvas ELBO
    (canvas) or the exact NLL (AR) of all 81 solution cells, divided by the number of blanks."""
    batch_size = batch_size or exp.config.eval.batch_size
    layout = layouts.layout_of(exp.config)
    key = exp.objective.loss.likelihood_metric
    tokens = exp.tokenizer.encode(exp.data.eval_solutions)
    fixed = exp.data.eval_puzzles != 0
    fn = jax.jit(exp.objective)
    bits, count = 0.0, 0
    starts = list(range(0, len(tokens) - batch_size + 1, batch_size)) or [0]
    for i, start in enumerate(starts[:num_batches] if num_batches else starts):
        rows = slice(start, start + batch_size)
        batch = {"tokens": jnp.asarray(tokens[rows]), "fixed": jnp.asarray(fixed[rows])}
        _, metrics = fn(params, batch, jax.random.key(seed * 100003 + i))
        blanks = int((~fixed[start : start + batch_size]).sum())
        counted = blanks if layout == "in_place" else fixed[start : start + batch_size].size
        bits += float(metrics[key]) * counted
        count += blanks
    return {"elbo_bits_per_blank": bits / max(count, 1), "eval_blanks": count}
