"""tasks/sudoku/lm_eval_requests.py and the hd_sudoku_solve task: a Sudoku run answers lm-eval generation requests
with its solver, the answers are scored by a rules check, and text requests to a Sudoku run fail clearly."""

import jax
import pytest

pytest.importorskip("lm_eval")

from _tiny_sudoku import tiny_sudoku_config

from hackable_diffusion import experiment
from hackable_diffusion.evals import local_tasks
from hackable_diffusion.models import transformer as T
from hackable_diffusion.tasks.sudoku.inference import solve_puzzles
from hackable_diffusion.tasks.sudoku.lm_eval_requests import PuzzleAnswerer


def test_puzzle_text_round_trips_and_ignores_labels():
    docs = local_tasks.sudoku_solve_docs(3, (30, 36), seed=7)
    assert len({d["puzzle"] for d in docs}) == 3
    for doc in docs:
        assert len(doc["puzzle"]) == 81 and 30 <= 81 - doc["puzzle"].count(".") <= 36
        grid = local_tasks.text_to_grid("Puzzle:\n" + doc["puzzle"] + "\nSolution: ")
        assert local_tasks.grid_to_text(grid) == doc["puzzle"]
    with pytest.raises(ValueError, match="81 cells"):
        local_tasks.text_to_grid("12.4")


def test_answers_are_scored_by_the_rules_and_the_givens():
    doc = local_tasks.sudoku_solve_docs(1, (30, 36), seed=7)[0]
    solution = doc["solution"]
    assert local_tasks.sudoku_answer_scores(doc, solution) == {"solved": 1.0, "exact_match": 1.0}
    swapped = solution.translate(str.maketrans("12", "21"))  # still a valid grid, but it breaks the givens
    assert local_tasks.sudoku_answer_scores(doc, swapped) == {"solved": 0.0, "exact_match": 0.0}
    broken = ("1" if solution[0] != "1" else "2") + solution[1:]  # one cell changed: a repeated digit
    assert local_tasks.sudoku_answer_scores(doc, broken)["solved"] == 0.0
    assert local_tasks.sudoku_answer_scores(doc, solution[:40]) == {"solved": 0.0, "exact_match": 0.0}


def test_the_answerer_returns_the_solvers_grids_and_counts_their_passes(tmp_path):
    exp = experiment.build(tiny_sudoku_config("in_place", tmp_path=tmp_path), "unused")
    params = T.init_params(exp.model, jax.random.key(0))
    puzzles = exp.data.eval_puzzles[:3]
    answerer = PuzzleAnswerer(exp, params, seed=0, batch_size=4)
    seen = []
    answers = answerer([local_tasks.grid_to_text(p) for p in puzzles], progress=seen.append)
    direct = solve_puzzles(exp, params, puzzles, seed=0, batch_size=4)
    assert answers == [local_tasks.grid_to_text(g) for g in direct.predictions] and seen == [3]
    assert all(
        a[i] == p[i] for a, p in zip(answers, map(local_tasks.grid_to_text, puzzles)) for i in range(81) if p[i] != "."
    )  # givens kept
    assert answerer.passes == direct.steps.tolist()
    info = answerer.info()
    assert info["puzzles_answered"] == 3 and info["max_forward_passes_per_puzzle"] == int(direct.steps.max())
    with pytest.raises(ValueError, match="hd_sudoku_solve"):
        answerer(["ROMEO: what light"])
