"""Sudoku difficulty (`exact_solver.count_guesses`, `difficulty.py`, `hard_puzzles.py`): guess counts under the plain
and fewest rules against hand-made grids and two small independent counters, guess bands, the band breakdown of
`evaluate`, and the hard-puzzle generator (unique, in spec, reproducible, cached)."""

import itertools
import pathlib
import types

import numpy as np
import pytest

from hackable_diffusion.tasks.sudoku import difficulty, exact_solver, generator, hard_puzzles
from hackable_diffusion.tasks.sudoku import held_out
from hackable_diffusion.tasks.sudoku.recipes import sudoku_config

REPO = pathlib.Path(__file__).resolve().parents[2]

# Arto Inkala's 2012 puzzle (21 givens), one of the hardest published; 0 = blank.
INKALA = "800000000003600000070090200050007000000045700000100030001000068008500010090000400"


def _grid(text):
    return np.array([int(ch) for ch in text], np.int8)


# ------------------------------------------------------------------------------------------ independent counters

_PEERS = [
    [
        j
        for j in range(81)
        if j != i and (j // 9 == i // 9 or j % 9 == i % 9 or (j // 27, j % 9 // 3) == (i // 27, i % 9 // 3))
    ]
    for i in range(81)
]
_UNITS = (
    [[r * 9 + c for c in range(9)] for r in range(9)]
    + [[r * 9 + c for r in range(9)] for c in range(9)]
    + [[(br + r) * 9 + bc + c for r in range(3) for c in range(3)] for br in (0, 3, 6) for bc in (0, 3, 6)]
)


def _propagate(cands, hidden):
    """Candidate sets (a list of 81 sets, a placed cell holds one digit) closed under naked singles and, with
    `hidden`, hidden singles. Returns False on a contradiction: an empty cell, two equal singles that see each
    other, or (with `hidden`) a digit with no place left in a unit."""
    changed = True
    while changed:
        changed = False
        for i in range(81):
            if len(cands[i]) == 0:
                return False
            if len(cands[i]) == 1:
                (d,) = cands[i]
                for j in _PEERS[i]:
                    if d in cands[j]:
                        cands[j] = cands[j] - {d}
                        changed = True
                        if not cands[j]:
                            return False
        if hidden and not changed:
            for unit in _UNITS:
                for d in range(1, 10):
                    where = [i for i in unit if d in cands[i]]
                    if not where:
                        return False
                    if len(where) == 1 and len(cands[where[0]]) > 1:
                        cands[where[0]] = {d}
                        changed = True
    return True


def _reference_count(puzzle, rule, max_solutions=1):
    """(guesses, backtracks, solutions) of the depth-first search under `rule`, written from the definitions."""
    stats = {"guesses": 0, "backtracks": 0, "solutions": 0}
    hidden = rule == "fewest"

    def search(cands):
        if not _propagate(cands, hidden):
            return
        open_cells = [i for i in range(81) if len(cands[i]) > 1]
        if not open_cells:
            stats["solutions"] += 1
            return
        if rule == "plain":
            cell = open_cells[0]
        else:
            cell = min(open_cells, key=lambda i: (len(cands[i]), i))
        for d in sorted(cands[cell]):
            stats["guesses"] += 1
            before = stats["solutions"]
            child = list(cands)
            child[cell] = {d}
            search(child)
            if stats["solutions"] == before:
                stats["backtracks"] += 1
            if stats["solutions"] >= max_solutions:
                return

    search([{int(v)} if v else set(range(1, 10)) for v in puzzle])
    return stats["guesses"], stats["backtracks"], stats["solutions"]


def _deadly_rectangle(solution):
    """A copy of `solution` with a 2x2 rectangle a b / b a (two rows of one band, columns in two stacks) blanked: two
    solutions, and every blank keeps exactly its two rectangle digits as candidates."""
    g = solution.reshape(9, 9)
    for r1, r2 in itertools.combinations(range(9), 2):
        for c1, c2 in itertools.combinations(range(9), 2):
            if r1 // 3 == r2 // 3 and c1 // 3 != c2 // 3 and g[r1, c1] == g[r2, c2] and g[r1, c2] == g[r2, c1]:
                puzzle = g.copy()
                puzzle[[r1, r1, r2, r2], [c1, c2, c1, c2]] = 0
                return puzzle.reshape(81)
    return None


@pytest.fixture(scope="module")
def generated():
    return generator.generate_dataset(12, (22, 30), seed=5, cache_dir=None)


# ----------------------------------------------------------------------------------------------------- counts


@pytest.mark.parametrize("rule", exact_solver.GUESS_RULES)
def test_hand_made_grids(rule, generated):
    solution = generated["solutions"][0]
    solved = exact_solver.count_guesses(solution, rule)
    assert (solved.guesses, solved.backtracks, solved.num_solutions, solved.complete) == (0, 0, 1, True)
    one_short = solution.copy()
    one_short[40] = 0
    assert exact_solver.count_guesses(one_short, rule).guesses == 0
    last_row = solution.copy()
    last_row[72:] = 0  # each blank is the last one of its column: naked singles
    assert exact_solver.count_guesses(last_row, rule).guesses == 0

    rectangles = [r for r in (_deadly_rectangle(s) for s in generated["solutions"]) if r is not None]
    assert rectangles, "no deadly rectangle in the generated solutions"
    for puzzle in rectangles[:2]:
        # The first blank has two digits; either one completes a solution by singles alone.
        first = exact_solver.count_guesses(puzzle, rule)
        assert (first.guesses, first.backtracks, first.num_solutions) == (1, 0, 1)
        both = exact_solver.count_guesses(puzzle, rule, max_solutions=2)
        assert (both.guesses, both.backtracks, both.num_solutions) == (2, 0, 2)

    broken = solution.copy()
    broken[1] = broken[0]  # two equal digits in a row
    assert exact_solver.count_guesses(broken, rule).num_solutions == 0


@pytest.mark.parametrize("rule", exact_solver.GUESS_RULES)
def test_counts_match_an_independent_counter(rule, generated):
    puzzles = list(generated["puzzles"]) + [_grid(INKALA)]
    seen = []
    for puzzle in puzzles:
        for max_solutions in (1, 2):
            got = exact_solver.count_guesses(puzzle, rule, max_solutions=max_solutions)
            assert (got.guesses, got.backtracks, got.num_solutions) == _reference_count(puzzle, rule, max_solutions)
            seen.append(got.guesses)
    assert max(seen) >= 10, "the check needs puzzles that make the search guess"
    # Regression values of Inkala's puzzle (the independent counter above reproduces them too).
    inkala = exact_solver.count_guesses(_grid(INKALA), rule)
    assert (inkala.guesses, inkala.backtracks) == {"plain": (393, 377), "fewest": (172, 162)}[rule]


def test_count_options_and_the_cap(generated):
    puzzle = _grid(INKALA)
    full = exact_solver.count_guesses(puzzle, "plain")
    assert full.complete and full.num_solutions == 1
    capped = exact_solver.count_guesses(puzzle, "plain", max_guesses=50)
    assert (capped.guesses, capped.complete, capped.num_solutions) == (50, False, 0)
    assert exact_solver.count_guesses(puzzle, "plain", max_guesses=full.guesses) == full
    counts = difficulty.guess_counts(np.stack([puzzle, generated["solutions"][0]]), cache_dir=None)
    assert counts.tolist() == [min(full.guesses, difficulty.BAND_CAP), 0]
    with pytest.raises(ValueError, match="rule"):
        exact_solver.count_guesses(puzzle, "random")
    with pytest.raises(ValueError, match="max_solutions"):
        exact_solver.count_guesses(puzzle, max_solutions=0)
    with pytest.raises(ValueError, match="max_guesses"):
        exact_solver.count_guesses(puzzle, max_guesses=-1)


def test_guess_counts_are_cached(tmp_path, generated):
    puzzles = generated["puzzles"][:3]
    first = difficulty.guess_counts(puzzles, cache_dir=tmp_path)
    path = difficulty.guess_counts_path(puzzles, cache_dir=tmp_path)
    assert path.exists()
    np.save(path, np.array([7, 8, 9]))  # the cache, not a recount, answers the next call
    assert difficulty.guess_counts(puzzles, cache_dir=tmp_path).tolist() == [7, 8, 9]
    assert difficulty.guess_counts(puzzles, "fewest", cache_dir=tmp_path).tolist() != [7, 8, 9]
    assert difficulty.guess_counts(puzzles, cache_dir=None).tolist() == first.tolist()


def test_guess_band_edges():
    counts = [0, 1, 9, 10, 99, 100, 999, 1000, 10**7]
    expected = ["0", "1-9", "1-9", "10-99", "10-99", "100-999", "100-999", "1000+", "1000+"]
    assert difficulty.guess_band(np.array(counts)).tolist() == expected
    assert difficulty.guess_band(np.array(counts).reshape(3, 3)).shape == (3, 3)
    assert str(difficulty.guess_band(12)) == "10-99"
    assert difficulty.GUESS_BANDS == ("0", "1-9", "10-99", "100-999", "1000+")
    with pytest.raises(ValueError, match=">= 0"):
        difficulty.guess_band(np.array([3, -1]))
    with pytest.raises(ValueError, match="integers"):
        difficulty.guess_band(np.array([1.5]))


def test_fewest_rule_bands_are_finer():
    counts = np.array([0, 1, 9, 10, 29, 30, 49, 50, 99, 100, 10**6])
    expected = ["0", "1-9", "1-9", "10-29", "10-29", "30-49", "30-49", "50-99", "50-99", "100+", "100+"]
    assert difficulty.guess_band(counts, rule="fewest").tolist() == expected
    assert difficulty.bands_of("fewest") == difficulty.FEWEST_BANDS == tuple(dict.fromkeys(expected))
    assert difficulty.bands_of("plain") == difficulty.GUESS_BANDS
    assert difficulty.guess_band(counts, rule="plain").tolist() == difficulty.guess_band(counts).tolist()
    with pytest.raises(ValueError, match="rule"):
        difficulty.guess_band(counts, rule="fastest")


# -------------------------------------------------------------------------------------------- band breakdown


def _tiny_set(generated):
    """Three puzzles: a grid one cell short (0 guesses), Inkala's puzzle (393 plain guesses) and a generated one."""
    one_short = generated["solutions"][0].copy()
    one_short[0] = 0
    inkala = _grid(INKALA)
    inkala_solution = exact_solver.solve(inkala).solutions[0]
    puzzles = np.stack([one_short, inkala, generated["puzzles"][1]])
    solutions = np.stack([generated["solutions"][0], inkala_solution, generated["solutions"][1]])
    return puzzles, solutions


def test_accuracy_by_difficulty_on_a_tiny_set(generated):
    puzzles, solutions = _tiny_set(generated)
    predictions = solutions.copy()
    predictions[1, puzzles[1] == 0] = 1  # Inkala's puzzle answered wrongly
    guesses = np.array([0, 1500, 42])
    out = difficulty.accuracy_by_difficulty(predictions, puzzles, solutions, guesses)
    assert out["sudoku_count_guesses_0"] == 1 and out["accuracy_guesses_0"] == 1.0
    assert out["sudoku_count_guesses_1000+"] == 1 and out["accuracy_guesses_1000+"] == 0.0
    assert out["sudoku_count_guesses_10-99"] == 1 and out["accuracy_guesses_10-99"] == 1.0
    assert out["sudoku_count_guesses_1-9"] == 0 and out["accuracy_guesses_1-9"] is None
    assert out["sudoku_count_guesses_100-999"] == 0
    assert out["sudoku_count_givens_80"] == 1 and out["accuracy_givens_21"] == 0.0
    assert sum(v for k, v in out.items() if k.startswith("sudoku_count_givens_")) == 3
    with pytest.raises(ValueError, match="one count per puzzle"):
        difficulty.accuracy_by_difficulty(predictions, puzzles, solutions, guesses[:2])


def test_evaluate_reports_accuracy_per_band(tmp_path, monkeypatch, generated):
    puzzles, solutions = _tiny_set(generated)
    predictions = solutions.copy()
    predictions[2, puzzles[2] == 0] = 0  # the generated puzzle left unsolved

    def fake_solve(exp, params, grids, **kwargs):
        n = len(grids)
        return types.SimpleNamespace(
            predictions=predictions, steps=np.ones(n), seconds=1.0, batch_forward_passes=1,
            network_passes=np.ones(n), search=None,
        )  # fmt: skip

    monkeypatch.setattr(held_out, "solve_puzzles", fake_solve)
    config = sudoku_config()
    config.data.cache_dir = str(tmp_path)
    exp = types.SimpleNamespace(config=config)
    out = held_out.evaluate_puzzles(exp, None, puzzles, solutions)
    counts = difficulty.guess_counts(puzzles, cache_dir=None)
    assert counts[:2].tolist() == [0, 393]
    band = str(difficulty.guess_band(counts[2]))
    assert band != "100-999", "the generated puzzle should sit in another band than Inkala's"
    assert out["accuracy"] == pytest.approx(2 / 3)
    assert out["accuracy_guesses_0"] == 1.0 and out["accuracy_guesses_100-999"] == 1.0
    assert out[f"accuracy_guesses_{band}"] == 0.0 and out[f"sudoku_count_guesses_{band}"] == 1
    assert sum(out[f"sudoku_count_guesses_{b}"] for b in difficulty.GUESS_BANDS) == 3
    assert out["accuracy_givens_21"] == 1.0


# ----------------------------------------------------------------------------------------------- hard puzzles


def _check_in_spec(data, spec):
    assert hard_puzzles.in_spec(data, spec).all()
    for puzzle, solution, guesses in zip(data["puzzles"], data["solutions"], data["guesses"]):
        result = exact_solver.solve(puzzle, max_solutions=2)
        assert result.num_solutions == 1
        np.testing.assert_array_equal(result.solutions[0], solution)
        assert exact_solver.count_guesses(puzzle, spec.rule, max_guesses=hard_puzzles.REPORT_CAP).guesses == guesses
        assert spec.givens[0] <= np.count_nonzero(puzzle) <= spec.givens[1] and guesses >= spec.min_guesses


def test_hard_sets_are_unique_in_spec_and_reproducible(tmp_path):
    spec = hard_puzzles.HardSpec(givens=(22, 26), min_guesses=30, rule="plain")
    data = hard_puzzles.generate_hard_dataset(5, spec, seed=3, num_workers=1, cache_dir=None)
    _check_in_spec(data, spec)
    again = hard_puzzles.generate_hard_dataset(5, spec, seed=3, num_workers=1, cache_dir=None, chunk=2)
    for key in data:
        np.testing.assert_array_equal(data[key], again[key])
    pooled = hard_puzzles.generate_hard_dataset(5, spec, seed=3, num_workers=2, cache_dir=None, chunk=2)
    np.testing.assert_array_equal(pooled["puzzles"], data["puzzles"])  # independent of the worker split
    other = hard_puzzles.generate_hard_dataset(5, spec, seed=4, num_workers=1, cache_dir=None)
    assert not np.array_equal(other["puzzles"], data["puzzles"])
    np.testing.assert_array_equal(data["givens"], np.count_nonzero(data["puzzles"], axis=1))

    cached = hard_puzzles.generate_hard_dataset(5, spec, seed=3, num_workers=1, cache_dir=tmp_path)
    path = hard_puzzles.hard_cache_path(5, spec, 3, tmp_path)
    assert path.exists()
    np.testing.assert_array_equal(cached["puzzles"], data["puzzles"])
    np.savez(path, **{**cached, "guesses": cached["guesses"] + 1})  # a second call reads the file
    assert (
        hard_puzzles.generate_hard_dataset(5, spec, seed=3, cache_dir=tmp_path)["guesses"] == data["guesses"] + 1
    ).all()


@pytest.mark.parametrize(
    "spec, seed",
    [
        (hard_puzzles.HardSpec(givens=(17, 23), min_guesses=300, rule="plain", climb_steps=30), 1),
        (hard_puzzles.HardSpec(givens=(17, 22), min_guesses=5, rule="fewest", climb_steps=30), 0),
    ],
)
def test_hill_climb_reaches_the_spec_and_keeps_puzzles_unique(spec, seed):
    data = hard_puzzles.generate_hard_dataset(2, spec, seed=seed, num_workers=1, cache_dir=None)
    _check_in_spec(data, spec)
    assert (data["moves"] > 0).all()  # these seeds' first grids missed the spec: the climb found both puzzles


def test_hill_climb_moves_keep_the_solution():

    rng = np.random.default_rng(0)
    solution = generator.random_full_grid(rng).tolist()
    cells = generator._carve(solution, rng.permutation(81).tolist(), 17, True)
    for _ in range(20):
        moved = hard_puzzles._move(cells, solution, rng, target=17)
        if moved is None:
            continue
        result = exact_solver.solve(np.array(moved, np.int8))
        assert result.num_solutions == 1 and result.solutions[0].tolist() == solution
        assert 81 - moved.count(0) <= 81 - cells.count(0)


def test_hard_spec_rejects_bad_knobs():
    with pytest.raises(ValueError, match="givens"):
        hard_puzzles.HardSpec(givens=(16, 23))
    with pytest.raises(ValueError, match="rule"):
        hard_puzzles.HardSpec(rule="fastest")
    with pytest.raises(ValueError, match="min_guesses"):
        hard_puzzles.HardSpec(min_guesses=-1)
    with pytest.raises(generator.GenerationError, match="max_grids"):
        hard_puzzles.generate_hard_puzzle(np.random.default_rng(0), hard_puzzles.HardSpec((17, 17), 0, max_grids=2))



def test_hard_puzzles_join_the_training_set_within_their_guess_band(tmp_path):
    from hackable_diffusion.tasks.sudoku import data as data_lib
    from hackable_diffusion.tasks.sudoku import hard_puzzles
    from hackable_diffusion.tasks.sudoku import recipes as sudoku_recipes

    config = sudoku_recipes.sudoku_in_place_config(steps=1, depth_loops=1)
    config.data.num_train, config.data.num_eval = 8, 4
    config.data.cache_dir = str(tmp_path)
    plain = data_lib.build_data(config)
    config.data.hard_count, config.data.hard_min_guesses, config.data.hard_max_guesses = 6, 1, 30
    config.data.hard_givens_min, config.data.hard_givens_max = 24, 36
    mixed = data_lib.build_data(config)
    hard = hard_puzzles.generate_hard_dataset(
        6, hard_puzzles.HardSpec(givens=(24, 36), min_guesses=1), seed=0, cache_dir=str(tmp_path)
    )
    kept = (hard["guesses"] <= 30) & hard["guesses_complete"]
    assert 0 < kept.sum() < 6 or kept.all()
    np.testing.assert_array_equal(mixed.train_tokens[:8], plain.train_tokens)  # the plain set first, unchanged
    np.testing.assert_array_equal(mixed.train_tokens[8:], mixed.tokenizer.encode(hard["solutions"][kept]))
    np.testing.assert_array_equal(mixed.train_fixed[8:], hard["puzzles"][kept] != 0)
    assert (hard["guesses"][kept] >= 1).all() and (hard["guesses"][kept] <= 30).all()


def test_hard_climb_reaches_the_generator_and_the_fewest_curriculum_chains_its_stages(tmp_path, monkeypatch, capsys):
    from hackable_diffusion import cli
    from hackable_diffusion.tasks.sudoku import data as data_lib
    from hackable_diffusion.tasks.sudoku import hard_puzzles

    seen = []
    real = hard_puzzles.generate_hard_dataset

    def spy(n, spec, seed, cache_dir, progress):
        seen.append((n, spec, seed))
        return real(n, spec, seed=seed, cache_dir=cache_dir, num_workers=1, progress=progress)

    monkeypatch.setattr(hard_puzzles, "generate_hard_dataset", spy)
    stages = {k: cli.load_config_file(f"{REPO}/configs/sudoku_fewest.py:{k}") for k in ("1", "2", "3")}
    assert stages["1"].init.checkpoint == "runs/sudoku_extreme_ft"
    assert [stages[k].init.checkpoint for k in ("2", "3")] == ["runs/sudoku_fewest_1", "runs/sudoku_fewest_2"]
    bands = [(c.data.hard_min_guesses, c.data.hard_max_guesses) for c in stages.values()]
    assert bands == [(1, 9), (10, 29), (30, 0)]  # consecutive fewest-rule bands, the last open
    assert all(c.data.hard_rule == "fewest" for c in stages.values())
    assert len({c.data.hard_seed for c in stages.values()} | {1}) == 4  # no stage uses the held-out set's seed
    with pytest.raises(ValueError, match="stage"):
        cli.load_config_file(f"{REPO}/configs/sudoku_fewest.py:4")

    config = stages["1"]
    config.data.num_train, config.data.num_eval, config.data.cache_dir = 8, 4, str(tmp_path)
    config.data.hard_count, config.data.hard_givens_min, config.data.hard_climb = 3, 24, 7
    data = data_lib.build_data(config)
    ((n, spec, seed),) = seen
    assert (n, spec.climb_steps, spec.rule, spec.min_guesses, seed) == (3, 7, "fewest", 1, 11)
    assert "hard puzzles 3/3" in capsys.readouterr().out  # progress while generating
    hard = real(3, spec, seed=11, cache_dir=str(tmp_path))  # cached: the same puzzles
    kept = hard["guesses"] <= 9
    np.testing.assert_array_equal(data.train_fixed[8:], hard["puzzles"][kept] != 0)
    assert (hard["fewest_guesses"][kept] >= 1).all()


def test_budget_curve_reports_accuracy_per_band_of_each_rule(tmp_path):
    import importlib.util
    import json

    path = REPO / "experiments" / "sudoku" / "sudoku_budget_curve.py"
    spec = importlib.util.spec_from_file_location("sudoku_budget_curve", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    solved = np.array([True, True, False, True, False])
    passes = np.array([10, 70, 1024, 64, 5])
    fewest = np.array([30, 31, 55, 120, 49])
    out = script.by_guess_band(solved, passes, {"fewest": fewest, "plain": fewest * 10})
    assert out["puzzles_by_fewest_band"] == {"30-49": 3, "50-99": 1, "100+": 1}
    assert out["accuracy_by_fewest_band"] == {"30-49": 2 / 3, "50-99": 0.0, "100+": 1.0}
    assert out["within_64_by_fewest_band"] == {"30-49": 1 / 3, "50-99": 0.0, "100+": 1.0}  # 70 passes > 64
    assert out["puzzles_by_plain_band"] == {"100-999": 4, "1000+": 1}
    rows = [{"solved": bool(s), "passes": int(p), "plain_guesses": int(g) * 10, "fewest_guesses": int(g)}
            for s, p, g in zip(solved, passes, fewest)]
    summary = {"label": "x", "checkpoint_step": 1, "parallel_attempts": 4,
               "accuracy_within_passes": {"64": 0.4, "1024": 0.6}}
    (tmp_path / "x.jsonl").write_text("\n".join(json.dumps(r) for r in [summary, *rows]) + "\n")
    script.plot([str(tmp_path / "x.jsonl")], str(tmp_path / "curve.png"), guess_rule="fewest")
    assert (tmp_path / "curve.png").stat().st_size > 0


# a generated puzzle (20 givens) that needs 1,180 plain-rule guesses and 35 of the fewest rule, uncapped
PAST_THE_CAP = "500027080000800900000003000000005170037040000006000040000000200000000609080960030"


def test_counts_stop_at_the_band_cap_and_the_cache_lives_where_it_is_asked(tmp_path):
    puzzle = _grid(PAST_THE_CAP)[None]
    assert difficulty.guess_counts(puzzle, "plain", cache_dir=None).tolist() == [difficulty.BAND_CAP] == [1000]
    assert str(difficulty.guess_band(difficulty.guess_counts(puzzle, cache_dir=None))[0]) == "1000+"
    assert difficulty.guess_counts(puzzle, "plain", max_guesses=0, cache_dir=None).tolist() == [1180]  # 0: no cap
    assert difficulty.guess_counts(puzzle, "fewest", max_guesses=0, cache_dir=None).tolist() == [35]
    with pytest.raises(ValueError, match="max_solutions >= 1"):
        difficulty.guess_counts(puzzle, max_solutions=0, cache_dir=None)
    with pytest.raises(ValueError, match="max_guesses >= 0"):
        difficulty.guess_counts(puzzle, max_guesses=-1, cache_dir=None)
    nested = tmp_path / "a" / "b"  # created on first use, parents included
    path = difficulty.guess_counts_path(puzzle, "fewest", cache_dir=nested)
    assert path.parent == nested and not nested.exists()
    difficulty.guess_counts(puzzle, "fewest", cache_dir=nested)
    assert path.exists() and np.load(path).tolist() == [35]

