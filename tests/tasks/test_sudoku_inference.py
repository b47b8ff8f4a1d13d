"""The solver loop (`tasks/sudoku/inference.py`): repairs re-decode only rule-breaking rows, restarts never make a row worse
and respect the pass budget, parallel attempts keep the best copy and count every pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny_sudoku import tiny_sudoku_config as _tiny

from hackable_diffusion import cli, experiment
from hackable_diffusion.models import transformer as T
from hackable_diffusion.tasks.sudoku import grids as grid_lib
from hackable_diffusion.tasks.sudoku.held_out import evaluate_puzzles
from hackable_diffusion.tasks.sudoku.inference import SolverSettings, restart_config, solve_puzzles
from hackable_diffusion.tasks.sudoku.symmetry import grid_symmetries


@pytest.mark.slow
def test_repair_rounds_redecode_only_conflicting_rows(tmp_path):
    exp = experiment.build(_tiny("in_place", tmp_path=tmp_path), "unused")
    params = T.init_params(exp.model, jax.random.key(0))  # untrained: its grids break rules
    puzzles = exp.data.eval_puzzles[:6]
    plain = solve_puzzles(exp, params, puzzles, seed=0, batch_size=4)
    repaired = solve_puzzles(
        exp, params, puzzles, seed=0, batch_size=4, config=cli.override(exp.config, {"solver.repair_rounds": 2})
    )
    clean = ~grid_lib.conflicting_cells(plain.predictions).any(axis=-1)
    assert not clean.all()  # otherwise the test shows nothing
    np.testing.assert_array_equal(repaired.predictions[clean], plain.predictions[clean])  # final rows untouched
    np.testing.assert_array_equal(repaired.steps[clean], plain.steps[clean])
    assert (repaired.steps[~clean] > plain.steps[~clean]).all()  # extra passes are counted per puzzle
    assert repaired.batch_forward_passes > plain.batch_forward_passes
    assert grid_lib.respects_givens(repaired.predictions, puzzles).all()
    # A repaired row keeps every cell that did not conflict, unless a later round re-decided it.
    once = solve_puzzles(
        exp, params, puzzles, seed=0, batch_size=4, config=cli.override(exp.config, {"solver.repair_rounds": 1})
    )
    kept = ~grid_lib.conflicting_cells(plain.predictions)
    np.testing.assert_array_equal(once.predictions[kept], plain.predictions[kept])
    units = solve_puzzles(
        exp,
        params,
        puzzles,
        seed=0,
        batch_size=4,
        config=cli.override(exp.config, {"solver.repair_rounds": 1, "solver.repair_scope": "units"}),
    )
    assert grid_lib.respects_givens(units.predictions, puzzles).all()
    np.testing.assert_array_equal(units.predictions[clean], plain.predictions[clean])
    with pytest.raises(ValueError, match="repair_scope"):
        solve_puzzles(
            exp,
            params,
            puzzles,
            config=cli.override(exp.config, {"solver.repair_rounds": 1, "solver.repair_scope": "rows"}),
        )
    ar = experiment.build(_tiny("ar", tmp_path=tmp_path), "unused")
    with pytest.raises(ValueError, match="repair_rounds"):
        solve_puzzles(
            ar,
            T.init_params(ar.model, jax.random.key(0)),
            puzzles,
            config=cli.override(ar.config, {"solver.repair_rounds": 1}),
        )


@pytest.mark.slow
def test_restarts_resolve_only_rule_breaking_rows_and_never_worsen_them(tmp_path):
    exp = experiment.build(_tiny("in_place", tmp_path=tmp_path), "unused")
    params = T.init_params(exp.model, jax.random.key(0))  # untrained: most of its grids break rules
    puzzles = exp.data.eval_puzzles[:6]
    plain = solve_puzzles(exp, params, puzzles, seed=0, batch_size=4)
    same = solve_puzzles(
        exp, params, puzzles, seed=0, batch_size=4, config=cli.override(exp.config, {"solver.restarts": 0})
    )
    np.testing.assert_array_equal(same.predictions, plain.predictions)
    restarted = solve_puzzles(
        exp,
        params,
        puzzles,
        seed=0,
        batch_size=4,
        config=cli.override(exp.config, {"solver.restarts": 3, "solver.restart_temperature": 1.0}),
    )
    before = grid_lib.conflicting_cells(plain.predictions).sum(axis=-1)
    after = grid_lib.conflicting_cells(restarted.predictions).sum(axis=-1)
    clean = before == 0
    assert (~clean).sum() >= 2
    np.testing.assert_array_equal(restarted.predictions[clean], plain.predictions[clean])
    np.testing.assert_array_equal(restarted.steps[clean], plain.steps[clean])
    assert (after <= before).all() and (after < before).any()  # kept only when it breaks fewer rules
    changed = (restarted.predictions != plain.predictions).any(axis=-1)
    assert not (changed & (after == before)).any()  # an attempt that is no better is not kept
    # Every restart of a row that still breaks a rule costs a full decode: 3 restarts at 5 passes each.
    still_bad = after > 0
    np.testing.assert_array_equal(restarted.steps[still_bad], plain.steps[still_bad] + 3 * 5)
    assert grid_lib.respects_givens(restarted.predictions, puzzles).all()
    # A row's attempts depend on its own keys only, not on the batch it was solved in.
    one_by_one = solve_puzzles(
        exp,
        params,
        puzzles,
        seed=0,
        batch_size=1,
        config=cli.override(exp.config, {"solver.restarts": 3, "solver.restart_temperature": 1.0}),
    )
    np.testing.assert_array_equal(one_by_one.predictions, restarted.predictions)
    np.testing.assert_array_equal(one_by_one.steps, restarted.steps)
    # With repairs inside every attempt: still never worse than the repaired first attempt, and more passes.
    repaired = solve_puzzles(
        exp, params, puzzles, seed=0, batch_size=4, config=cli.override(exp.config, {"solver.repair_rounds": 1})
    )
    both = solve_puzzles(
        exp,
        params,
        puzzles,
        seed=0,
        batch_size=4,
        config=cli.override(exp.config, {"solver.repair_rounds": 1, "solver.restarts": 2}),
    )
    after_repair = grid_lib.conflicting_cells(repaired.predictions).sum(axis=-1)
    assert (grid_lib.conflicting_cells(both.predictions).sum(axis=-1) <= after_repair).all()
    assert (both.steps[after_repair > 0] > repaired.steps[after_repair > 0]).all()
    # A pass budget of 12 leaves room for one restart of 5 passes after the first 5, not for a third attempt: the
    # rows agree with 1 restart, never exceed 12 passes, and a budget below one attempt is refused.
    overrides = {"solver.restarts": 3, "solver.restart_temperature": 1.0}
    capped = solve_puzzles(
        exp,
        params,
        puzzles,
        seed=0,
        batch_size=4,
        config=cli.override(exp.config, {**overrides, "solver.pass_budget": 12}),
    )
    one = solve_puzzles(
        exp, params, puzzles, seed=0, batch_size=4, config=cli.override(exp.config, {**overrides, "solver.restarts": 1})
    )
    np.testing.assert_array_equal(capped.predictions, one.predictions)
    np.testing.assert_array_equal(capped.steps, one.steps)
    assert capped.steps.max() <= 12 and (capped.steps[~clean] == plain.steps[~clean] + 5).all()
    with pytest.raises(ValueError, match="pass_budget"):
        solve_puzzles(exp, params, puzzles, config=cli.override(exp.config, {**overrides, "solver.pass_budget": 4}))
    # The AR layout restarts too, drawing tokens at restart_temperature instead of greedily.
    ar = experiment.build(_tiny("ar", tmp_path=tmp_path), "unused")
    ar_params = T.init_params(ar.model, jax.random.key(0))
    ar_plain = solve_puzzles(ar, ar_params, puzzles, seed=0, batch_size=4)
    ar_restarted = solve_puzzles(
        ar, ar_params, puzzles, seed=0, batch_size=4, config=cli.override(ar.config, {"solver.restarts": 1})
    )
    redone = grid_lib.conflicting_cells(ar_plain.predictions).any(axis=-1)
    assert redone.sum() >= 2
    np.testing.assert_array_equal(ar_restarted.steps[redone], 2 * ar_plain.steps[redone])
    ar_before = grid_lib.conflicting_cells(ar_plain.predictions).sum(axis=-1)
    assert (grid_lib.conflicting_cells(ar_restarted.predictions).sum(axis=-1) <= ar_before).all()
    hot = solve_puzzles(
        ar, ar_params, puzzles, seed=0, batch_size=4, config=cli.override(ar.config, {"sampler.ar_temperature": 1.0})
    )
    assert (hot.predictions[redone] != ar_plain.predictions[redone]).any()  # the restart temperature gives new grids
    # Restarts that also shuffle the decision order (Gumbel noise on the margin scores) are no worse either.
    shuffled = solve_puzzles(
        exp,
        params,
        puzzles,
        seed=0,
        batch_size=4,
        config=cli.override(exp.config, {"solver.restarts": 2, "solver.restart_gumbel_scale": 0.5}),
    )
    assert (grid_lib.conflicting_cells(shuffled.predictions).sum(axis=-1) <= before).all()
    noisy = restart_config(exp.config, SolverSettings(restarts=2, restart_gumbel_scale=0.5))
    assert noisy.sampler.selection.gumbel_scale == 0.5 and noisy.sampler.max_temperature == 1.0
    assert restart_config(exp.config, SolverSettings(restarts=2)).sampler.selection.gumbel_scale is None
    with pytest.raises(ValueError, match="restart_gumbel_scale"):
        solve_puzzles(exp, params, puzzles, config=cli.override(exp.config, {"solver.restart_gumbel_scale": -1.0}))
    with pytest.raises(ValueError, match="restart_temperature"):
        solve_puzzles(
            exp,
            params,
            puzzles,
            config=cli.override(exp.config, {"solver.restarts": 1, "solver.restart_temperature": 0.0}),
        )


@pytest.mark.slow
def test_parallel_attempts_keep_the_best_copy_and_count_every_pass(tmp_path):
    exp = experiment.build(_tiny("in_place", tmp_path=tmp_path), "unused")
    params = T.init_params(exp.model, jax.random.key(0))  # untrained: most of its grids break rules
    puzzles = exp.data.eval_puzzles[:6]
    plain = solve_puzzles(exp, params, puzzles, seed=0, batch_size=4)
    one = solve_puzzles(
        exp, params, puzzles, seed=0, batch_size=4, config=cli.override(exp.config, {"solver.parallel_attempts": 1})
    )
    np.testing.assert_array_equal(one.predictions, plain.predictions)
    k = 3
    wide = solve_puzzles(
        exp, params, puzzles, seed=0, batch_size=4, config=cli.override(exp.config, {"solver.parallel_attempts": k})
    )
    # By hand: the K copies solved as one set of K x n rows, mapped back, scored by blank + conflicting + broken cells.
    group = grid_symmetries(k)
    by_hand = solve_puzzles(exp, params, np.asarray(group.to_views(jnp.asarray(puzzles))), seed=0, batch_size=4)
    grids = group.restore(by_hand.predictions.reshape(k, len(puzzles), 81))
    np.testing.assert_array_equal(grids[0], plain.predictions)  # copy 0 is the plain attempt, same keys
    broken = grid_lib.conflicting_cells(grids).sum(-1) + (grids == 0).sum(-1)
    best = broken.min(axis=0)
    np.testing.assert_array_equal(grid_lib.conflicting_cells(wide.predictions).sum(-1), best)
    assert (best <= broken[0]).all() and (best < broken[0]).any()  # never worse than one attempt, here better
    for i in range(len(puzzles)):
        assert any((wide.predictions[i] == grids[j, i]).all() for j in np.flatnonzero(broken[:, i] == best[i]))
    assert grid_lib.respects_givens(wide.predictions, puzzles).all()
    steps = by_hand.steps.reshape(k, len(puzzles))
    np.testing.assert_array_equal(wide.steps, steps.max(axis=0))  # the copies run side by side
    np.testing.assert_array_equal(wide.network_passes, steps.sum(axis=0))
    metrics = evaluate_puzzles(
        exp,
        params,
        puzzles,
        exp.data.eval_solutions[:6],
        batch_size=4,
        config=cli.override(exp.config, {"solver.parallel_attempts": k}),
    )
    assert metrics["network_evaluations_per_puzzle"] == pytest.approx(steps.sum(axis=0).mean())
    with pytest.raises(ValueError, match="parallel_attempts"):
        solve_puzzles(exp, params, puzzles, config=cli.override(exp.config, {"solver.parallel_attempts": 0}))
