"""The compiled solver (`fast_solver`) against the pure-Python reference (`exact_solver`, `generator`,
`hard_puzzles`): the same guess counts under both rules, the same solutions, nodes and branch points, the same random
grids, carved puzzles and hard puzzles, on small seeded sets that make the search guess, branch into many solutions,
stop at a cap and meet broken grids."""

import numpy as np
import pytest

from hackable_diffusion.tasks.sudoku import exact_solver, fast_solver, generator, hard_puzzles

# Arto Inkala's 2012 puzzle (21 givens), one of the hardest published; 0 = blank.
INKALA = "800000000003600000070090200050007000000045700000100030001000068008500010090000400"


def _grid(text):
    return np.array([int(ch) for ch in text], np.int8)


@pytest.fixture(scope="module")
def puzzles():
    """Unique generated puzzles, Inkala's, puzzles with many solutions (a full grid with 50-70 random blanks), a
    solved grid, the empty grid, a grid with two equal givens in a row and one with a blank that has no digit left."""
    rng = np.random.default_rng(3)
    unique = generator.generate_dataset(10, (22, 30), seed=5, cache_dir=None)
    rows = list(unique["puzzles"]) + [_grid(INKALA)]
    for blanks in (50, 60, 70):
        grid = generator.random_full_grid(rng)
        grid[rng.permutation(81)[:blanks]] = 0
        rows.append(grid)
    solved = unique["solutions"][0].copy()
    broken = solved.copy()
    broken[1] = broken[0]
    dead = np.zeros(81, np.int8)
    dead[:8] = np.arange(1, 9)
    dead[17] = 9  # cell 8 sees 1..8 in its row and 9 in its column
    rows += [solved, np.zeros(81, np.int8), broken, dead]
    return np.stack(rows).astype(np.int8)


def _reference_counts(puzzles, rule, max_solutions, max_guesses):
    return [exact_solver.count_guesses(p, rule, max_solutions, max_guesses) for p in puzzles]


@pytest.mark.parametrize("rule", exact_solver.GUESS_RULES)
@pytest.mark.parametrize("max_solutions, max_guesses", [(1, 0), (2, 0), (1, 5), (2, 40), (3, 300)])
def test_counts_equal_the_reference(puzzles, rule, max_solutions, max_guesses):
    if rule == "plain" and max_guesses == 0:
        rows = np.concatenate([puzzles[:11], puzzles[-4:]])  # no cap: skip the many-solution grids' plain trees
    else:
        rows = puzzles
    got = fast_solver.count_guesses(rows, rule, max_solutions, max_guesses)
    want = _reference_counts(rows, rule, max_solutions, max_guesses)
    assert got.rule == rule
    assert got.guesses.tolist() == [w.guesses for w in want]
    assert got.backtracks.tolist() == [w.backtracks for w in want]
    assert got.num_solutions.tolist() == [w.num_solutions for w in want]
    assert got.complete.tolist() == [w.complete for w in want]
    assert max(w.guesses for w in want) >= 5, "the check needs puzzles that make the search guess"
    if max_guesses:
        assert not all(w.complete for w in want), "the check needs searches that stop at the cap"


def test_inkala_regression_values():
    counts = {rule: fast_solver.count_guesses(_grid(INKALA), rule) for rule in exact_solver.GUESS_RULES}
    assert (int(counts["plain"].guesses[0]), int(counts["plain"].backtracks[0])) == (393, 377)
    assert (int(counts["fewest"].guesses[0]), int(counts["fewest"].backtracks[0])) == (172, 162)


@pytest.mark.parametrize("max_solutions", [1, 2, 3])
def test_solutions_nodes_and_branches_equal_the_reference(puzzles, max_solutions):
    got = fast_solver.solve(puzzles, max_solutions)
    assert got.solutions.shape == (len(puzzles), max_solutions, 81)
    for i, puzzle in enumerate(puzzles):
        want = exact_solver.solve(puzzle, max_solutions)
        assert (got.num_solutions[i], got.nodes[i], got.guesses[i]) == (want.num_solutions, want.nodes, want.guesses)
        for k, solution in enumerate(want.solutions):
            np.testing.assert_array_equal(got.solutions[i, k], solution)
        assert not got.solutions[i, want.num_solutions :].any()
    unique = fast_solver.is_unique(puzzles)
    assert unique.tolist() == [exact_solver.is_unique(p) for p in puzzles]
    assert unique.any() and not unique.all()


def test_generator_building_blocks_equal_the_reference():
    for seed in range(4):
        np.testing.assert_array_equal(
            fast_solver.random_full_grid(np.random.default_rng(seed)),
            generator.random_full_grid(np.random.default_rng(seed)),
        )
    rng = np.random.default_rng(11)
    solution = generator.random_full_grid(rng)
    for target in (17, 26, 40):
        order = rng.permutation(81)
        carved = fast_solver.carve(solution, order, target)
        np.testing.assert_array_equal(carved, generator._carve(solution.tolist(), order.tolist(), target, True))
        for cell in rng.choice(np.flatnonzero(carved), 5, replace=False):  # blanking a given: a second solution?
            trial = carved.copy()
            trial[cell] = 0
            want = hard_puzzles._other_solution(trial.tolist(), solution.tolist(), int(cell))
            got = fast_solver.other_solution(trial, solution, int(cell))
            assert (got is None) == (want is None) and (want is None or got.tolist() == want)
        assert np.count_nonzero(carved) >= target and exact_solver.is_unique(carved)


def test_hard_puzzles_equal_the_reference():
    spec = hard_puzzles.HardSpec(givens=(20, 24), min_guesses=4, rule="fewest", climb_steps=25)
    for i in range(2):
        fast = hard_puzzles.generate_hard_puzzle(np.random.default_rng([4, i]), spec, solver="fast")
        slow = hard_puzzles.generate_hard_puzzle(np.random.default_rng([4, i]), spec, solver="reference")
        np.testing.assert_array_equal(fast.puzzle, slow.puzzle)
        np.testing.assert_array_equal(fast.solution, slow.solution)
        assert (fast.grids, fast.moves) == (slow.grids, slow.moves)
        assert exact_solver.count_guesses(fast.puzzle, "fewest").guesses >= 4
    with pytest.raises(ValueError, match="solver"):
        hard_puzzles.generate_hard_puzzle(np.random.default_rng(0), spec, solver="numba")


def test_bad_input_is_rejected_with_a_message():
    with pytest.raises(ValueError, match=r"shape \(n, 81\)"):
        fast_solver.count_guesses(np.zeros((2, 80), np.int8))
    with pytest.raises(ValueError, match="holds 10"):
        fast_solver.solve(np.full(81, 10))
    with pytest.raises(ValueError, match="integers"):
        fast_solver.solve(np.full(81, 0.5))
    with pytest.raises(ValueError, match="rule"):
        fast_solver.count_guesses(np.zeros(81, np.int8), "random")
    with pytest.raises(ValueError, match="max_solutions"):
        fast_solver.solve(np.zeros(81, np.int8), max_solutions=0)
    with pytest.raises(ValueError, match="max_guesses"):
        fast_solver.count_guesses(np.zeros(81, np.int8), max_guesses=-1)
    empty = fast_solver.count_guesses(np.zeros((0, 81), np.int8))
    assert empty.guesses.shape == (0,)
