"""The model-steered search (`tasks/sudoku/search.py`): its rule checks against brute force, backtracking that revises a
wrong guess, budgets and pass counts, and that no grid is ever called solved unless it is a valid completion."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny_sudoku import tiny_sudoku_config as _tiny

from hackable_diffusion import cli, experiment
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.sampling.canvas import canvas_logits
from hackable_diffusion.tasks.sudoku import generator, search, symmetry
from hackable_diffusion.tasks.sudoku import grids as grid_lib
from hackable_diffusion.tasks.sudoku.inference import SolverSettings, solve_puzzles
from hackable_diffusion.tasks.sudoku.vocab import FIRST_DIGIT_ID


@pytest.fixture(scope="module")
def hard():
    """Generated unique puzzles with 22-25 givens, solutions and the exact solver's class."""
    data = generator.generate_dataset(12, (22, 25), seed=5, unique=True, cache_dir=None, num_workers=1)
    return data["puzzles"].astype(np.int8), data["solutions"].astype(np.int8)


def _brute_allowed(grid):
    out = np.zeros((81, 9), bool)
    for cell, digit in itertools.product(range(81), range(1, 10)):
        if grid[cell] != 0:
            continue
        r, c = divmod(cell, 9)
        peers = [grid[r * 9 + j] for j in range(9)] + [grid[i * 9 + c] for i in range(9)]
        br, bc = 3 * (r // 3), 3 * (c // 3)
        peers += [grid[(br + i) * 9 + bc + j] for i in range(3) for j in range(3)]
        out[cell, digit - 1] = digit not in peers
    return out


def test_allowed_digits_and_dead_ends_match_brute_force(hard):
    puzzles, solutions = hard
    rng = np.random.default_rng(0)
    for puzzle, solution in zip(puzzles[:4], solutions[:4]):
        np.testing.assert_array_equal(search.allowed_digits(puzzle), _brute_allowed(puzzle))
        assert not search.dead_end(puzzle) and not search.dead_end(solution)
        broken = solution.copy()
        a, b = 0, 1  # two cells of row 0 given the same digit
        broken[b] = broken[a]
        assert search.dead_end(broken)
        # a blank whose every digit is held by a peer: all of its row but the cell itself filled, column blocking
        partial = solution.copy()
        partial[rng.choice(81, 30, replace=False)] = 0
        expected = (
            any(not _brute_allowed(partial)[cell].any() for cell in range(81) if partial[cell] == 0)
            or grid_lib.conflicting_cells(partial).any()
        )
        assert search.dead_end(partial) == expected


class _Counting:
    """Probabilities from a rule of (grid, solution) -> (81, 9), counting how often each puzzle was evaluated."""

    def __init__(self, puzzles, solutions, rule):
        self.solutions = {p.tobytes(): s for p, s in zip(puzzles, solutions)}
        self.puzzles, self.rule, self.calls = puzzles, rule, []

    def __call__(self, grids):
        self.calls.append(len(grids))
        out = []
        for g in grids:
            # the puzzle a grid belongs to: the one whose givens it holds
            match = next(
                s
                for p, s in self.solutions.items()
                if np.all((np.frombuffer(p, np.int8) == 0) | (g == np.frombuffer(p, np.int8)))
            )
            out.append(self.rule(g, match))
        return np.stack(out)


def _oracle(grid, solution):
    return np.eye(9)[solution - 1]


def _adversary(grid, solution):
    """The true digit least likely, and no cell sure: every guess is wrong first."""
    p = np.full((81, 9), 1.0)
    p[np.arange(81), solution - 1] = 0.01
    return p / p.sum(-1, keepdims=True)


def test_oracle_probabilities_solve_without_branching(hard):
    puzzles, solutions = hard
    probs = _Counting(puzzles, solutions, _oracle)
    result = search.search_puzzles(probs, puzzles, pass_budget=64, batch_size=4)
    np.testing.assert_array_equal(result.grids, solutions)
    assert (result.status == "solved").all() and (result.branches == 0).all() and (result.backtracks == 0).all()
    assert (result.passes == 1).all()  # every blank is sure at once
    assert sum(probs.calls) == result.passes.sum()
    assert result.batch_forward_passes == -(-len(puzzles) // 4)


def test_backtracking_revises_wrong_guesses_and_finds_the_solution(hard):
    puzzles, solutions = hard
    puzzles, solutions = puzzles[:4], solutions[:4]
    probs = _Counting(puzzles, solutions, _adversary)
    result = search.search_puzzles(probs, puzzles, pass_budget=2000, sure_margin=0.999, batch_size=8)
    assert (result.status == "solved").all(), result.status
    np.testing.assert_array_equal(result.grids, solutions)  # unique puzzles: a valid completion is the solution
    assert (result.backtracks > 0).all() and (result.branches > 0).all()
    assert sum(probs.calls) == result.passes.sum()  # every evaluation of a puzzle is one of its passes
    # The rules alone (fewest candidates, naked singles) also finish these puzzles, in some number of passes.
    uniform = search.search_puzzles(search.uniform_probabilities, puzzles, pass_budget=2000, branch="fewest")
    np.testing.assert_array_equal(uniform.grids, solutions)


def test_a_revised_cell_takes_the_next_alternative():
    state = search.PuzzleSearch(np.zeros(81, np.int8))
    probs = np.full((81, 9), 1 / 9)
    probs[0] = [0.5, 0.3, 0.2, 0, 0, 0, 0, 0, 0]  # cell 0: the most confident, not sure (margin 0.2)
    state.step(probs, sure_margin=0.99, branch="confident")
    # every allowed digit stays an alternative (a complete search), the ones the model rules out last
    assert state.grid[0] == 1 and state.branches == 1 and state.stack[-1].alternatives == [2, 3, 4, 5, 6, 7, 8, 9]
    state.grid[1] = 1  # a later decision repeats digit 1 in row 0: a dead end
    state.settle()
    assert state.grid[0] == 2 and state.grid[1] == 0 and state.backtracks == 1  # revised, later commits undone
    assert state.stack[-1].alternatives == [3, 4, 5, 6, 7, 8, 9]
    for digit in range(2, 9):
        state.grid[1] = digit
        state.settle()
        assert state.grid[0] == digit + 1 and state.status == "open"
    assert not state.stack  # the last alternative left the stack
    state.grid[1] = 9
    state.settle()
    # no alternative left: the sure-free decisions so far were all revised, so the search starts again strictly
    assert state.status == "open" and state.strict and state.restarts == 1 and not state.grid.any()
    broken = np.zeros(81, np.int8)
    broken[:2] = 5  # a puzzle that breaks the rules has nothing to restart from
    state = search.PuzzleSearch(broken)
    state.settle()
    assert state.status == "exhausted" and state.restarts == 0


def _confidently_wrong(grid, solution):
    """Cell 80 sure of a wrong digit (so it is committed before any branch point), every other digit equally likely."""
    p = np.full((81, 9), 1 / 9)
    p[80] = np.eye(9)[solution[80] % 9]
    return p


def test_a_wrong_sure_commit_restarts_the_search_strictly(hard):
    puzzles, solutions = hard
    keep = puzzles[:, 80] == 0
    puzzles, solutions = puzzles[keep][:3], solutions[keep][:3]
    probs = _Counting(puzzles, solutions, _confidently_wrong)
    result = search.search_puzzles(probs, puzzles, pass_budget=3000, branch="fewest", batch_size=4)
    wrong_allowed = search.allowed_digits(puzzles)[np.arange(len(puzzles)), 80, solutions[:, 80] % 9]
    assert wrong_allowed.any()  # otherwise no wrong digit is committed and nothing is shown
    np.testing.assert_array_equal(result.restarts, wrong_allowed.astype(int))  # committed at once, revised only so
    assert (result.status == "solved").all()
    np.testing.assert_array_equal(result.grids, solutions)
    assert sum(probs.calls) == result.passes.sum()  # the passes before the restart count too


def test_random_probabilities_never_mark_a_broken_grid_solved(hard):
    puzzles, solutions = hard
    rng = np.random.default_rng(1)

    def noisy(grids):
        p = rng.dirichlet(np.full(9, 0.3), size=(len(grids), 81))
        return p

    for budget in (1, 5, 40):
        result = search.search_puzzles(noisy, puzzles, pass_budget=budget, sure_margin=0.6, batch_size=5)
        assert (result.passes <= budget).all()
        solved = result.status == "solved"
        assert grid_lib.is_valid_solution(result.grids[solved]).all()
        np.testing.assert_array_equal(result.grids[solved], solutions[solved])
        assert grid_lib.respects_givens(result.grids, puzzles).all()
        assert set(result.status) <= {"solved", "exhausted", "budget"}
        assert (result.status[result.passes < budget] != "budget").all()
    with pytest.raises(ValueError, match="pass_budget"):
        search.search_puzzles(noisy, puzzles, pass_budget=0)
    with pytest.raises(ValueError, match="branch"):
        search.search_puzzles(noisy, puzzles, pass_budget=4, branch="random")


def test_search_through_the_solver_with_a_model(tmp_path, hard):
    puzzles, solutions = hard
    exp = experiment.build(_tiny("in_place", tmp_path=tmp_path), "unused")
    params = T.init_params(exp.model, jax.random.key(0))
    settings = {"solver.rules": True, "solver.search": True, "solver.pass_budget": 6}
    out = solve_puzzles(exp, params, puzzles, batch_size=8, config=cli.override(exp.config, settings))
    assert (out.steps <= 6).all() and (out.steps >= 1).all()
    np.testing.assert_array_equal(out.network_passes, out.steps)
    assert out.batch_forward_passes >= 6  # 12 puzzles in batches of 8: two calls per round while both are open
    assert grid_lib.respects_givens(out.predictions, puzzles).all()
    complete = (out.predictions != 0).all(axis=-1)
    assert grid_lib.is_valid_solution(out.predictions[complete]).all()
    # the model's probabilities equal one forward pass of the sampler's call
    model_probs = search.ModelProbabilities(exp.model, params, 8)
    probs = model_probs(puzzles[:3])
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    assert probs.shape == (3, 81, 9) and model_probs.sizes == (8,)
    # a padded batch of 3 gives each grid what a batch of 8 (and the jitted sampler's model call) gives it
    tokens = exp.tokenizer.encode(puzzles[:8])
    logits = canvas_logits(exp.model, params, init_cache(exp.model.cfg, 8, 1), jnp.asarray(tokens))
    digits = np.asarray(jax.nn.softmax(logits[..., FIRST_DIGIT_ID : FIRST_DIGIT_ID + 9], axis=-1))
    np.testing.assert_allclose(probs, digits[:3], rtol=1e-4, atol=1e-6)
    assert search.ModelProbabilities(exp.model, params, 64).sizes == (64, 32, 16, 8)
    uniform = solve_puzzles(
        exp, params, puzzles, config=cli.override(exp.config, {**settings, "solver.search_scores": "uniform"})
    )
    assert (uniform.network_passes == 0).all()
    # parallel attempts: symmetric copies searched side by side, each solved grid mapped back to the puzzle's cells
    rules_only = {**settings, "solver.search_scores": "uniform", "solver.search_branch": "fewest"}
    runs = {}
    for attempts in (1, 3):
        overrides = {**rules_only, "solver.pass_budget": 1000, "solver.parallel_attempts": attempts}
        out = runs[attempts] = solve_puzzles(exp, params, puzzles, config=cli.override(exp.config, overrides))
        solved = (out.predictions != 0).all(axis=-1)
        assert out.search["search_solved"] == solved.sum() >= len(puzzles) - 2
        np.testing.assert_array_equal(out.predictions[solved], solutions[solved])  # in the puzzle's own cells
    alone, joint = runs[1].steps, runs[3].steps
    assert (joint <= alone).all() and (joint < alone).any()  # copy 0 is the lone search; the first to solve ends it
    with_model = solve_puzzles(
        exp, params, puzzles, batch_size=8, config=cli.override(exp.config, {**settings, "solver.parallel_attempts": 2})
    )
    assert (with_model.network_passes >= with_model.steps).all() and (with_model.network_passes <= 12).all()
    assert grid_lib.respects_givens(with_model.predictions, puzzles).all()
    for bad in ({"solver.rules": False}, {"solver.pass_budget": 0}, {"solver.repair_rounds": 1}):
        with pytest.raises(ValueError, match="search"):
            SolverSettings.from_config(cli.override(exp.config, {**settings, **bad}))


def _hashed(grids):
    """Deterministic noisy probabilities: a function of each grid alone, as a model's are."""
    out = []
    for g in grids:
        rng = np.random.default_rng(list(g.astype(np.int64) + 1))
        out.append(rng.dirichlet(np.full(9, 0.5), size=81))
    return np.stack(out)


def test_a_smaller_budget_stops_the_same_search_earlier(hard):
    puzzles, _ = hard
    # sure_margin 1: only single-digit cells are sure, so every guess is a branch point and the search is complete
    full = search.search_puzzles(_hashed, puzzles, pass_budget=80, sure_margin=1.0, batch_size=8)
    for budget in (12, 60):
        short = search.search_puzzles(_hashed, puzzles, pass_budget=budget, sure_margin=1.0, batch_size=8)
        np.testing.assert_array_equal(short.passes, np.minimum(full.passes, budget))
        within = full.passes <= budget
        np.testing.assert_array_equal(short.status[within], full.status[within])
        np.testing.assert_array_equal(short.grids[within], full.grids[within])
        assert (short.status[~within] == "budget").all()
    assert (full.status == "solved").any() and (full.backtracks > 0).any()  # the comparison covers both


def test_the_models_doubt_backtracks_only_below_the_threshold():
    state = search.PuzzleSearch(np.zeros(81, np.int8))
    probs = np.full((81, 9), 1 / 9)
    probs[0] = [0.5, 0.3, 0.2, 0, 0, 0, 0, 0, 0]
    state.step(probs, sure_margin=0.99, branch="confident", doubt_below=0.05)  # no branch point yet: no doubt
    assert state.grid[0] == 1 and state.doubts == 0 and state.passes == 1
    doubtful = np.full((81, 9), 1 / 9)
    doubtful[5] = [0.97, 0, 0, 0, 0, 0, 0, 0.015, 0.015]  # cell 5 (row 0): its allowed digits hold 0.03 in all
    state.step(doubtful, sure_margin=0.99, branch="confident", doubt_below=0.01)  # 0.03 >= 0.01: a normal pass
    assert state.doubts == 0 and state.passes == 2 and state.grid[5] == 8  # branched on cell 5 (0.5 / 0.5)
    assert state.stack[-1].cell == 5 and state.stack[-1].alternatives[0] == 9
    doubtful[6] = doubtful[5]  # cell 6 (row 0): digits 1 and 8 taken, the allowed ones hold 0.015
    state.step(doubtful, sure_margin=0.99, branch="confident", doubt_below=0.05)  # below 0.05: revise the branch
    assert state.doubts == 1 and state.passes == 3 and state.backtracks == 1
    assert state.grid[5] == 9 and state.grid[0] == 1 and (state.grid != 0).sum() == 2  # the latest branch revised
    with pytest.raises(ValueError, match="doubt_below"):
        search.search_puzzles(search.uniform_probabilities, np.zeros((1, 81), np.int8), pass_budget=2, doubt_below=1.0)


def test_a_bulk_branch_falls_back_to_its_cell_alone_then_to_the_other_digits():
    state = search.PuzzleSearch(np.zeros(81, np.int8))
    probs = np.full((81, 9), 1 / 9)
    probs[0] = [0.6, 0.4, 0, 0, 0, 0, 0, 0, 0]  # most confident
    probs[1] = [0.55, 0.45, 0, 0, 0, 0, 0, 0, 0]  # a peer wanting digit 1 too: skipped
    probs[40] = [0, 0, 0.58, 0.42, 0, 0, 0, 0, 0]  # not a peer of cell 0
    probs[80] = [0, 0, 0, 0.5, 0.5, 0, 0, 0, 0]
    probs[60] = [0, 0, 0, 0, 0, 0, 0, 0, 1.0]  # sure: committed in the same pass as the branch
    state.step(probs, sure_margin=0.99, branch="confident", cells_per_branch=3)
    assert state.grid[0] == 1 and state.grid[40] == 3 and state.grid[1] == 0 and state.grid[80] == 4
    assert state.grid[60] == 9 and (state.grid != 0).sum() == 4 and state.passes == 1 and state.branches == 1
    assert state.stack[-1].cell == 0 and state.stack[-1].alternatives[:2] == [1, 2]
    state.grid[2] = 1  # row 0 now holds digit 1 twice: a dead end
    state.settle()
    # first fallback: cell 0 alone (the sure cell, decided before the branch point, stays)
    assert state.grid[0] == 1 and state.grid[60] == 9 and (state.grid != 0).sum() == 2
    state.grid[2] = 1
    state.settle()
    assert state.grid[0] == 2 and (state.grid != 0).sum() == 2  # then its next digit
    with pytest.raises(ValueError, match="cells_per_branch"):
        search.search_puzzles(
            search.uniform_probabilities, np.zeros((1, 81), np.int8), pass_budget=2, cells_per_branch=0
        )


def test_a_run_saved_before_the_search_keys_gains_them_at_their_defaults(tmp_path):
    from hackable_diffusion.tasks.sudoku.recipes import upgrade_saved_config

    config = _tiny("in_place", tmp_path=tmp_path)
    with config.solver.unlocked():
        for key in [k for k in config.solver if k.startswith("search")]:
            del config.solver[key]
    config.solver.rules = True
    upgrade_saved_config(config)
    assert config.solver.search is False and config.solver.search_branch == "confident"
    assert config.solver.rules is True  # saved values stay


def _leaning(grid, solution):
    """The true digit on top everywhere, but never by the sure margin: only single-digit blanks are sure."""
    p = np.full((81, 9), 0.7 / 8)
    p[np.arange(81), solution - 1] = 0.3
    return p


def test_a_paced_search_decides_enough_cells_per_pass_to_finish_within_its_budget(hard):
    puzzles, solutions = hard
    plain = search.search_puzzles(_Counting(puzzles, solutions, _leaning), puzzles, pass_budget=8, batch_size=8)
    assert (plain.status == "budget").all()  # one guess (plus naked singles) per pass cannot fill ~57 blanks in 8
    probs = _Counting(puzzles, solutions, _leaning)
    paced = search.search_puzzles(probs, puzzles, pass_budget=8, paced=True, batch_size=8)
    assert (paced.status == "solved").all() and (paced.passes <= 8).all()
    np.testing.assert_array_equal(paced.grids, solutions)
    assert sum(probs.calls) == paced.passes.sum()
    # one pass of a fresh search decides at least ceil(blanks / budget) cells, and cells_per_branch is then ignored
    for budget in (3, 8, 20):
        state = search.PuzzleSearch(puzzles[0].copy())
        blanks = int((state.grid == 0).sum())
        probs = _leaning(state.grid, solutions[0])
        state.step(probs, sure_margin=0.99, branch="confident", paced_budget=budget, cells_per_branch=50)
        decided = blanks - int((state.grid == 0).sum())
        assert -(-blanks // budget) <= decided < min(blanks, 50)
        assert state.passes == 1 and state.branches == 1 and state.status == "open"


def test_parallel_attempts_stop_when_one_solves_and_otherwise_follow_their_own_search(hard):
    puzzles, _ = hard
    copies = np.asarray(symmetry.grid_symmetries(3).to_views(jnp.asarray(puzzles))).astype(np.int8)  # row k*n + i
    n, budget = len(puzzles), 60
    alone = search.search_puzzles(_hashed, copies, pass_budget=budget, sure_margin=1.0, batch_size=8)
    joint = search.search_puzzles(_hashed, copies, pass_budget=budget, sure_margin=1.0, attempts=3, batch_size=8)
    first_solve = np.where(alone.status == "solved", alone.passes, budget + 1).reshape(3, n).min(axis=0)
    stop = np.tile(first_solve, 3)  # the round at which the puzzle of each row was first solved
    np.testing.assert_array_equal(joint.passes, np.minimum(alone.passes, stop))
    kept = alone.passes <= stop  # rows that ended on their own before (or as) a copy solved the puzzle
    np.testing.assert_array_equal(joint.status[kept], alone.status[kept])
    np.testing.assert_array_equal(joint.grids[kept], alone.grids[kept])
    assert (joint.status[~kept] == "stopped").all() and (~kept).any() and kept.any()
    assert (first_solve <= budget).any() and (first_solve > budget).any()  # solved and unsolved puzzles both covered
    with pytest.raises(ValueError, match="attempts"):
        search.search_puzzles(_hashed, copies[:7], pass_budget=4, attempts=3)
