"""Sudoku's canvas (DiffusionGemma) and AR layouts, and the row/column/box embeddings."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion import experiment, recipes
from hackable_diffusion.data import sudoku as sudoku_lib
from hackable_diffusion.data.tokenizers import MASK_ID
from hackable_diffusion.models import presets
from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.models.layers import GridEmbedding
from hackable_diffusion.sampling import views as views_lib


def test_grid_embedding_is_row_plus_column_plus_box_and_periodic():
    module = GridEmbedding(9, 8)
    positions = jnp.arange(162)[None]
    params = module.init(jax.random.key(0), positions)["params"]
    out = module.apply({"params": params}, positions)[0]
    for cell in (0, 10, 40, 80):
        r, c = divmod(cell, 9)
        b = (r // 3) * 3 + c // 3
        expected = params["row"][r] + params["column"][c] + params["box"][b]
        np.testing.assert_allclose(out[cell], expected, rtol=1e-6)
        np.testing.assert_allclose(out[cell + 81], expected, rtol=1e-6)  # the canvas copy of the prompt's cell
    # cells 0 and 20 share box 0 but neither row nor column; cells 0 and 3 share a row, not a box.
    assert not np.allclose(out[0], out[20]) and not np.allclose(out[0], out[3])


def test_grid_embedding_config_checks_and_effect():
    with pytest.raises(ValueError, match="square grid side"):
        TransformerConfig.from_dict(dict(presets.tiny(vocab_size=13, moe=False), grid_embeddings=5))
    base = dict(presets.tiny(vocab_size=13, moe=False), grid_embeddings=9)
    model = T.Transformer(TransformerConfig.from_dict(base))
    params = T.init_params(model, jax.random.key(0))
    assert set(params["grid_embedding"]) == {"row", "column", "box"}
    tokens = jnp.full((1, 81), MASK_ID)
    logits, _ = T.forward(model, params, tokens, causal=False)
    # All-MASK input: without grid embeddings every cell would only differ by RoPE; with them, same-row cells differ.
    zeroed = jax.tree.map(jnp.zeros_like, params["grid_embedding"])
    logits0, _ = T.forward(model, dict(params, grid_embedding=zeroed), tokens, causal=False)
    assert not np.allclose(logits, logits0)


def _tiny(layout, process="masking", tmp_path=None):
    model = dict(presets.tiny(vocab_size=13, moe=False), grid_embeddings=9)
    c = recipes.sudoku_config(model=model, steps=4, batch_size=8, num_train=64, layout=layout, process=process)
    c.data.num_eval = 8
    c.data.givens_min, c.data.givens_max = 30, 40
    c.data.cache_dir = str(tmp_path / "cache")
    c.sampler.num_steps = 5
    return c


@pytest.mark.parametrize("layout,process", [("canvas", "masking"), ("canvas", "uniform"), ("ar", "masking")])
def test_layout_objectives_and_solving(tmp_path, layout, process):
    exp = experiment.build(_tiny(layout, process, tmp_path), "unused")
    assert experiment.sudoku_format(exp.config) == layout
    params = T.init_params(exp.model, jax.random.key(0))
    tokens = jnp.asarray(exp.tokenizer.encode(exp.data.eval_solutions[:4]))
    fixed = jnp.asarray(exp.data.eval_puzzles[:4] != 0)
    loss, metrics = jax.jit(exp.objective)(params, {"tokens": tokens, "fixed": fixed}, jax.random.key(1))
    assert np.isfinite(float(loss)) and float(loss) > 0
    prompt = experiment.sudoku_prompt(tokens, fixed)
    np.testing.assert_array_equal(np.asarray(prompt == MASK_ID), ~np.asarray(fixed))

    puzzles = exp.data.eval_puzzles[:3]
    solved = experiment.solve_sudoku(exp, params, puzzles, seed=0, batch_size=2)
    assert solved.predictions.shape == (3, 81)
    assert ((solved.predictions >= 1) & (solved.predictions <= 9)).all()
    if layout == "ar":
        assert (solved.steps == 82).all()  # the prompt's prefill + 81 decode steps
    else:
        assert sudoku_lib.respects_givens(solved.predictions, puzzles).all()  # givens held in the canvas
        assert (solved.steps >= 2).all() and (solved.steps <= 6).all()  # prefill + <= 5 denoising steps
    again = experiment.solve_sudoku(exp, params, puzzles[:1], seed=0, batch_size=1)
    np.testing.assert_array_equal(again.predictions, solved.predictions[:1])
    elbo = experiment.evaluate_sudoku_elbo(exp, params, num_batches=1, batch_size=4)
    assert np.isfinite(elbo["elbo_bits_per_blank"]) and elbo["elbo_bits_per_blank"] > 0


def test_ar_objective_counts_only_solution_cells(tmp_path):
    exp = experiment.build(_tiny("ar", tmp_path=tmp_path), "unused")
    params = T.init_params(exp.model, jax.random.key(0))
    tokens = jnp.asarray(exp.tokenizer.encode(exp.data.eval_solutions[:2]))
    fixed = jnp.asarray(exp.data.eval_puzzles[:2] != 0)
    _, metrics = exp.objective(params, {"tokens": tokens, "fixed": fixed}, jax.random.key(0))
    seq = jnp.concatenate([experiment.sudoku_prompt(tokens, fixed), tokens], axis=1)
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
        recipes.sudoku_config(layout="sideways")


def test_noise_givens_trains_on_whole_grids_in_place_only(tmp_path):
    c = _tiny("in_place", tmp_path=tmp_path)
    held = experiment.build_sudoku_data(c)
    assert held.train_fixed.any()  # default: the givens are fixed
    c.data.noise_givens = True
    whole = experiment.build_sudoku_data(c)
    assert not whole.train_fixed.any()
    np.testing.assert_array_equal(whole.train_tokens, held.train_tokens)
    bad = _tiny("canvas", tmp_path=tmp_path)
    bad.data.noise_givens = True
    with pytest.raises(ValueError, match="noise_givens"):
        experiment.build_sudoku_data(bad)


def test_generative_perplexity_counts_continuations_only():
    from hackable_diffusion.data.tokenizers import CharTokenizer

    cfg = TransformerConfig.from_dict(presets.tiny(vocab_size=16, moe=False))
    model = T.Transformer(cfg)
    params = T.init_params(model, jax.random.key(3))
    scorer = experiment.Experiment(
        config=None,
        model=model,
        process=None,
        objective=None,
        tokenizer=CharTokenizer(tuple("abcdefghijkl")),
        data=None,
    )
    prompts, conts = [[2, 5, 6], [2, 7]], [[8, 9, 10, 1, 11], [4, 5]]
    out = experiment.generative_perplexity(scorer, params, prompts, conts, batch_size=4)
    nats, count = 0.0, 0
    for p, c in zip(prompts, conts):
        c = c[: c.index(1) + 1] if 1 in c else c  # up to and including EOS
        seq = jnp.asarray([p + c])
        logits, _ = T.forward(model, params, seq, causal=True)
        logp = jax.nn.log_softmax(logits[0, :-1], axis=-1)
        for i in range(len(p), len(p) + len(c)):
            nats -= float(logp[i - 1, seq[0, i]])
            count += 1
    assert out["gen_tokens"] == count == 6
    np.testing.assert_allclose(out["gen_nats_per_token"], nats / count, rtol=1e-5)
    np.testing.assert_allclose(out["gen_ppl"], np.exp(nats / count), rtol=1e-5)
    with pytest.raises(ValueError, match="autoregressive scorer"):
        experiment.generative_perplexity(dataclasses.replace(scorer, process=object()), params, prompts, conts)


def test_repair_rounds_redecode_only_conflicting_rows(tmp_path):
    exp = experiment.build(_tiny("in_place", tmp_path=tmp_path), "unused")
    params = T.init_params(exp.model, jax.random.key(0))  # untrained: its grids break rules
    puzzles = exp.data.eval_puzzles[:6]
    plain = experiment.solve_sudoku(exp, params, puzzles, seed=0, batch_size=4)
    repaired = experiment.solve_sudoku(
        exp, params, puzzles, seed=0, batch_size=4, sampler_overrides={"repair_rounds": 2}
    )
    clean = ~sudoku_lib.conflicting_cells(plain.predictions).any(axis=-1)
    assert not clean.all()  # otherwise the test shows nothing
    np.testing.assert_array_equal(repaired.predictions[clean], plain.predictions[clean])  # final rows untouched
    np.testing.assert_array_equal(repaired.steps[clean], plain.steps[clean])
    assert (repaired.steps[~clean] > plain.steps[~clean]).all()  # extra passes are counted per puzzle
    assert repaired.batch_forward_passes > plain.batch_forward_passes
    assert sudoku_lib.respects_givens(repaired.predictions, puzzles).all()
    # A repaired row keeps every cell that did not conflict, unless a later round re-decided it.
    once = experiment.solve_sudoku(exp, params, puzzles, seed=0, batch_size=4, sampler_overrides={"repair_rounds": 1})
    kept = ~sudoku_lib.conflicting_cells(plain.predictions)
    np.testing.assert_array_equal(once.predictions[kept], plain.predictions[kept])
    units = experiment.solve_sudoku(
        exp, params, puzzles, seed=0, batch_size=4, sampler_overrides={"repair_rounds": 1, "repair_scope": "units"}
    )
    assert sudoku_lib.respects_givens(units.predictions, puzzles).all()
    np.testing.assert_array_equal(units.predictions[clean], plain.predictions[clean])
    with pytest.raises(ValueError, match="repair_scope"):
        experiment.solve_sudoku(exp, params, puzzles, sampler_overrides={"repair_rounds": 1, "repair_scope": "rows"})
    ar = experiment.build(_tiny("ar", tmp_path=tmp_path), "unused")
    with pytest.raises(ValueError, match="repair_rounds"):
        experiment.solve_sudoku(
            ar, T.init_params(ar.model, jax.random.key(0)), puzzles, sampler_overrides={"repair_rounds": 1}
        )


def test_restarts_resolve_only_rule_breaking_rows_and_never_worsen_them(tmp_path):
    exp = experiment.build(_tiny("in_place", tmp_path=tmp_path), "unused")
    params = T.init_params(exp.model, jax.random.key(0))  # untrained: most of its grids break rules
    puzzles = exp.data.eval_puzzles[:6]
    plain = experiment.solve_sudoku(exp, params, puzzles, seed=0, batch_size=4)
    same = experiment.solve_sudoku(exp, params, puzzles, seed=0, batch_size=4, sampler_overrides={"restarts": 0})
    np.testing.assert_array_equal(same.predictions, plain.predictions)
    restarted = experiment.solve_sudoku(
        exp, params, puzzles, seed=0, batch_size=4, sampler_overrides={"restarts": 3, "restart_temperature": 1.0}
    )
    before = sudoku_lib.conflicting_cells(plain.predictions).sum(axis=-1)
    after = sudoku_lib.conflicting_cells(restarted.predictions).sum(axis=-1)
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
    assert sudoku_lib.respects_givens(restarted.predictions, puzzles).all()
    # A row's attempts depend on its own keys only, not on the batch it was solved in.
    one_by_one = experiment.solve_sudoku(
        exp, params, puzzles, seed=0, batch_size=1, sampler_overrides={"restarts": 3, "restart_temperature": 1.0}
    )
    np.testing.assert_array_equal(one_by_one.predictions, restarted.predictions)
    np.testing.assert_array_equal(one_by_one.steps, restarted.steps)
    # With repairs inside every attempt: still never worse than the repaired first attempt, and more passes.
    repaired = experiment.solve_sudoku(
        exp, params, puzzles, seed=0, batch_size=4, sampler_overrides={"repair_rounds": 1}
    )
    both = experiment.solve_sudoku(
        exp, params, puzzles, seed=0, batch_size=4, sampler_overrides={"repair_rounds": 1, "restarts": 2}
    )
    after_repair = sudoku_lib.conflicting_cells(repaired.predictions).sum(axis=-1)
    assert (sudoku_lib.conflicting_cells(both.predictions).sum(axis=-1) <= after_repair).all()
    assert (both.steps[after_repair > 0] > repaired.steps[after_repair > 0]).all()
    # A pass budget of 12 leaves room for one restart of 5 passes after the first 5, not for a third attempt: the
    # rows agree with 1 restart, never exceed 12 passes, and a budget below one attempt is refused.
    overrides = {"restarts": 3, "restart_temperature": 1.0}
    capped = experiment.solve_sudoku(
        exp, params, puzzles, seed=0, batch_size=4, sampler_overrides={**overrides, "pass_budget": 12}
    )
    one = experiment.solve_sudoku(
        exp, params, puzzles, seed=0, batch_size=4, sampler_overrides={**overrides, "restarts": 1}
    )
    np.testing.assert_array_equal(capped.predictions, one.predictions)
    np.testing.assert_array_equal(capped.steps, one.steps)
    assert capped.steps.max() <= 12 and (capped.steps[~clean] == plain.steps[~clean] + 5).all()
    with pytest.raises(ValueError, match="pass_budget"):
        experiment.solve_sudoku(exp, params, puzzles, sampler_overrides={**overrides, "pass_budget": 4})
    # The AR layout restarts too, drawing tokens at restart_temperature instead of greedily.
    ar = experiment.build(_tiny("ar", tmp_path=tmp_path), "unused")
    ar_params = T.init_params(ar.model, jax.random.key(0))
    ar_plain = experiment.solve_sudoku(ar, ar_params, puzzles, seed=0, batch_size=4)
    ar_restarted = experiment.solve_sudoku(
        ar, ar_params, puzzles, seed=0, batch_size=4, sampler_overrides={"restarts": 1}
    )
    redone = sudoku_lib.conflicting_cells(ar_plain.predictions).any(axis=-1)
    assert redone.sum() >= 2
    np.testing.assert_array_equal(ar_restarted.steps[redone], 2 * ar_plain.steps[redone])
    ar_before = sudoku_lib.conflicting_cells(ar_plain.predictions).sum(axis=-1)
    assert (sudoku_lib.conflicting_cells(ar_restarted.predictions).sum(axis=-1) <= ar_before).all()
    hot = experiment.solve_sudoku(
        ar, ar_params, puzzles, seed=0, batch_size=4, sampler_overrides={"ar_temperature": 1.0}
    )
    assert (hot.predictions[redone] != ar_plain.predictions[redone]).any()  # the restart temperature gives new grids
    # Restarts that also shuffle the decision order (Gumbel noise on the margin scores) are no worse either.
    shuffled = experiment.solve_sudoku(
        exp,
        params,
        puzzles,
        seed=0,
        batch_size=4,
        sampler_overrides={"restarts": 2, "restart_selection_kwargs": '{"gumbel_scale": 0.5}'},
    )
    assert (sudoku_lib.conflicting_cells(shuffled.predictions).sum(axis=-1) <= before).all()
    with pytest.raises(ValueError, match="restart_selection_kwargs"):
        experiment.solve_sudoku(
            exp, params, puzzles, sampler_overrides={"restarts": 1, "restart_selection_kwargs": "{"}
        )
    with pytest.raises(ValueError, match="restart_temperature"):
        experiment.solve_sudoku(exp, params, puzzles, sampler_overrides={"restarts": 1, "restart_temperature": 0.0})


def test_grid_relations_match_the_sudoku_units():
    from hackable_diffusion.models.layers import grid_relations

    index = sudoku_lib.structure_indices()
    pos = jnp.arange(162)[None]  # prompt and canvas copies of the 81 cells
    rel = np.asarray(grid_relations(pos, pos, 9))[0]
    assert rel.shape == (3, 162, 162)
    for r, name in enumerate(("row", "col", "box")):
        same = index[name][:, None] == index[name][None, :]
        for qo in (0, 81):
            for ko in (0, 81):
                np.testing.assert_array_equal(rel[r, qo : qo + 81, ko : ko + 81], same)


def test_grid_attention_bias_config_init_and_cached_decode_equals_full_pass():
    with pytest.raises(ValueError, match="grid_attention_bias"):
        TransformerConfig.from_dict(dict(presets.tiny(vocab_size=13, moe=False), grid_attention_bias=1.0))
    with pytest.raises(ValueError, match="grid_attention_bias"):
        TransformerConfig.from_dict(
            dict(presets.tiny(vocab_size=13, moe=False), grid_embeddings=9, grid_attention_bias=-1.0)
        )
    shape = dict(presets.tiny(vocab_size=13, moe=False), grid_embeddings=9, grid_attention_bias=2.0)
    model = T.Transformer(TransformerConfig.from_dict(shape))
    params = T.init_params(model, jax.random.key(0))
    found = [v for p, v in jax.tree_util.tree_flatten_with_path(params)[0] if "grid_bias" in jax.tree_util.keystr(p)]
    assert found, "every attention layer has a grid_bias"
    heads = model.cfg.num_heads
    w = np.asarray(found[0]).reshape(-1, 3, heads)[0]
    for h in range(heads):  # round-robin row, column, box, none
        expected = np.zeros(3)
        if h % 4 < 3:
            expected[h % 4] = 2.0
        np.testing.assert_array_equal(w[:, h], expected)

    # The bias changes the output, and a causal pass over [prompt; canvas] equals prefill + cached canvas decode
    # (the cached keys' positions give their cells).
    tokens = jax.random.randint(jax.random.key(1), (2, 162), 4, 13)
    full, _ = T.forward(model, params, tokens, causal=True)
    zeroed = jax.tree_util.tree_map_with_path(
        lambda p, v: jnp.zeros_like(v) if "grid_bias" in jax.tree_util.keystr(p) else v, params
    )
    full0, _ = T.forward(model, zeroed, tokens, causal=True)
    assert not np.allclose(full, full0)
    cache = init_cache(model.cfg, 2, 162)
    _, cache = T.append(model, params, tokens[:, :81], cache)
    step, _ = T.append(model, params, tokens[:, 81:], cache)
    np.testing.assert_allclose(step, full[:, 81:], atol=2e-4, rtol=2e-4)


def test_grid_symmetries_map_solutions_to_solutions_and_back():
    solution = sudoku_lib.solve(np.zeros(81, np.int8), max_solutions=1).solutions[0][None]  # any complete grid
    puzzle = np.where(np.arange(81) % 3 == 0, solution, 0)
    group = experiment.sudoku_grid_symmetries(5)
    copies = np.asarray(group.to_views(jnp.asarray(np.concatenate([solution, puzzle])))).reshape(5, 2, 81)
    np.testing.assert_array_equal(copies[0], np.concatenate([solution, puzzle]))  # copy 0 is the identity
    assert sudoku_lib.is_valid_solution(copies[:, 0]).all()
    assert all((copies[k, 0] != solution[0]).any() for k in range(1, 5))  # the other copies are new grids
    np.testing.assert_array_equal((copies[:, 1] == 0).sum(axis=-1), np.full(5, (puzzle == 0).sum()))  # blanks stay
    assert sudoku_lib.respects_givens(copies[:, 0], copies[:, 1]).all()  # a copy's solution solves the copied puzzle
    back = views_lib.unrelabel_grids(group, copies)
    np.testing.assert_array_equal(back, np.broadcast_to(np.concatenate([solution, puzzle]), back.shape))


def test_parallel_attempts_keep_the_best_copy_and_count_every_pass(tmp_path):
    exp = experiment.build(_tiny("in_place", tmp_path=tmp_path), "unused")
    params = T.init_params(exp.model, jax.random.key(0))  # untrained: most of its grids break rules
    puzzles = exp.data.eval_puzzles[:6]
    plain = experiment.solve_sudoku(exp, params, puzzles, seed=0, batch_size=4)
    one = experiment.solve_sudoku(
        exp, params, puzzles, seed=0, batch_size=4, sampler_overrides={"parallel_attempts": 1}
    )
    np.testing.assert_array_equal(one.predictions, plain.predictions)
    k = 3
    wide = experiment.solve_sudoku(
        exp, params, puzzles, seed=0, batch_size=4, sampler_overrides={"parallel_attempts": k}
    )
    # By hand: the K copies solved as one set of K x n rows, mapped back, scored by blank + conflicting + broken cells.
    group = experiment.sudoku_grid_symmetries(k)
    by_hand = experiment.solve_sudoku(
        exp, params, np.asarray(group.to_views(jnp.asarray(puzzles))), seed=0, batch_size=4
    )
    grids = views_lib.unrelabel_grids(group, by_hand.predictions.reshape(k, len(puzzles), 81))
    np.testing.assert_array_equal(grids[0], plain.predictions)  # copy 0 is the plain attempt, same keys
    broken = sudoku_lib.conflicting_cells(grids).sum(-1) + (grids == 0).sum(-1)
    best = broken.min(axis=0)
    np.testing.assert_array_equal(sudoku_lib.conflicting_cells(wide.predictions).sum(-1), best)
    assert (best <= broken[0]).all() and (best < broken[0]).any()  # never worse than one attempt, here better
    for i in range(len(puzzles)):
        assert any((wide.predictions[i] == grids[j, i]).all() for j in np.flatnonzero(broken[:, i] == best[i]))
    assert sudoku_lib.respects_givens(wide.predictions, puzzles).all()
    steps = by_hand.steps.reshape(k, len(puzzles))
    np.testing.assert_array_equal(wide.steps, steps.max(axis=0))  # the copies run side by side
    np.testing.assert_array_equal(wide.network_passes, steps.sum(axis=0))
    metrics = experiment.evaluate_sudoku(
        exp, params, puzzles, exp.data.eval_solutions[:6], batch_size=4, sampler_overrides={"parallel_attempts": k}
    )
    assert metrics["network_evaluations_per_puzzle"] == pytest.approx(steps.sum(axis=0).mean())
    with pytest.raises(ValueError, match="parallel_attempts"):
        experiment.solve_sudoku(exp, params, puzzles, sampler_overrides={"parallel_attempts": 0})
