"""Sudoku puzzles and metrics (`tasks/sudoku/`: grids, solver, generator, csv_io, vocab, metrics): the exact solver,
the generator and its cached datasets, CSV readers, validity helpers, the token layout, DiffusionGemma's metrics."""

import itertools
import json
import math

import numpy as np
import pytest

from hackable_diffusion.data.text import data_file
from hackable_diffusion.data.tokenizers import MASK_ID
from hackable_diffusion.tasks.sudoku import csv_io, exact_solver, generator
from hackable_diffusion.tasks.sudoku import grids as grid_lib
from hackable_diffusion.tasks.sudoku import metrics as sudoku_metrics
from hackable_diffusion.tasks.sudoku.vocab import FIRST_DIGIT_ID, SudokuVocab

KAGGLE = data_file("kaggle3m_curated_5000.csv")  # ships with the package


@pytest.fixture(scope="module")
def kaggle():
    return csv_io.read_sudoku_csv(KAGGLE, limit=20)


def _rectangle_puzzle(solution):
    """Blanks a 2x2 'deadly rectangle' (two rows of one band, two columns of different stacks, digits a b / b a):
    the result has exactly two solutions, ``solution`` and the one with the four digits swapped."""
    g = solution.reshape(9, 9)
    for r1, r2 in itertools.combinations(range(9), 2):
        if r1 // 3 != r2 // 3:
            continue
        for c1, c2 in itertools.combinations(range(9), 2):
            if c1 // 3 == c2 // 3:
                continue
            if g[r1, c1] == g[r2, c2] and g[r1, c2] == g[r2, c1]:
                puzzle = g.copy()
                other = g.copy()
                for r, c in ((r1, c1), (r1, c2), (r2, c1), (r2, c2)):
                    puzzle[r, c] = 0
                    other[r, c] = g[r1, c1] if g[r, c] == g[r1, c2] else g[r1, c2]
                return puzzle.reshape(81), other.reshape(81)
    return None


def _canonical(grid):
    """Relabels digits so that the first row reads 1..9: equal for grids that are digit permutations of each other."""
    mapping = np.zeros(10, np.int8)
    mapping[grid[:9]] = np.arange(1, 10)
    return mapping[grid]


# ------------------------------------------------------------------------------------------------- solver


def test_solver_finds_known_kaggle_solutions(kaggle):
    assert kaggle["puzzles"].shape == (20, 81)
    for puzzle, solution in zip(kaggle["puzzles"], kaggle["solutions"]):
        result = exact_solver.solve(puzzle)
        assert result.num_solutions == 1
        np.testing.assert_array_equal(result.solutions[0], solution)
        assert result.nodes >= 1 and 0 <= result.guesses < result.nodes
        assert 0.0 <= result.difficulty < 1.0
        assert exact_solver.is_unique(puzzle)


def test_solver_class_separates_singles_from_search(kaggle):
    one_blank = kaggle["solutions"][0].copy()
    one_blank[40] = 0
    empty = np.zeros(81, np.int8)  # many solutions: the search must branch at once
    assert exact_solver.solver_class(np.stack([one_blank, empty])).tolist() == ["singles", "search"]
    # The curated Kaggle puzzles all fall to singles (measured on the file's first 1,000), hard levels included.
    assert set(exact_solver.solver_class(kaggle["puzzles"]).tolist()) == {"singles"}


def test_solver_counts_solutions_of_ambiguous_and_broken_puzzles(kaggle):
    found = [_rectangle_puzzle(s) for s in kaggle["solutions"]]
    found = [f for f in found if f is not None]
    assert found, "no deadly rectangle in the first 20 Kaggle solutions"
    for puzzle, other in found[:3]:
        result = exact_solver.solve(puzzle, max_solutions=10)
        assert result.num_solutions == 2  # exactly two, not capped
        got = {tuple(s) for s in result.solutions}
        assert len(got) == 2 and tuple(other) in got
        assert not exact_solver.is_unique(puzzle)
    empty = np.zeros(81, np.int8)
    assert exact_solver.solve(empty, max_solutions=5).num_solutions == 5
    for s in exact_solver.solve(empty, max_solutions=5).solutions:
        assert grid_lib.is_valid_solution(s)
    conflict = np.zeros(81, np.int8)
    conflict[0] = conflict[1] = 7  # two 7s in row 0
    assert exact_solver.solve(conflict).num_solutions == 0
    # A complete grid minus one cell is solved by a naked single: no guess.
    one_blank = kaggle["solutions"][0].copy()
    one_blank[40] = 0
    result = exact_solver.solve(one_blank)
    assert (result.num_solutions, result.guesses, result.nodes) == (1, 0, 1)


def _all_solutions_slow(puzzle, cap):
    """Plain backtracking reference (candidate sets recomputed from scratch, fewest-candidates cell first)."""
    grid = [int(v) for v in puzzle]
    found = []

    def candidates(c):
        r, k = divmod(c, 9)
        b0 = (r // 3) * 27 + (k // 3) * 3
        seen = {grid[r * 9 + j] for j in range(9)} | {grid[i * 9 + k] for i in range(9)}
        seen |= {grid[b0 + i * 9 + j] for i in range(3) for j in range(3)}
        return [d for d in range(1, 10) if d not in seen]

    def search():
        empty = [c for c in range(81) if grid[c] == 0]
        if not empty:
            found.append(tuple(grid))
            return
        cell = min(empty, key=lambda c: len(candidates(c)))
        for d in candidates(cell):
            grid[cell] = d
            search()
            grid[cell] = 0
            if len(found) >= cap:
                return

    search()
    return found


def test_solver_matches_slow_reference():
    for i, givens in enumerate([28, 30, 33, 36, 40, 45]):
        puzzle, _ = generator.generate_puzzle(np.random.default_rng([21, i]), givens, unique=False)
        slow = _all_solutions_slow(puzzle, cap=30)
        fast = exact_solver.solve(puzzle, max_solutions=30)
        assert fast.num_solutions == len(slow) >= 1
        if len(slow) < 30:  # all solutions enumerated by both: the same set
            assert {tuple(s.tolist()) for s in fast.solutions} == set(slow)
        for s in fast.solutions:
            assert grid_lib.is_valid_solution(s) and grid_lib.respects_givens(s, puzzle)


def test_solver_rejects_bad_input():
    with pytest.raises(ValueError, match="81 cells"):
        exact_solver.solve(np.zeros(80, np.int8))
    with pytest.raises(ValueError, match="0 \\(blank\\) or 1..9"):
        exact_solver.solve(np.full(81, 10))
    with pytest.raises(ValueError, match="max_solutions"):
        exact_solver.solve(np.zeros(81, np.int8), max_solutions=0)


# ------------------------------------------------------------------------------------------------- generator


def test_full_grids_are_valid_and_not_relabellings():
    grids = [generator.random_full_grid(np.random.default_rng([s, 0])) for s in range(6)]
    for g in grids:
        assert g.shape == (81,) and grid_lib.is_valid_solution(g)
    canon = {tuple(_canonical(g)) for g in grids}
    assert len(canon) == len(grids)


@pytest.mark.parametrize("givens", [24, 31, 45])
def test_unique_puzzles_have_requested_givens(givens):
    rng = np.random.default_rng([11, givens])
    puzzle, solution = generator.generate_puzzle(rng, givens, unique=True)
    assert np.count_nonzero(puzzle) == givens
    assert grid_lib.is_valid_solution(solution) and grid_lib.respects_givens(solution, puzzle)
    result = exact_solver.solve(puzzle, max_solutions=2)
    assert result.num_solutions == 1
    np.testing.assert_array_equal(result.solutions[0], solution)


def test_non_unique_puzzles_and_generation_errors():
    puzzle, solution = generator.generate_puzzle(np.random.default_rng(5), 20, unique=False)
    assert np.count_nonzero(puzzle) == 20 and grid_lib.respects_givens(solution, puzzle)
    assert exact_solver.solve(puzzle).num_solutions == 2  # 20 random givens are nowhere near unique
    with pytest.raises(generator.GenerationError, match="17 givens"):
        generator.generate_puzzle(np.random.default_rng(0), 17, unique=True, max_attempts=1)
    with pytest.raises(ValueError, match="givens must be in"):
        generator.generate_puzzle(np.random.default_rng(0), 16, unique=True)


def test_dataset_deterministic_and_independent_of_split(tmp_path, monkeypatch):
    a = generator.generate_dataset(10, (24, 50), seed=3, num_workers=1, cache_dir=None)
    b = generator.generate_dataset(10, (24, 50), seed=3, num_workers=1, cache_dir=None)
    c = generator.generate_dataset(10, (24, 50), seed=4, num_workers=1, cache_dir=None)
    for k in ("puzzles", "solutions", "givens", "target_givens", "guesses"):
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["solutions"], c["solutions"])
    assert a["puzzles"].shape == (10, 81) and a["puzzles"].dtype == np.int8
    np.testing.assert_array_equal(a["givens"], a["target_givens"])
    assert np.all((a["givens"] >= 24) & (a["givens"] <= 50))
    for p, s in zip(a["puzzles"], a["solutions"]):
        assert grid_lib.respects_givens(s, p) and exact_solver.is_unique(p)
    # Puzzle i depends on (seed, i) only: a prefix of a longer dataset, other chunkings and two worker processes.
    longer = generator.generate_dataset(13, (24, 50), seed=3, num_workers=1, cache_dir=None)
    np.testing.assert_array_equal(longer["puzzles"][:10], a["puzzles"])
    monkeypatch.setattr(generator, "_PARALLEL_MIN", 0)
    monkeypatch.setattr(generator, "_CHUNK", 3)
    parallel = generator.generate_dataset(10, (24, 50), seed=3, num_workers=2, cache_dir=tmp_path)
    for k in a:
        np.testing.assert_array_equal(parallel[k], a[k])
    # Second call is served from the cache file.
    (cached_file,) = tmp_path.glob("*.npz")
    assert cached_file == generator.dataset_cache_path(10, (24, 50), 3, True, tmp_path)
    monkeypatch.setattr(generator, "_generate_range", None)
    again = generator.generate_dataset(10, (24, 50), seed=3, cache_dir=tmp_path)
    np.testing.assert_array_equal(again["puzzles"], a["puzzles"])
    assert cached_file.exists()


def test_dataset_non_unique_and_bad_arguments():
    d = generator.generate_dataset(8, (10, 12), seed=1, unique=False, cache_dir=None)
    assert np.all((d["givens"] >= 10) & (d["givens"] <= 12))
    assert all(grid_lib.respects_givens(s, p) for p, s in zip(d["puzzles"], d["solutions"]))
    assert grid_lib.is_valid_solution(d["solutions"]).all()
    with pytest.raises(ValueError, match="low <= high"):
        generator.generate_dataset(4, (30, 20), cache_dir=None)
    with pytest.raises(ValueError, match="for unique puzzles"):
        generator.generate_dataset(4, (10, 20), unique=True, cache_dir=None)
    with pytest.raises(ValueError, match="positive"):
        generator.generate_dataset(0, cache_dir=None)


# ------------------------------------------------------------------------------------------------- CSV readers


def test_csv_reader_layouts(tmp_path, kaggle):
    p0, s0 = kaggle["puzzles"][0], kaggle["solutions"][0]
    p1, s1 = kaggle["puzzles"][1], kaggle["solutions"][1]
    digits = lambda g: "".join(map(str, g))  # noqa: E731
    dots = lambda g: digits(g).replace("0", ".")  # noqa: E731

    bryanpark = tmp_path / "bp.csv"
    bryanpark.write_text(f"quizzes,solutions\n{digits(p0)},{digits(s0)}\n{digits(p1)},{digits(s1)}\n")
    d = csv_io.read_sudoku_csv(bryanpark)
    assert set(d) == {"puzzles", "solutions"}
    np.testing.assert_array_equal(d["puzzles"], np.stack([p0, p1]))
    np.testing.assert_array_equal(d["solutions"], np.stack([s0, s1]))
    assert d["puzzles"].dtype == np.int8

    radcliffe = tmp_path / "rad.csv"
    radcliffe.write_text(
        "puzzle,solution,clues,difficulty,level\n"
        f"{dots(p0)},{digits(s0)},{np.count_nonzero(p0)},0.0,Beginner\n"
        f"{dots(p1)},{digits(s1)},{np.count_nonzero(p1)},4.5,Hard\n"
    )
    d = csv_io.read_sudoku_csv(radcliffe)
    np.testing.assert_array_equal(d["puzzles"], np.stack([p0, p1]))
    assert d["clues"].dtype == np.int64 and d["clues"].tolist() == [np.count_nonzero(p0), np.count_nonzero(p1)]
    assert d["difficulty"].dtype == np.float64 and d["difficulty"].tolist() == [0.0, 4.5]
    assert d["level"].tolist() == ["Beginner", "Hard"]
    assert len(csv_io.read_sudoku_csv(radcliffe, limit=1)["puzzles"]) == 1

    headerless = tmp_path / "plain.csv"
    headerless.write_text(f"{dots(p0)},{digits(s0)}\n\n{digits(p1)},{digits(s1)}\n")
    d = csv_io.read_sudoku_csv(headerless)
    np.testing.assert_array_equal(d["solutions"], np.stack([s0, s1]))

    only_puzzles = tmp_path / "only.csv"
    only_puzzles.write_text(f"puzzle\n{dots(p0)}\n")
    with pytest.raises(ValueError, match="no solution column"):
        csv_io.read_sudoku_csv(only_puzzles)
    np.testing.assert_array_equal(csv_io.read_sudoku_csv(only_puzzles, solve_missing=True)["solutions"][0], s0)


def test_csv_reader_errors(tmp_path, kaggle):
    p0, s0 = ("".join(map(str, g)) for g in (kaggle["puzzles"][0], kaggle["solutions"][0]))
    cases = {
        "short": (f"quizzes,solutions\n{p0},{s0}\n{p0[:-1]},{s0}\n", r"short.csv:3: the puzzle has 80 cells"),
        "letters": (f"quizzes,solutions\n{p0},{s0[:-1]}x\n", r"letters.csv:2: the solution contains \['x'\]"),
        "fields": (f"puzzle,solution\n{p0},{s0},9\n", r"fields.csv:2: expected 2 fields"),
        "invalid": (f"puzzle,solution\n{p0},{s0}\n{p0},{s0[1:]}{s0[0]}\n", r"invalid.csv:3: the solution"),
        "header": ("grid,answer\n1,2\n", r"no puzzle column"),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / f"{name}.csv"
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            csv_io.read_sudoku_csv(path)
    with pytest.raises(ValueError, match="81 characters"):
        csv_io.parse_grid("12")
    np.testing.assert_array_equal(csv_io.parse_grid(" ".join(p0)), kaggle["puzzles"][0])


# ------------------------------------------------------------------------------------------------- helpers


def test_validity_token_and_structure_helpers(kaggle):
    s, p = kaggle["solutions"][0], kaggle["puzzles"][0]
    assert grid_lib.is_valid_solution(s) and grid_lib.is_valid_solution(s.reshape(9, 9))
    swapped = s.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # rows still fine, columns broken
    with_blank = s.copy()
    with_blank[5] = 0
    np.testing.assert_array_equal(grid_lib.is_valid_solution(np.stack([s, swapped, with_blank])), [True, False, False])
    assert grid_lib.respects_givens(s, p) and not grid_lib.respects_givens(s, np.where(p > 0, p % 9 + 1, 0))

    vocab = SudokuVocab()  # the one token layout: digit d -> FIRST_DIGIT_ID + d - 1, blank -> MASK
    tokens = vocab.encode(p)
    digits = set(range(FIRST_DIGIT_ID, FIRST_DIGIT_ID + 9))
    assert tokens.dtype == np.int32 and set(np.unique(tokens)) <= {MASK_ID} | digits
    np.testing.assert_array_equal(tokens == MASK_ID, p == 0)
    np.testing.assert_array_equal(vocab.decode(tokens), p)
    np.testing.assert_array_equal(vocab.decode(np.where(p == 0, 0, tokens)), p)  # any non-digit id reads as a blank
    with pytest.raises(ValueError, match="cells 0"):
        vocab.encode(np.full(81, 10))

    idx = dict(row=grid_lib.ROW_INDEX, col=grid_lib.COL_INDEX, box=grid_lib.BOX_INDEX)
    assert (idx["row"][80], idx["col"][80], idx["box"][80]) == (8, 8, 8)
    assert (idx["row"][30], idx["col"][30], idx["box"][30]) == (3, 3, 4)
    assert np.all(np.bincount(grid_lib.UNITS.ravel(), minlength=81) == 3)
    for unit in grid_lib.UNITS:
        kinds = [len(set(idx[k][unit].tolist())) for k in ("row", "col", "box")]
        assert sorted(kinds) in ([1, 3, 9], [1, 3, 3])  # a row: 1 row, 9 cols, 3 boxes; a box: 3 rows, 3 cols, 1


def _conflicts_slow(grid):
    grid = grid.reshape(9, 9)
    out = np.zeros((9, 9), bool)
    for r in range(9):
        for c in range(9):
            d = grid[r, c]
            if d == 0:
                continue
            for r2 in range(9):
                for c2 in range(9):
                    same_unit = r2 == r or c2 == c or (r2 // 3 == r // 3 and c2 // 3 == c // 3)
                    if (r2, c2) != (r, c) and same_unit and grid[r2, c2] == d:
                        out[r, c] = True
    return out.ravel()


def test_conflicting_cells_match_a_slow_reference(kaggle):
    rng = np.random.default_rng(0)
    s, p = kaggle["solutions"][1], kaggle["puzzles"][1]
    assert not grid_lib.conflicting_cells(s).any() and not grid_lib.conflicting_cells(p).any()
    cases = [s, p]
    for _ in range(20):  # corrupt a few cells of the solution or of the puzzle, blanks included
        g = (s if rng.random() < 0.5 else p).copy()
        cells = rng.choice(81, size=rng.integers(1, 6), replace=False)
        g[cells] = rng.integers(0, 10, size=len(cells))
        cases.append(g)
    cases = np.stack(cases)
    got = grid_lib.conflicting_cells(cases)
    np.testing.assert_array_equal(got, np.stack([_conflicts_slow(g) for g in cases]))
    one = s.copy()
    one[0] = one[1]  # a duplicate in row 0 (and box 0): exactly those two cells plus column 0's holder of that digit
    column_holder = [c for c in range(9, 81, 9) if s[c] == s[1]]
    assert set(np.flatnonzero(grid_lib.conflicting_cells(one))) == {0, 1, *column_holder}
    # whole_units: every cell of row 0, column 0 and box 0 (the units holding a repeat): 9 + 9 + 9 - 1 - 3 - 3 + 1
    units = grid_lib.conflicting_cells(one, whole_units=True)
    want = {c for c in range(81) if c // 9 == 0 or c % 9 == 0 or (c // 27 == 0 and c % 9 < 3)}
    assert set(np.flatnonzero(units)) == want and len(want) == 21


# ------------------------------------------------------------------------------------------------- metrics


def _keep_first(solution, givens):
    puzzle = solution.copy()
    puzzle[givens:] = 0
    return puzzle


def test_metrics_hand_made(kaggle):
    s = kaggle["solutions"][0].astype(np.int64)
    puzzles = np.stack([_keep_first(s, 41), _keep_first(s, 35), _keep_first(s, 25), _keep_first(s, 25)])
    solutions = np.stack([s] * 4)
    pred_medium = s.copy()
    pred_medium[[50, 60]] = pred_medium[[50, 60]] % 9 + 1  # two blanks wrong
    pred_medium[3] = pred_medium[3] % 9 + 1  # one given changed
    predictions = np.stack([s, pred_medium, puzzles[2], s])
    extracted = np.array([True, True, True, False])
    levels = np.array(["b", "a", "b", "a"])
    out = sudoku_metrics.sudoku_metrics(predictions, puzzles, solutions, extracted, levels, "level")
    json.dumps(out, allow_nan=False)

    expected = {
        "accuracy": (1 + 0 + 0 + 0) / 4,
        "cell_accuracy": (40 / 81 + 44 / 81 + 0 + 0) / 4,
        "blank_accuracy": (1 + 44 / 46 + 0 + 0) / 4,
        "exact_mask_accuracy": (1 + 0 + 1 + 0) / 4,
        "partial_mask_accuracy": (1 + 34 / 35 + 1 + 0) / 4,
        "valid_accuracy": (1 + 0 + 0 + 0) / 4,
        "sudoku_count": 4,
        "accuracy_easy": 1.0,
        "cell_accuracy_easy": 40 / 81,
        "sudoku_count_easy": 1,
        "accuracy_medium": 0.0,
        "cell_accuracy_medium": 44 / 81,
        "blank_accuracy_medium": 44 / 46,
        "partial_mask_accuracy_medium": 34 / 35,
        "exact_mask_accuracy_medium": 0.0,
        "sudoku_count_medium": 1,
        "accuracy_hard": 0.0,
        "exact_mask_accuracy_hard": 0.5,  # the copied puzzle keeps its givens; the failed extraction scores 0
        "partial_mask_accuracy_hard": 0.5,
        "cell_accuracy_hard": 0.0,
        "sudoku_count_hard": 2,
        "accuracy_level_b": 0.5,
        "cell_accuracy_level_b": 40 / 81 / 2,
        "exact_mask_accuracy_level_b": 1.0,
        "sudoku_count_level_b": 2,
        "accuracy_level_a": 0.0,
        "partial_mask_accuracy_level_a": 34 / 35 / 2,
        "sudoku_count_level_a": 2,
    }
    for key, value in expected.items():
        assert math.isclose(out[key], value, rel_tol=1e-12), (key, out[key], value)
    n_keys = len(sudoku_metrics.METRIC_NAMES) + 1
    assert len(out) == n_keys * (4 + 2)


def test_metrics_empty_buckets_and_alternative_solutions(kaggle):
    found = next(f for f in map(_rectangle_puzzle, kaggle["solutions"]) if f is not None)
    puzzle, other = found
    solution = kaggle["solutions"][
        [i for i, s in enumerate(kaggle["solutions"]) if grid_lib.respects_givens(s, puzzle)][0]
    ]
    out = sudoku_metrics.sudoku_metrics(other[None], puzzle[None], solution[None])
    assert out["accuracy"] == 0.0 and out["valid_accuracy"] == 1.0  # another solution of an ambiguous puzzle
    assert out["exact_mask_accuracy"] == 1.0 and out["blank_accuracy"] == 0.0
    assert out["sudoku_count_easy"] == 1
    assert out["sudoku_count_medium"] == 0 and out["accuracy_medium"] is None
    assert out["sudoku_count_hard"] == 0 and out["cell_accuracy_hard"] is None
    json.dumps(out, allow_nan=False)
    custom = sudoku_metrics.SudokuAllMetrics(easy_min_givens=81, medium_min_givens=70)(
        other[None], puzzle[None], solution[None]
    )
    assert custom["sudoku_count_medium"] == 1
    with pytest.raises(ValueError, match="same shape"):
        sudoku_metrics.sudoku_metrics(other[None], puzzle[None], np.stack([solution, solution]))
    with pytest.raises(ValueError, match=r"shape \(n, 81\)"):
        sudoku_metrics.sudoku_metrics(other, puzzle, solution)


def test_held_out_sets_keep_one_solver_class_and_files_give_seeded_subsets(tmp_path):
    from hackable_diffusion.tasks.sudoku.data import GeneratedPuzzles, PuzzleFile

    everything = GeneratedPuzzles((22, 26), 16, 9).load(cache_dir=str(tmp_path))
    classes = exact_solver.solver_class(everything["puzzles"])
    assert {"singles", "search"} <= set(classes.tolist())  # the set holds both, so the filter has work to do
    for name in ("singles", "search"):
        kept = GeneratedPuzzles((22, 26), 16, 9, name).load(cache_dir=str(tmp_path))
        np.testing.assert_array_equal(kept["puzzles"], everything["puzzles"][classes == name])
        np.testing.assert_array_equal(kept["solutions"], everything["solutions"][classes == name])
    with pytest.raises(ValueError, match="solver_class"):
        GeneratedPuzzles((22, 26), 16, 9, "hard")
    whole = PuzzleFile("kaggle3m_curated_5000.csv").load()
    subset = PuzzleFile("kaggle3m_curated_5000.csv", 50, 1).load()
    rows = np.sort(np.random.default_rng(1).choice(len(whole["puzzles"]), 50, replace=False))
    np.testing.assert_array_equal(subset["puzzles"], whole["puzzles"][rows])
    np.testing.assert_array_equal(subset["level"], whole["level"][rows])
    assert len(np.unique(subset["level"])) > 1  # drawn across the file's levels, not its first rows
    with pytest.raises(ValueError, match="subset of 6000"):
        PuzzleFile("kaggle3m_curated_5000.csv", 6000).load()
