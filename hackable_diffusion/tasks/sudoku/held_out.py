"""A Sudoku run's scores on puzzles it did not train on: solved with the run's sampler and solver settings and
scored with DiffusionGemma's Sudoku metrics (`evaluate_puzzles`, what `evaluate` reports and `held_out_scores`
summarises during training), and the held-out loss bound in bits per blank cell (`evaluate_elbo`). Shared by the task
(`task.py`: its training-time evaluation and report) and the evaluate command (`evaluation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jaxtyping import Int

from hackable_diffusion.tasks.sudoku import difficulty, layouts
from hackable_diffusion.tasks.sudoku.exact_solver import solver_class
from hackable_diffusion.tasks.sudoku.grids import respects_givens
from hackable_diffusion.tasks.sudoku.inference import SolverSettings, solve_puzzles
from hackable_diffusion.tasks.sudoku.metrics import sudoku_metrics

if TYPE_CHECKING:
    from hackable_diffusion.experiment import Experiment


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
