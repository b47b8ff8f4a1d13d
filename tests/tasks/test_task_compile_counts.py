"""`evaluate` on Sudoku (the sampler and the model-steered search) and Countdown compiles once per batch shape: after
one evaluation, evaluations of other puzzles and problems, other counts of them (a partial last batch) and other seeds
build no program (`training.compilations.count_compilations`)."""

import jax
import pytest
from _tiny_countdown import tiny_countdown_config
from _tiny_sudoku import tiny_sudoku_config

from hackable_diffusion import experiment
from hackable_diffusion.models import transformer as T
from hackable_diffusion.tasks.countdown.evaluation import SolveProblems
from hackable_diffusion.tasks.sudoku.held_out import evaluate_puzzles
from hackable_diffusion.training.compilations import count_compilations


def assert_no_compilation(calls):
    for second_pass in (False, True):
        with count_compilations() as log:
            for call in calls:
                call()
        assert log.count == 0, f"{'a second pass' if second_pass else 'the evaluations'} recompiled: {log.summary()}"


@pytest.mark.slow
@pytest.mark.parametrize("search", [False, True], ids=["sampler", "search"])
def test_sudoku_evaluations_compile_once(tmp_path, search):
    config = tiny_sudoku_config("in_place", tmp_path=tmp_path)
    if search:
        config.solver.search, config.solver.rules, config.solver.pass_budget = True, True, 6
    exp = experiment.build(config, str(tmp_path / "run"))
    params = T.init_params(exp.model, jax.random.key(0))  # random weights: the programs are what is counted
    puzzles, solutions = exp.data.eval_puzzles, exp.data.eval_solutions
    evaluate_puzzles(exp, params, puzzles[:5], solutions[:5], batch_size=4, seed=0)  # one full and one partial batch
    assert_no_compilation(
        [
            lambda: evaluate_puzzles(exp, params, puzzles[2:8], solutions[2:8], batch_size=4, seed=1),
            lambda: evaluate_puzzles(exp, params, puzzles[1:8], solutions[1:8], batch_size=4, seed=2),
            lambda: evaluate_puzzles(exp, params, puzzles[:4], solutions[:4], batch_size=4, seed=3),
        ]
    )


@pytest.mark.slow
def test_countdown_evaluations_compile_once(tmp_path):
    exp = experiment.build(tiny_countdown_config(tmp_path), str(tmp_path / "run"))
    params = T.init_params(exp.model, jax.random.key(0))
    SolveProblems(num_problems=6, seed=3, batch_size=4)(exp, params, seed=0, load_run=None)
    assert_no_compilation(
        [
            lambda: SolveProblems(num_problems=7, seed=4, batch_size=4)(exp, params, seed=1, load_run=None),
            lambda: SolveProblems(num_problems=9, seed=5, batch_size=4)(exp, params, seed=2, load_run=None),
        ]
    )
