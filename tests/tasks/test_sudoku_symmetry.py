"""The Sudoku symmetry group (`tasks/sudoku/symmetry.py`) and the solver's symmetry views: the group maps solutions to
solutions, one identity view is the plain sampler, real views change an untrained model's answers and count K network
evaluations per pass, and the views need the in-place layout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion import cli, experiment
from hackable_diffusion.data.tokenizers import MASK_ID
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.sampling.canvas import denoise_canvas
from hackable_diffusion.sampling.views import PermutationViews
from hackable_diffusion.tasks.sudoku import generator
from hackable_diffusion.tasks.sudoku.exact_solver import solve
from hackable_diffusion.tasks.sudoku.grids import conflicting_cells, is_valid_solution, respects_givens
from hackable_diffusion.tasks.sudoku.held_out import evaluate_puzzles
from hackable_diffusion.tasks.sudoku.inference import SolverSettings, puzzle_sampler, solve_puzzles
from hackable_diffusion.tasks.sudoku.recipes import sudoku_config
from hackable_diffusion.tasks.sudoku.structure import grid_prior
from hackable_diffusion.tasks.sudoku.symmetry import grid_symmetries, symmetry_views
from hackable_diffusion.tasks.sudoku.vocab import FIRST_DIGIT_ID, VOCAB_SIZE


def _grids(n=3, seed=5):
    return generator.generate_dataset(n, (30, 36), seed=seed, cache_dir=None, unique=True)


def test_symmetry_views_map_solutions_to_solutions_and_puzzles_to_puzzles():
    data = _grids()
    views = symmetry_views(6, seed=1)
    assert views.positions[0] == tuple(range(81)) and views.tokens[0] == tuple(range(VOCAB_SIZE))
    assert symmetry_views(6, seed=1) == views and symmetry_views(6, seed=2) != views  # deterministic in the seed
    offset = FIRST_DIGIT_ID - 1
    for key in ("solutions", "puzzles"):
        tokens = jnp.asarray(np.where(data[key] == 0, MASK_ID, data[key] + offset))
        out = np.asarray(views.to_views(tokens)).reshape(6, len(tokens), 81)
        digits = np.where((out >= FIRST_DIGIT_ID) & (out <= FIRST_DIGIT_ID + 8), out - offset, 0)
        for k in range(6):
            assert (conflicting_cells(digits[k]).sum(axis=-1) == 0).all()  # still a valid (partial) grid
            assert ((digits[k] == 0) == (data[key][:, np.asarray(views.positions[k])] == 0)).all()  # blanks move along
    # A view's solution is the view of the solution: solving the relabelled puzzle gives the relabelled answer.
    solved = solve(digits[3][0]).solutions[0]
    view_of_solution = (
        np.asarray(views.to_views(jnp.asarray(data["solutions"][:1] + offset))).reshape(6, 81)[3] - offset
    )
    np.testing.assert_array_equal(solved, view_of_solution)


@pytest.mark.slow
def test_solver_with_views(tmp_path):
    model = dict(presets.tiny(vocab_size=13, moe=False), **grid_prior(9))
    c = sudoku_config(model=model, steps=4, batch_size=8, num_train=64)
    c.data.num_eval, c.data.cache_dir = 8, str(tmp_path / "cache")
    c.sampler.num_steps = 6
    exp = experiment.build(c, "unused")
    params = T.init_params(exp.model, jax.random.key(0))  # untrained: its views disagree
    puzzles = _grids(4, seed=9)["puzzles"]
    plain = solve_puzzles(exp, params, puzzles, seed=0, batch_size=4)
    sampler = puzzle_sampler(exp.config, exp.process, SolverSettings())
    assert sampler.views is None and sampler.constraint is None
    tokens = jnp.asarray(exp.tokenizer.encode(puzzles))
    fixed = jnp.asarray(puzzles != 0)
    keys = jax.random.split(jax.random.key(1), 4)

    def run(s):
        canvas = s.initial_canvas(keys, 4, fixed=fixed, fixed_tokens=tokens)
        return denoise_canvas(exp.model, params, init_cache(exp.model.cfg, 4, 1), canvas, keys, sampler=s, fixed=fixed)

    # One view (the identity) is the plain sampler: log-probabilities and logits give the same steps; two copies of
    # the identity through the batched path (tiled cache, view-major rows) change nothing either.
    reference = run(sampler).canvas
    np.testing.assert_array_equal(reference, run(sampler.replace(views=symmetry_views(1))).canvas)
    doubled = PermutationViews((tuple(range(81)),) * 2, (tuple(range(13)),) * 2)
    np.testing.assert_array_equal(reference, run(sampler.replace(views=doubled)).canvas)
    # Real views change the untrained model's answers, keep the givens, and count K network evaluations per pass.
    four = cli.override(exp.config, {"solver.views": 4})
    assert puzzle_sampler(four, exp.process, SolverSettings.from_config(four)).views == symmetry_views(4)
    metrics = evaluate_puzzles(exp, params, puzzles, _grids(4, seed=9)["solutions"], config=four)
    assert metrics["givens_kept"]
    assert metrics["network_evaluations_per_puzzle"] == pytest.approx(4 * metrics["forward_passes_per_puzzle"])
    viewed = solve_puzzles(exp, params, puzzles, seed=0, batch_size=4, config=four)
    assert (viewed.predictions != plain.predictions).any()
    ar = experiment.build(sudoku_config(model=model, steps=4, batch_size=8, num_train=64, layout="ar"), "unused")
    with pytest.raises(ValueError, match="in-place layout"):
        solve_puzzles(
            ar, T.init_params(ar.model, jax.random.key(0)), puzzles, config=cli.override(ar.config, {"solver.views": 2})
        )
    with pytest.raises(ValueError, match="views=0 must be >= 1"):
        SolverSettings(views=0)


def test_grid_symmetries_map_solutions_to_solutions_and_back():
    solution = solve(np.zeros(81, np.int8), max_solutions=1).solutions[0][None]  # any complete grid
    puzzle = np.where(np.arange(81) % 3 == 0, solution, 0)
    group = grid_symmetries(5)
    copies = np.asarray(group.to_views(jnp.asarray(np.concatenate([solution, puzzle])))).reshape(5, 2, 81)
    np.testing.assert_array_equal(copies[0], np.concatenate([solution, puzzle]))  # copy 0 is the identity
    assert is_valid_solution(copies[:, 0]).all()
    assert all((copies[k, 0] != solution[0]).any() for k in range(1, 5))  # the other copies are new grids
    np.testing.assert_array_equal((copies[:, 1] == 0).sum(axis=-1), np.full(5, (puzzle == 0).sum()))  # blanks stay
    assert respects_givens(copies[:, 0], copies[:, 1]).all()  # a copy's solution solves the copied puzzle
    back = group.restore(copies)
    np.testing.assert_array_equal(back, np.broadcast_to(np.concatenate([solution, puzzle]), back.shape))


def test_symmetry_augmentation_keeps_solutions_and_their_givens_and_restores_its_state():
    from hackable_diffusion.tasks.sudoku import data as sudoku_data
    from hackable_diffusion.tasks.sudoku.vocab import SudokuVocab

    data = _grids(n=8, seed=9)
    vocab = SudokuVocab()
    tokens, fixed = vocab.encode(data["solutions"]), data["puzzles"] != 0
    plain = sudoku_data.make_train_iterator(tokens, fixed, 4, seed=3)
    augmented = sudoku_data.make_train_iterator(tokens, fixed, 4, seed=3, augment_symmetry=True)
    offset = FIRST_DIGIT_ID - 1
    state = augmented.get_state()
    batches = []
    for _ in range(5):  # crosses an epoch boundary (8 rows / 4)
        source, batch = next(plain), next(augmented)
        batches.append(batch)
        assert not (batch["tokens"] == source["tokens"]).all(axis=1).any()  # every row moved
        grids = batch["tokens"] - offset
        assert is_valid_solution(grids).all()
        puzzles = np.where(batch["fixed"], grids, 0)
        np.testing.assert_array_equal(batch["fixed"].sum(1), source["fixed"].sum(1))  # same number of givens
        for puzzle, solution in zip(puzzles, grids):  # the moved givens still have one solution: the moved grid
            found = solve(puzzle.astype(np.int8), max_solutions=2).solutions
            assert len(found) == 1 and (found[0] == solution).all()
    augmented.set_state(state)
    for batch in batches:  # draws depend on the seed and the position, so a resumed run sees the same rows
        again = next(augmented)
        np.testing.assert_array_equal(again["tokens"], batch["tokens"])
        np.testing.assert_array_equal(again["fixed"], batch["fixed"])
    other = next(sudoku_data.make_train_iterator(tokens, fixed, 4, seed=3, augment_symmetry=True))
    np.testing.assert_array_equal(other["tokens"], batches[0]["tokens"])  # deterministic in the seed
