"""Symmetry views (sampling/views.py): the Sudoku group, mapping logits back, and the sampler path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion import experiment, recipes
from hackable_diffusion.data import sudoku as sudoku_lib
from hackable_diffusion.data.tokenizers import MASK_ID
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.sampling.canvas import denoise_canvas
from hackable_diffusion.sampling.views import PermutationViews, make_views, sudoku_views


def _grids(n=3, seed=5):
    return sudoku_lib.generate_dataset(n, (30, 36), seed=seed, cache_dir=None, unique=True)


def test_sudoku_views_map_solutions_to_solutions_and_puzzles_to_puzzles():
    data = _grids()
    views = sudoku_views(6, seed=1)
    assert views.positions[0] == tuple(range(81)) and views.tokens[0] == tuple(range(13))
    assert sudoku_views(6, seed=1) == views and sudoku_views(6, seed=2) != views  # deterministic in the seed
    for key in ("solutions", "puzzles"):
        tokens = jnp.asarray(np.where(data[key] == 0, MASK_ID, data[key] + 3))
        out = np.asarray(views.to_views(tokens)).reshape(6, len(tokens), 81)
        digits = np.where((out >= 4) & (out <= 12), out - 3, 0)
        for k in range(6):
            assert (sudoku_lib.conflicting_cells(digits[k]).sum(axis=-1) == 0).all()  # still a valid (partial) grid
            assert ((digits[k] == 0) == (data[key][:, np.asarray(views.positions[k])] == 0)).all()  # blanks move along
    # A view's solution is the view of the solution: solving the relabelled puzzle gives the relabelled answer.
    solved = sudoku_lib.solve(digits[3][0]).solutions[0]
    view_of_solution = np.asarray(views.to_views(jnp.asarray(data["solutions"][:1] + 3))).reshape(6, 81)[3] - 3
    np.testing.assert_array_equal(solved, view_of_solution)


def test_from_views_equals_a_brute_force_loop():
    rng = np.random.default_rng(0)
    views = sudoku_views(4, seed=7)
    canvas = jnp.asarray(rng.integers(3, 13, size=(2, 81)), jnp.int32)
    weights = jnp.asarray(rng.normal(size=(81, 13, 13)), jnp.float32)  # position-dependent: not equivariant

    def logits_fn(c):
        return jnp.einsum("bcv,cvw->bcw", jax.nn.one_hot(c, 13), weights)

    got = np.asarray(views(logits_fn, canvas))
    expected = np.zeros((2, 81, 13))
    for positions, tokens in zip(views.positions, views.tokens):
        for row in range(2):
            view = np.array([tokens[int(canvas[row, positions[i]])] for i in range(81)])
            lp = np.asarray(jax.nn.log_softmax(logits_fn(jnp.asarray(view[None]))[0], axis=-1))
            for i in range(81):  # view position i shows original cell positions[i]; view id tokens[t] is token t
                expected[row, positions[i]] += lp[i, list(tokens)] / views.num_views
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # An equivariant denoiser (it copies its input) is left as it is by the averaging.
    copy = np.asarray(views(lambda c: 5.0 * jax.nn.one_hot(c, 13), canvas))
    np.testing.assert_allclose(copy, np.asarray(jax.nn.log_softmax(5.0 * jax.nn.one_hot(canvas, 13))), atol=1e-5)


def test_bad_views_are_rejected():
    with pytest.raises(ValueError, match="not a permutation"):
        PermutationViews(((0, 0, 1),), ((0, 1),))
    with pytest.raises(ValueError, match="as many"):
        PermutationViews(((0, 1),), ())
    with pytest.raises(ValueError, match="unknown views"):
        make_views("chess:4")
    assert make_views("") is None and make_views("sudoku:3").num_views == 3
    with pytest.raises(ValueError, match="81 cells"):
        sudoku_views(2).to_views(jnp.zeros((1, 64), jnp.int32))


def test_sampler_with_views(tmp_path):
    model = dict(presets.tiny(vocab_size=13, moe=False), grid_embeddings=9)
    c = recipes.sudoku_config(model=model, steps=4, batch_size=8, num_train=64)
    c.data.num_eval, c.data.cache_dir = 8, str(tmp_path / "cache")
    c.sampler.num_steps = 6
    exp = experiment.build(c, "unused")
    params = T.init_params(exp.model, jax.random.key(0))  # untrained: its views disagree
    puzzles = _grids(4, seed=9)["puzzles"]
    plain = experiment.solve_sudoku(exp, params, puzzles, seed=0, batch_size=4)
    # One view (the identity) is the plain sampler: log-probabilities and logits give the same steps.
    one = experiment.solve_sudoku(exp, params, puzzles, seed=0, batch_size=4, sampler_overrides={"views": "sudoku:1"})
    np.testing.assert_array_equal(one.predictions, plain.predictions)
    # Two copies of the identity through the batched path (tiled cache, view-major rows) change nothing either.
    sampler = experiment.build_sampler(exp.config, exp.process, canvas_length=81, forbidden_tokens=(0, 1, 2, 3))
    tokens = jnp.asarray(exp.tokenizer.encode(puzzles))
    fixed = jnp.asarray(puzzles != 0)
    keys = jax.random.split(jax.random.key(1), 4)
    doubled = PermutationViews((tuple(range(81)),) * 2, (tuple(range(13)),) * 2)

    def run(s):
        canvas = s.initial_canvas(keys, 4, fixed=fixed, fixed_tokens=tokens)
        return denoise_canvas(exp.model, params, init_cache(exp.model.cfg, 4, 1), canvas, keys, sampler=s, fixed=fixed)

    np.testing.assert_array_equal(run(sampler).canvas, run(sampler.replace(views=doubled)).canvas)
    # Real views change the untrained model's answers, keep the givens, and count K network evaluations per pass.
    metrics = experiment.evaluate_sudoku(
        exp, params, puzzles, _grids(4, seed=9)["solutions"], sampler_overrides={"views": "sudoku:4"}
    )
    assert metrics["givens_kept"]
    assert metrics["network_evaluations_per_puzzle"] == pytest.approx(4 * metrics["forward_passes_per_puzzle"])
    viewed = experiment.solve_sudoku(
        exp, params, puzzles, seed=0, batch_size=4, sampler_overrides={"views": "sudoku:4"}
    )
    assert (viewed.predictions != plain.predictions).any()
    ar = experiment.build(
        recipes.sudoku_config(model=model, steps=4, batch_size=8, num_train=64, layout="ar"), "unused"
    )
    with pytest.raises(ValueError, match="in-place layout"):
        experiment.solve_sudoku(
            ar, T.init_params(ar.model, jax.random.key(0)), puzzles, sampler_overrides={"views": "sudoku:2"}
        )
