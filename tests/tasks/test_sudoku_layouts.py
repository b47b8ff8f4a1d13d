"""The Sudoku layouts (`tasks/sudoku/layouts.py`, `data.py`): in place, DiffusionGemma's canvas after a prompt, and
autoregressive; their objectives, solving, the ELBO per blank, the layout checks and `noise_givens`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny_sudoku import tiny_sudoku_config as _tiny

from hackable_diffusion import experiment
from hackable_diffusion.data.tokenizers import MASK_ID
from hackable_diffusion.models import transformer as T
from hackable_diffusion.tasks.sudoku import data as sudoku_data
from hackable_diffusion.tasks.sudoku import grids as grid_lib
from hackable_diffusion.tasks.sudoku import layouts
from hackable_diffusion.tasks.sudoku.held_out import evaluate_elbo
from hackable_diffusion.tasks.sudoku.inference import solve_puzzles
from hackable_diffusion.tasks.sudoku.recipes import sudoku_config


@pytest.mark.slow
@pytest.mark.parametrize("layout,process", [("canvas", "masking"), ("canvas", "uniform"), ("ar", "masking")])
def test_layout_objectives_and_solving(tmp_path, layout, process):
    exp = experiment.build(_tiny(layout, process, tmp_path), "unused")
    assert layouts.layout_of(exp.config) == layout
    params = T.init_params(exp.model, jax.random.key(0))
    tokens = jnp.asarray(exp.tokenizer.encode(exp.data.eval_solutions[:4]))
    fixed = jnp.asarray(exp.data.eval_puzzles[:4] != 0)
    loss, metrics = jax.jit(exp.objective)(params, {"tokens": tokens, "fixed": fixed}, jax.random.key(1))
    assert np.isfinite(float(loss)) and float(loss) > 0
    prompt = layouts.puzzle_prompt(tokens, fixed)
    np.testing.assert_array_equal(np.asarray(prompt == MASK_ID), ~np.asarray(fixed))

    puzzles = exp.data.eval_puzzles[:3]
    solved = solve_puzzles(exp, params, puzzles, seed=0, batch_size=2)
    assert solved.predictions.shape == (3, 81)
    assert ((solved.predictions >= 1) & (solved.predictions <= 9)).all()
    if layout == "ar":
        assert (solved.steps == 82).all()  # the prompt's prefill + 81 decode steps
    else:
        assert grid_lib.respects_givens(solved.predictions, puzzles).all()  # givens held in the canvas
        assert (solved.steps >= 2).all() and (solved.steps <= 6).all()  # prefill + <= 5 denoising steps
    again = solve_puzzles(exp, params, puzzles[:1], seed=0, batch_size=1)
    np.testing.assert_array_equal(again.predictions, solved.predictions[:1])
    elbo = evaluate_elbo(exp, params, num_batches=1, batch_size=4)
    assert np.isfinite(elbo["elbo_bits_per_blank"]) and elbo["elbo_bits_per_blank"] > 0


def test_ar_objective_counts_only_solution_cells(tmp_path):
    exp = experiment.build(_tiny("ar", tmp_path=tmp_path), "unused")
    params = T.init_params(exp.model, jax.random.key(0))
    tokens = jnp.asarray(exp.tokenizer.encode(exp.data.eval_solutions[:2]))
    fixed = jnp.asarray(exp.data.eval_puzzles[:2] != 0)
    _, metrics = exp.objective(params, {"tokens": tokens, "fixed": fixed}, jax.random.key(0))
    seq = jnp.concatenate([layouts.puzzle_prompt(tokens, fixed), tokens], axis=1)
    logits, _ = T.forward(exp.model, params, seq, causal=True)
    logp = jax.nn.log_softmax(logits[:, 80:161], axis=-1)
    nll = -jnp.take_along_axis(logp, seq[:, 81:, None], axis=-1).mean()
    np.testing.assert_allclose(float(metrics["ar_loss"]), float(nll), rtol=1e-5)


def test_layout_errors(tmp_path):
    bad = _tiny("canvas", tmp_path=tmp_path)
    bad.diffusion.canvas_len = 64
    with pytest.raises(ValueError, match="canvas_len=81"):
        experiment.build(bad, "unused")
    bad = _tiny("in_place", tmp_path=tmp_path)
    bad.diffusion.process = "uniform"
    with pytest.raises(ValueError, match="objective='sft'"):
        experiment.build(bad, "unused")
    with pytest.raises(ValueError, match="layout"):
        sudoku_config(layout="sideways")


def test_noise_givens_trains_on_whole_grids_in_place_only(tmp_path):
    c = _tiny("in_place", tmp_path=tmp_path)
    held = sudoku_data.build_data(c)
    assert held.train_fixed.any()  # default: the givens are fixed
    c.data.noise_givens = True
    whole = sudoku_data.build_data(c)
    assert not whole.train_fixed.any()
    np.testing.assert_array_equal(whole.train_tokens, held.train_tokens)
    bad = _tiny("canvas", tmp_path=tmp_path)
    bad.data.noise_givens = True
    with pytest.raises(ValueError, match="noise_givens"):
        sudoku_data.build_data(bad)
