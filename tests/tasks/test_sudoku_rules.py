"""The Sudoku rules as a logit constraint (`tasks/sudoku/rules.py`, a `sampling.constraints.LogitConstraint`): the
digits of decided peers are excluded exactly, a dead end stays unconstrained, and the solver with the rules fills
forced cells whatever the weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion import cli, experiment
from hackable_diffusion.data.tokenizers import MASK_ID
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.sampling.constraints import LogitConstraint
from hackable_diffusion.tasks.sudoku import generator
from hackable_diffusion.tasks.sudoku.inference import SolverSettings, puzzle_sampler, solve_puzzles
from hackable_diffusion.tasks.sudoku.recipes import sudoku_config
from hackable_diffusion.tasks.sudoku.rules import SudokuRules, same_unit_matrix
from hackable_diffusion.tasks.sudoku.structure import grid_prior

# Blanks in nine distinct rows, columns and boxes: each has eight givens in its row, so its digit is forced.
FORCED_BLANKS = [(0, 0), (1, 3), (2, 6), (3, 1), (4, 4), (5, 7), (6, 2), (7, 5), (8, 8)]


def _solution():
    return generator.generate_dataset(1, (30, 36), seed=3, cache_dir=None)["solutions"][0]


def test_same_unit_matrix_counts_twenty_peers():
    same = same_unit_matrix(9)
    assert same.shape == (81, 81) and (same.sum(axis=1) == 20).all() and (same == same.T).all()
    assert same[0, 8] and same[0, 72] and same[0, 20] and not same[0, 0] and not same[0, 31]
    with pytest.raises(ValueError, match="square"):
        same_unit_matrix(5)


def test_sudoku_rules_exclude_exactly_the_digits_of_decided_peers():
    rng = np.random.default_rng(0)
    grid = _solution()
    tokens = grid + 3  # digits 1..9 -> ids 4..12 (vocab.FIRST_DIGIT_ID = 4)
    decided = rng.random(81) < 0.4
    canvas = np.where(decided, tokens, MASK_ID)
    canvas[5] = 4 + (grid[5] % 9)  # a decided wrong digit still excludes itself from its peers
    excluded = np.asarray(SudokuRules()(jnp.asarray(canvas[None]), jnp.asarray(decided[None]), 13))[0]
    same = same_unit_matrix(9)
    for cell in range(81):
        held = {int(canvas[j]) for j in range(81) if same[cell, j] and decided[j]}
        expected = np.zeros(13, bool)
        if len(held) < 9:
            expected[sorted(held)] = True
        np.testing.assert_array_equal(excluded[cell], expected, err_msg=f"cell {cell}")
    # A dead end built by hand: every digit is held by a peer of cell 0.
    dead = np.full(81, MASK_ID)
    dead[1:9] = np.arange(4, 12)  # row 0 holds digits 1..8
    dead[9 * 4] = 12  # column 0 holds digit 9
    known = dead != MASK_ID
    out = np.asarray(SudokuRules()(jnp.asarray(dead[None]), jnp.asarray(known[None]), 13))[0]
    assert not out[0].any()  # every digit excluded at cell 0: left unconstrained
    np.testing.assert_array_equal(np.flatnonzero(out[10]), [4, 5])  # cell 10 shares box 0 with the 1 and the 2 only
    with pytest.raises(ValueError, match="81 cells"):
        SudokuRules()(jnp.zeros((1, 64), jnp.int32), jnp.zeros((1, 64), bool), 13)
    assert isinstance(SudokuRules(), LogitConstraint)
    with pytest.raises(ValueError, match="exceed the vocabulary"):
        SudokuRules()(jnp.zeros((1, 81), jnp.int32), jnp.zeros((1, 81), bool), 10)


@pytest.mark.slow
def test_constrained_sampler_fills_forced_cells_whatever_the_weights(tmp_path):
    model = dict(presets.tiny(vocab_size=13, moe=False), **grid_prior(9))
    c = sudoku_config(model=model, steps=4, batch_size=8, num_train=64)
    c.data.num_eval, c.data.cache_dir = 8, str(tmp_path / "cache")
    c.sampler.num_steps = 2  # nine blanks in two passes: several decided together
    exp = experiment.build(c, "unused")
    params = T.init_params(exp.model, jax.random.key(0))  # untrained
    solution = _solution()
    puzzle = solution.copy()
    for r, col in FORCED_BLANKS:
        puzzle[9 * r + col] = 0
    plain = solve_puzzles(exp, params, puzzle[None], seed=0, batch_size=1)
    with_rules = cli.override(exp.config, {"solver.rules": True})
    assert puzzle_sampler(with_rules, exp.process, SolverSettings(rules=True)).constraint == SudokuRules()
    ruled = solve_puzzles(exp, params, puzzle[None], seed=0, batch_size=1, config=with_rules)
    assert not (plain.predictions[0] == solution).all()  # the untrained model alone does not solve it
    np.testing.assert_array_equal(ruled.predictions[0], solution)
    assert ruled.steps[0] <= 2
    ar = experiment.build(sudoku_config(model=model, steps=4, batch_size=8, num_train=64, layout="ar"), "unused")
    with pytest.raises(ValueError, match="solver.rules acts on a diffusion step"):
        solve_puzzles(
            ar,
            T.init_params(ar.model, jax.random.key(0)),
            puzzle[None],
            config=cli.override(ar.config, {"solver.rules": True}),
        )
