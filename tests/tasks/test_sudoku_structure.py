"""The Sudoku grid as the backbone's structure prior (`tasks/sudoku/structure.py` through the hook of
`models/structure.py`): row + column + box input embeddings, same-row/column/box relations, the learned attention
bias, whose cached decode equals a full pass; the config checks, and runs saved with the old grid fields."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion.data.tokenizers import MASK_ID
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.models.structure import StructureEmbedding, shared_units
from hackable_diffusion.tasks.sudoku.structure import GridStructure, grid_prior


def test_grid_embedding_is_row_plus_column_plus_box_and_periodic():
    module = StructureEmbedding(GridStructure(9), 8)
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


@pytest.mark.slow
def test_grid_embedding_config_checks_and_effect():
    with pytest.raises(ValueError, match="must be a square"):
        TransformerConfig.from_dict(dict(presets.tiny(vocab_size=13, moe=False), **grid_prior(5)))
    with pytest.raises(ValueError, match="needs the grid side"):
        TransformerConfig.from_dict(dict(presets.tiny(vocab_size=13, moe=False), structure="grid:nine"))
    with pytest.raises(ValueError, match="no structure 'hexgrid' is registered"):
        TransformerConfig.from_dict(dict(presets.tiny(vocab_size=13, moe=False), structure="hexgrid:9"))
    base = dict(presets.tiny(vocab_size=13, moe=False), **grid_prior(9))
    model = T.Transformer(TransformerConfig.from_dict(base))
    params = T.init_params(model, jax.random.key(0))
    assert set(params["grid_embedding"]) == {"row", "column", "box"}
    tokens = jnp.full((1, 81), MASK_ID)
    logits, _ = T.forward(model, params, tokens, causal=False)
    # All-MASK input: without grid embeddings every cell would only differ by RoPE; with them, same-row cells differ.
    zeroed = jax.tree.map(jnp.zeros_like, params["grid_embedding"])
    logits0, _ = T.forward(model, dict(params, grid_embedding=zeroed), tokens, causal=False)
    assert not np.allclose(logits, logits0)


def test_grid_relations_match_rows_columns_and_boxes():
    cells = np.arange(81)
    index = {"row": cells // 9, "col": cells % 9, "box": cells // 27 * 3 + cells % 9 // 3}
    pos = jnp.arange(162)[None]  # prompt and canvas copies of the 81 cells
    rel = np.asarray(shared_units(GridStructure(9), pos, pos))[0]
    assert rel.shape == (3, 162, 162)
    for r, name in enumerate(("row", "col", "box")):
        same = index[name][:, None] == index[name][None, :]
        for qo in (0, 81):
            for ko in (0, 81):
                np.testing.assert_array_equal(rel[r, qo : qo + 81, ko : ko + 81], same)


@pytest.mark.slow
def test_grid_attention_bias_config_init_and_cached_decode_equals_full_pass():
    with pytest.raises(ValueError, match="need model.structure"):
        TransformerConfig.from_dict(dict(presets.tiny(vocab_size=13, moe=False), structure_attention_bias=1.0))
    with pytest.raises(ValueError, match="structure_attention_bias"):
        TransformerConfig.from_dict(dict(presets.tiny(vocab_size=13, moe=False), **grid_prior(9, -1.0)))
    shape = dict(presets.tiny(vocab_size=13, moe=False), **grid_prior(9, 2.0))
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


def test_runs_saved_with_the_grid_fields_load_with_the_structure_prior(tmp_path):
    """Sudoku runs saved `model.grid_embeddings` / `grid_attention_bias`; they load as the grid structure prior, with
    the same parameter names (`grid_embedding/row`, `attn/grid_bias`)."""
    import json

    from hackable_diffusion import run_config
    from hackable_diffusion.tasks.sudoku.recipes import sudoku_config

    saved = sudoku_config().to_dict()
    for key in ("structure", "structure_embeddings", "structure_attention_bias"):
        del saved["model"][key]
    saved["model"].update(grid_embeddings=9, grid_attention_bias=4.0)
    (tmp_path / "config.json").write_text(json.dumps(saved))
    model = run_config.load_saved_config(str(tmp_path)).model
    assert (model.structure, model.structure_embeddings, model.structure_attention_bias) == ("grid:9", True, 4.0)
    assert "grid_embeddings" not in model and "grid_attention_bias" not in model
    TransformerConfig.from_dict(model.to_dict())
