"""Symmetry views (`sampling/views.py`): mapping logits back equals a brute-force loop, `restore` inverts `to_views`,
bad views are refused. The views here are the Sudoku group's (`tasks/sudoku/symmetry.py`), a real non-trivial one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion.sampling.views import PermutationViews
from hackable_diffusion.tasks.sudoku.symmetry import symmetry_views


def test_from_views_equals_a_brute_force_loop():
    rng = np.random.default_rng(0)
    views = symmetry_views(4, seed=7)
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


def test_restore_inverts_to_views():
    rng = np.random.default_rng(3)
    views = symmetry_views(5, seed=2)
    canvas = rng.integers(0, 13, size=(3, 81)).astype(np.int32)
    copies = np.asarray(views.to_views(jnp.asarray(canvas))).reshape(5, 3, 81)
    np.testing.assert_array_equal(views.restore(copies), np.broadcast_to(canvas, (5, 3, 81)))
    assert not (copies[1] == canvas).all()  # a non-identity view does move the canvas
    with pytest.raises(ValueError, match=r"expected \(5, b, 81\)"):
        views.restore(copies[:2])


def test_bad_views_are_rejected():
    with pytest.raises(ValueError, match="not a permutation"):
        PermutationViews(((0, 0, 1),), ((0, 1),))
    with pytest.raises(ValueError, match="as many"):
        PermutationViews(((0, 1),), ())
    with pytest.raises(ValueError, match="the views permute 81 positions"):
        symmetry_views(2).to_views(jnp.zeros((1, 64), jnp.int32))
    with pytest.raises(ValueError, match="relabel a vocabulary of 13"):
        symmetry_views(2).from_views(jnp.zeros((2, 81, 20)))
