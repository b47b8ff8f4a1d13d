"""Gemma-4 parameter-tree converter: orbax round trip, forward pass, exact inverse, validation errors, 26B shapes."""

from hackable_diffusion import sft
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from hackable_diffusion.checkpoints import gemma as gc
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig


def _tiny_cfg(**overrides) -> TransformerConfig:
    shape = presets.tiny()
    shape.update(self_conditioning=True, num_layers=4)  # 2 scanned groups of (local, global): layers 0..3
    shape.update(overrides)
    return TransformerConfig.from_dict(shape)


def _random_gemma_tree(cfg: TransformerConfig, seed: int) -> dict:
    """A gemma-layout tree built from the expected shapes alone (independent of to_gemma)."""
    rng = np.random.default_rng(seed)
    flat = {path: (rng.standard_normal(s.shape) * 0.2).astype(np.float32) for path, s in gc.gemma_shapes(cfg).items()}
    return gc.unflatten_tree(flat)


def _init(cfg: TransformerConfig, seed: int):
    """Random toolbox params with the structure and shapes of `init_params` (abstract init, no compile)."""
    rng = np.random.default_rng(seed)
    return gc.unflatten_tree(
        {path: rng.standard_normal(s.shape).astype(s.dtype) for path, s in gc.toolbox_shapes(cfg).items()}
    )


@pytest.fixture(scope="module")
def cfg():
    return _tiny_cfg()


@pytest.fixture(scope="module")
def gemma_tree(cfg):
    return _random_gemma_tree(cfg, seed=7)


def _assert_trees_identical(a, b):
    fa, fb = gc.flatten_tree(a), gc.flatten_tree(b)
    assert sorted(fa) == sorted(fb)
    for path in fa:
        x, y = np.asarray(fa[path]), np.asarray(fb[path])
        assert x.dtype == y.dtype and x.shape == y.shape, path
        assert np.array_equal(x.view(np.uint8), y.view(np.uint8)), path  # bit for bit


@pytest.mark.slow
def test_orbax_round_trip_forward_and_exact_inverse(cfg, gemma_tree, tmp_path):
    directory = str(tmp_path / "gemma")
    ocp.PyTreeCheckpointer().save(directory, gemma_tree)  # written with plain orbax, as the gemma library does

    params = gc.load_gemma_checkpoint(directory, cfg)
    # Layer n = g * len(pattern) + i sits in slice g of block i: layer 3 is the second global layer.
    np.testing.assert_array_equal(
        params["layers"]["block_1"]["attn"]["k_einsum"][1], gemma_tree["layer_3"]["attn"]["k_einsum"]["w"]
    )
    np.testing.assert_array_equal(
        params["layers"]["block_0"]["moe"]["gating_einsum"][1], gemma_tree["layer_2"]["mlp"]["gating_einsum"]["w"]
    )
    np.testing.assert_array_equal(
        params["self_conditioner"]["ffw"]["linear"], gemma_tree["self_conditioner"]["ffw"]["linear"]
    )

    model = T.Transformer(cfg)
    tokens = jnp.asarray(np.random.default_rng(0).integers(4, cfg.vocab_size, (2, 6)), jnp.int32)
    signal = T.model_method(model, params, "null_sc_signal", (2, 6), kind="mean_embedding")
    logits, _ = jax.jit(lambda p, t, s: T.forward(model, p, t, causal=False, sc_signal=s))(params, tokens, signal)
    assert logits.shape == (2, 6, cfg.vocab_size) and bool(jnp.all(jnp.isfinite(logits)))

    _assert_trees_identical(gc.to_gemma(params, cfg), gemma_tree)

    gc.save_gemma_checkpoint(params, cfg, tmp_path / "again")
    _assert_trees_identical(gc.load_gemma_checkpoint(tmp_path / "again", cfg), params)
    cast = gc.load_gemma_checkpoint(directory, cfg, dtype="bfloat16")
    assert {np.asarray(x).dtype for x in jax.tree.leaves(cast)} == {np.dtype(jnp.bfloat16)}


def test_toolbox_to_gemma_to_toolbox_is_exact(cfg):
    params = _init(cfg, 3)
    tree = gc.to_gemma(params, cfg)
    assert sorted(tree) == ["embedder", "final_norm", "layer_0", "layer_1", "layer_2", "layer_3", "self_conditioner"]
    assert "k_einsum" in tree["layer_1"]["attn"] and "kv_einsum" in tree["layer_0"]["attn"]
    _assert_trees_identical(gc.from_gemma(tree, cfg), params)


def test_missing_leaf_names_gemma_path_and_shape(cfg, gemma_tree):
    tree = gc.unflatten_tree({p: v for p, v in gc.flatten_tree(gemma_tree).items() if p != "layer_3/attn/k_einsum/w"})
    with pytest.raises(ValueError, match=r"missing the leaf 'layer_3/attn/k_einsum/w'; expected shape \(1, 32, 16\)"):
        gc.from_gemma(tree, cfg)
    no_sc = gc.unflatten_tree(
        {p: v for p, v in gc.flatten_tree(gemma_tree).items() if not p.startswith("self_conditioner/ffw")}
    )
    with pytest.raises(ValueError, match=r"self_conditioner/ffw/gating_einsum"):
        gc.from_gemma(no_sc, cfg)


def test_misshaped_leaf_names_gemma_path_and_shape(cfg, gemma_tree, tmp_path):
    flat = dict(gc.flatten_tree(gemma_tree))
    flat["layer_2/mlp/gating_einsum/w"] = np.zeros((4, 2, 16, 31), np.float32)
    bad = gc.unflatten_tree(flat)
    message = r"'layer_2/mlp/gating_einsum/w' has shape \(4, 2, 16, 31\), expected \(4, 2, 16, 32\)"
    with pytest.raises(ValueError, match=message):
        gc.from_gemma(bad, cfg)
    directory = str(tmp_path / "bad")
    ocp.PyTreeCheckpointer().save(directory, bad)
    with pytest.raises(ValueError, match=message):  # caught from the metadata, before reading arrays
        gc.load_gemma_checkpoint(directory, cfg)


def test_unexpected_leaf_fails_unless_ignored(cfg, gemma_tree):
    flat = dict(gc.flatten_tree(gemma_tree))
    flat["layer_4/skip_scale"] = np.ones((1,), np.float32)
    with pytest.raises(ValueError, match=r"unexpected leaf 'layer_4/skip_scale' with shape \(1,\)"):
        gc.from_gemma(gc.unflatten_tree(flat), cfg)
    params = gc.from_gemma(gc.unflatten_tree(flat), cfg, ignore_unexpected=True)
    _assert_trees_identical(gc.to_gemma(params, cfg), gemma_tree)


def test_flat_wrapped_and_w_variants_are_accepted(cfg, gemma_tree):
    flat = dict(gc.flatten_tree(gemma_tree))
    flat["layer_0/mlp2/gating_einsum/w"] = flat.pop("layer_0/mlp2/gating_einsum")  # trailing /w added
    flat["layer_1/attn/q_einsum"] = flat.pop("layer_1/attn/q_einsum/w")  # trailing /w stripped
    params = gc.from_gemma({"params": flat}, cfg)
    _assert_trees_identical(gc.to_gemma(params, cfg), gemma_tree)


def test_toolbox_params_are_validated(cfg):
    params = _init(cfg, 0)
    del params["layers"]["block_1"]["attn"]["k_einsum"]
    with pytest.raises(ValueError, match=r"'layers/block_1/attn/k_einsum' \(expected shape \(2, 1, 32, 16\)\)"):
        gc.to_gemma(params, cfg)


def test_rules_are_data(cfg):
    """A renamed and transposed leaf through a custom table, both directions exact."""
    without = tuple(r for r in gc.RULES if r.toolbox != "layers/block_{i}/mlp2/linear")
    rules = without + (
        gc.Rule(
            "layers/block_{i}/mlp2/linear",
            "layer_{n}/dense/down_proj",
            to_gemma=lambda w: w.T,
            from_gemma=lambda w: w.T,
        ),
    )
    params = _init(cfg, 1)
    tree = gc.to_gemma(params, cfg, rules)
    assert tree["layer_2"]["dense"]["down_proj"].shape == (cfg.embed_dim, cfg.ffw_hidden)
    np.testing.assert_array_equal(
        tree["layer_2"]["dense"]["down_proj"], params["layers"]["block_0"]["mlp2"]["linear"][1].T
    )
    _assert_trees_identical(gc.from_gemma(tree, cfg, rules), params)
    with pytest.raises(ValueError, match=r"No conversion rule for the toolbox parameter 'layers/block_0/mlp2/linear'"):
        gc.to_gemma(params, cfg, without)


def test_full_size_shapes_match_the_reference():
    """docs/reference.md §1 shapes for the 26B-A4B config (abstract, nothing allocated)."""
    shape = presets.diffusiongemma_26b_a4b()
    shape["self_conditioning"] = True
    shapes = {p: tuple(s.shape) for p, s in gc.gemma_shapes(TransformerConfig.from_dict(shape)).items()}
    assert shapes["embedder/input_embedding"] == (262_144, 2816)
    assert shapes["layer_0/attn/kv_einsum/w"] == (2, 8, 2816, 256)
    assert shapes["layer_5/attn/k_einsum/w"] == (2, 2816, 512)
    assert shapes["layer_29/attn/q_einsum/w"] == (16, 2816, 512)
    assert "layer_5/attn/kv_einsum/w" not in shapes and "layer_4/attn/k_einsum/w" not in shapes
    assert shapes["layer_11/mlp/gating_einsum/w"] == (128, 2, 704, 2816)
    assert shapes["layer_17/mlp/linear/w"] == (128, 704, 2816)
    assert shapes["layer_23/mlp/router_logits/w"] == (2816, 128)
    assert shapes["layer_0/mlp2/gating_einsum"] == (2, 2112, 2816)
    assert shapes["layer_0/skip_scale"] == (1,)
    assert shapes["self_conditioner/ffw/gating_einsum"] == (2, 2112, 2816)
    global_layers = sorted(int(p.split("/")[0][6:]) for p in shapes if p.endswith("attn/k_einsum/w"))
    assert global_layers == [5, 11, 17, 23, 29]
    # 20 leaves per layer (k_einsum replaces kv_einsum on global layers).
    assert len([p for p in shapes if p.startswith("layer_")]) == 30 * 20
    total = sum(int(np.prod(s)) for s in shapes.values())
    assert 25.0e9 < total < 25.5e9  # ≈ 25.2B (docs/reference.md §1) plus 17.8M for self-conditioning


def test_converted_gemma_tree_is_an_sft_start(cfg, gemma_tree, tmp_path):
    from hackable_diffusion import recipes
    from hackable_diffusion.checkpoints import base_weights
    from hackable_diffusion.data.tokenizers import CharTokenizer

    directory = str(tmp_path / "gemma")
    ocp.PyTreeCheckpointer().save(directory, gemma_tree)
    CharTokenizer.fit("abcdefgh \n").save(tmp_path / "tokenizer")
    config = sft.sft_config(model=presets.tiny(), init_kind="gemma", checkpoint=directory)
    config.model.update(self_conditioning=True, num_layers=4)
    config.init.tokenizer_dir = str(tmp_path / "tokenizer")
    base = base_weights.load_base(config)
    assert base.model.cfg == cfg and base.tokenizer.vocab_size == 14
    _assert_trees_identical(gc.to_gemma(base.params, cfg), gemma_tree)
