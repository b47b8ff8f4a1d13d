"""Sudoku as an RL environment: the reward is the exact checker on every item, garbage scores 0 without raising."""

import numpy as np
import pytest

from hackable_diffusion.data.tokenizers import MASK_ID
from hackable_diffusion.tasks.sudoku import generator
from hackable_diffusion.tasks.sudoku.grids import conflicting_cells, is_valid_solution, respects_givens
from hackable_diffusion.tasks.sudoku.rewards import SHAPED_CREDIT, policy_rows, sudoku_reward
from hackable_diffusion.tasks.sudoku.vocab import SudokuVocab


def _set(n=60, seed=11):
    data = generator.generate_dataset(n, (26, 34), seed=seed, cache_dir=None)
    puzzles, solutions = data["puzzles"].astype(np.int8), data["solutions"].astype(np.int8)
    rng = np.random.default_rng(0)
    grids = solutions.copy()
    for i in range(0, n, 2):  # every other grid wrong: two blanks' digits swapped, or one given changed
        blanks = np.flatnonzero(puzzles[i] == 0)
        a, b = rng.choice(blanks, 2, replace=False)
        if grids[i, a] == grids[i, b] or i % 4 == 0:
            given = np.flatnonzero(puzzles[i] != 0)[0]
            grids[i, given] = grids[i, given] % 9 + 1
        else:
            grids[i, [a, b]] = grids[i, [b, a]]
    return puzzles, solutions, grids


def test_the_reward_equals_the_exact_checker_on_every_item():
    puzzles, solutions, grids = _set()
    reward = sudoku_reward(puzzles, grids)
    checker = is_valid_solution(grids) & respects_givens(grids, puzzles)
    np.testing.assert_array_equal(reward == 1.0, checker)
    np.testing.assert_array_equal(checker, np.all(grids == solutions, axis=-1))  # unique puzzles
    assert set(np.unique(reward)) == {0.0, 1.0}


def test_shaped_credit_is_below_one_and_zero_for_changed_givens():
    puzzles, solutions, grids = _set()
    shaped = sudoku_reward(puzzles, grids, shaped=True)
    exact = sudoku_reward(puzzles, grids)
    np.testing.assert_array_equal(shaped[exact == 1], 1.0)
    wrong = exact == 0
    assert np.all(shaped[wrong] <= SHAPED_CREDIT)
    changed = ~respects_givens(grids, puzzles)
    assert changed.any() and np.all(shaped[changed] == 0.0)
    swapped = wrong & ~changed
    blanks = (puzzles == 0).sum(-1)
    good = ((puzzles == 0) & ~conflicting_cells(grids)).sum(-1)
    np.testing.assert_allclose(shaped[swapped], SHAPED_CREDIT * good[swapped] / blanks[swapped], rtol=1e-6)


def test_malformed_grids_score_zero_and_never_raise():
    puzzles, _, _ = _set(8)
    rng = np.random.default_rng(1)
    garbage = [
        rng.integers(-50, 50, puzzles.shape),
        np.zeros_like(puzzles),
        puzzles.copy(),  # nothing filled in
        np.full(puzzles.shape, 10**6, np.int64),
    ]
    for grids in garbage:
        for shaped in (False, True):
            reward = sudoku_reward(puzzles, grids, shaped=shaped)
            assert reward.shape == (8,) and np.all(reward < 1.0) and np.all(reward >= 0.0)


def test_policy_rows_mark_what_the_solver_generated():
    puzzles, solutions, _ = _set(4)
    grids = solutions.copy()
    grids[0, np.flatnonzero(puzzles[0] == 0)[0]] = 0  # a blank the solver left empty
    rows = policy_rows(puzzles, grids, layout="in_place")
    assert rows["tokens"].shape == (4, 81)
    np.testing.assert_array_equal(rows["completion"][1:], puzzles[1:] == 0)
    assert rows["completion"][0].sum() == (puzzles[0] == 0).sum() - 1
    np.testing.assert_array_equal(rows["tokens"][1], SudokuVocab().encode(solutions[1]))
    with pytest.raises(ValueError, match="81 digits"):  # the AR sampler draws every cell
        policy_rows(puzzles, grids, layout="ar")
    sampled = solutions.copy()
    given = np.flatnonzero(puzzles[2] != 0)[0]
    sampled[2, given] = sampled[2, given] % 9 + 1  # the AR sampler changed a given: the reward is 0 ...
    assert sudoku_reward(puzzles[2:3], sampled[2:3])[0] == 0.0
    ar = policy_rows(puzzles, sampled, layout="ar")
    assert ar["tokens"].shape == (4, 162) and not ar["completion"][:, :81].any() and ar["completion"][:, 81:].all()
    np.testing.assert_array_equal(ar["tokens"][1, :81] == MASK_ID, puzzles[1] == 0)
    np.testing.assert_array_equal(ar["tokens"][:, 81:], SudokuVocab().encode(sampled))  # ... and the row is the sample
