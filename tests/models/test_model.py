"""Backbone tests: cache equivalences, decoder mode, sliding window, dtype, remat, config errors, counts."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.models.config import MoEConfig, TransformerConfig
from hackable_diffusion.models.param_count import count_params


def tiny_cfg(**overrides):
    shape = presets.tiny()
    # Capacity factor E/k: the sorted dispatch never drops, so incremental and full passes route identically.
    shape["moe"] = dict(shape["moe"], capacity_factor=2.0)
    shape.update(overrides)
    return TransformerConfig.from_dict(shape)


def make(cfg, seed=0):
    model = T.Transformer(cfg)
    return model, T.init_params(model, jax.random.key(seed))


def tokens_for(shape, seed=1, vocab=64):
    return jax.random.randint(jax.random.key(seed), shape, 4, vocab)


@pytest.mark.slow
def test_prefill_then_decode_equals_full_causal_forward():
    model, params = make(tiny_cfg())
    toks = tokens_for((2, 12))
    full, _ = T.forward(model, params, toks, causal=True)
    cache = init_cache(model.cfg, 2, 16)
    pre, cache = T.append(model, params, toks[:, :9], cache)
    np.testing.assert_allclose(pre, full[:, :9], atol=2e-5)
    for i in range(9, 12):  # one-token decode steps
        step, cache = T.append(model, params, toks[:, i : i + 1], cache)
        np.testing.assert_allclose(step[:, 0], full[:, i], atol=2e-5)
    assert int(cache.end_index) == 12


@pytest.mark.slow
def test_padded_batch_prefill_matches_unpadded_rows():
    """Right-padded prompts of different lengths: pads never attended, positions count real tokens."""
    model, params = make(tiny_cfg())
    a, b = tokens_for((1, 5), seed=2), tokens_for((1, 8), seed=3)
    batch = jnp.concatenate([jnp.pad(a, ((0, 0), (0, 3)), constant_values=0), b], axis=0)
    mask = jnp.array([[True] * 5 + [False] * 3, [True] * 8])
    cache = init_cache(model.cfg, 2, 16)
    _, cache = T.append(model, params, batch, cache, token_mask=mask)
    nxt = tokens_for((2, 1), seed=4)
    step, _ = T.append(model, params, nxt, cache)
    for row, prompt in enumerate([a, b]):
        alone, _ = T.forward(model, params, jnp.concatenate([prompt, nxt[row : row + 1]], axis=1))
        np.testing.assert_allclose(step[row, 0], alone[0, -1], atol=2e-5)


def _prompt_and_canvas(model, params, prompt, prompt_mask, canvas):
    cache = init_cache(model.cfg, prompt.shape[0], prompt.shape[1] + canvas.shape[1])
    _, cache = T.append(model, params, prompt, cache, token_mask=prompt_mask)
    logits, _ = T.decode_block(model, params, canvas, cache)
    return logits, cache


@pytest.mark.slow
def test_decoder_mode_is_bidirectional_and_ignores_prompt_pads():
    model, params = make(tiny_cfg())
    prompt = tokens_for((1, 6), seed=5)
    prompt_mask = jnp.array([[True] * 4 + [False] * 2])
    canvas = tokens_for((1, 5), seed=6)
    base, cache = _prompt_and_canvas(model, params, prompt, prompt_mask, canvas)
    assert int(cache.end_index) == 6  # decoder mode did not write the cache
    later = canvas.at[0, 4].set((canvas[0, 4] + 1) % 60 + 4)
    changed, _ = _prompt_and_canvas(model, params, prompt, prompt_mask, later)
    assert np.abs(changed[0, 0] - base[0, 0]).max() > 1e-4, "canvas token 0 must see later canvas token 4"
    pad_changed = prompt.at[0, 5].set((prompt[0, 5] + 7) % 60 + 4)
    same, _ = _prompt_and_canvas(model, params, pad_changed, prompt_mask, canvas)
    np.testing.assert_array_equal(same, base)


@pytest.mark.slow
def test_decoder_mode_matches_full_forward_with_hand_built_mask():
    model, params = make(tiny_cfg())
    prompt = tokens_for((2, 6), seed=7)
    prompt_mask = jnp.array([[True] * 4 + [False] * 2, [True] * 6])
    canvas = tokens_for((2, 5), seed=8)
    got, _ = _prompt_and_canvas(model, params, prompt, prompt_mask, canvas)

    seq = jnp.concatenate([prompt, canvas], axis=1)
    token_mask = jnp.concatenate([prompt_mask, jnp.ones((2, 5), bool)], axis=1)
    p, c = 6, 5
    mask = np.zeros((2, p + c, p + c), bool)
    for row in range(2):
        real = np.asarray(token_mask[row])
        for q in range(p + c):
            for k in range(p + c):
                if q < p:
                    mask[row, q, k] = k <= q and real[k]  # prompt: causal over real tokens
                else:
                    mask[row, q, k] = real[k]  # canvas: every real prompt token and the whole canvas
    want, _ = T.forward(model, params, seq, token_mask=token_mask, mask=jnp.asarray(mask))
    np.testing.assert_allclose(got, want[:, p:], atol=2e-5)


def test_sliding_window_blocks_far_tokens_on_local_layer():
    cfg = tiny_cfg(num_layers=1, layer_pattern=("local",), sliding_window=3, moe=None)
    model, params = make(cfg)
    toks = tokens_for((1, 10), seed=9)
    base, _ = T.forward(model, params, toks, causal=False)
    far = toks.at[0, 2].set((toks[0, 2] + 5) % 60 + 4)  # |9 - 2| = 7 >= 3: no influence on position 9
    changed, _ = T.forward(model, params, far, causal=False)
    np.testing.assert_array_equal(changed[0, 9], base[0, 9])
    np.testing.assert_array_equal(changed[0, 6], base[0, 6])  # |6 - 2| = 4
    assert np.abs(changed[0, 4] - base[0, 4]).max() > 1e-5  # |4 - 2| = 2 < 3: influence


def test_global_layer_sees_beyond_window():
    cfg = tiny_cfg(num_layers=1, layer_pattern=("global",), sliding_window=3, moe=None)
    model, params = make(cfg)
    toks = tokens_for((1, 10), seed=9)
    base, _ = T.forward(model, params, toks, causal=False)
    changed, _ = T.forward(model, params, toks.at[0, 2].set((toks[0, 2] + 5) % 60 + 4), causal=False)
    assert np.abs(changed[0, 9] - base[0, 9]).max() > 1e-5


@pytest.mark.slow
def test_bf16_compute_with_f32_params_is_close():
    cfg32 = tiny_cfg()
    model32, params = make(cfg32)
    model16 = T.Transformer(dataclasses.replace(cfg32, compute_dtype="bfloat16"))
    toks = tokens_for((2, 8))
    a, _ = T.forward(model32, params, toks)
    b, _ = T.forward(model16, params, toks)
    assert b.dtype == jnp.float32  # logits come back in f32
    assert jax.tree.leaves(params)[0].dtype == jnp.float32
    np.testing.assert_allclose(a, b, atol=0.15)


@pytest.mark.slow
def test_remat_matches_values_and_gradients():
    cfg = tiny_cfg()
    model, params = make(cfg)
    remat = T.Transformer(dataclasses.replace(cfg, remat="full"))
    toks = tokens_for((2, 8))

    def loss(m, p):
        return jnp.mean(T.forward(m, p, toks)[0] ** 2)

    la, ga = jax.value_and_grad(lambda p: loss(model, p))(params)
    lb, gb = jax.value_and_grad(lambda p: loss(remat, p))(params)
    np.testing.assert_allclose(la, lb, rtol=1e-6)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), ga, gb)


@pytest.mark.slow
def test_unrolled_layer_scan_equals_rolled_in_every_mode():
    """The unrolled layer scan against the rolled loop: same params, same logits and caches. Dense FFN: the scan
    does not look inside a layer, and the MoE layer only multiplies the compile time here."""
    cfg = tiny_cfg(num_layers=3 * len(presets.tiny()["layer_pattern"]), moe=None)
    assert cfg.num_groups == 3
    model, params = make(cfg)
    for unroll in (None, 2):  # fully unrolled, and 2 groups per iteration (3 = 2 + 1 remainder)
        fast = T.with_scan_unroll(model, unroll)
        assert fast.cfg.scan_unroll == (3 if unroll is None else unroll)
        jaxpr = jax.make_jaxpr(lambda p, m=fast: T.forward(m, p, tokens_for((1, 4)))[0])(params)
        unrolls = {int(u) for u in re.findall(r"unroll=(\d+)", str(jaxpr))}
        assert fast.cfg.scan_unroll in unrolls, unrolls  # the setting reaches lax.scan
        assert jax.tree.structure(T.init_params(fast, jax.random.key(0))) == jax.tree.structure(params)
        toks = tokens_for((2, 10))
        for causal in (True, False):
            want, _ = T.forward(model, params, toks, causal=causal)
            got, _ = T.forward(fast, params, toks, causal=causal)
            np.testing.assert_allclose(got, want, atol=2e-5)
        caches = []
        for m in (model, fast):
            cache = init_cache(m.cfg, 2, 12)
            _, cache = T.append(m, params, toks[:, :8], cache)
            step, cache = T.append(m, params, toks[:, 8:9], cache)
            caches.append((step, cache))
        np.testing.assert_allclose(caches[1][0], caches[0][0], atol=2e-5)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5), caches[1][1], caches[0][1])
    with pytest.raises(ValueError, match="scan_unroll"):
        tiny_cfg(scan_unroll=0)


@pytest.mark.slow
def test_looped_depth_equals_a_deeper_stack_with_repeated_weights():
    """depth_loops=2 over G groups is the same function as 2G groups whose stacked parameters are [p; p] (both in
    value and gradient), and it changes the output (the loop is really run). Writing a KV cache is refused."""
    cfg = tiny_cfg(moe=None, structure="")
    looped = T.Transformer(dataclasses.replace(cfg, depth_loops=2))
    deep = T.Transformer(dataclasses.replace(cfg, num_layers=2 * cfg.num_layers))
    _, params = make(cfg)

    def stack_twice(p):  # the scanned layer stack's parameters [p; p]; embeddings and final norm as they are
        return jax.tree_util.tree_map_with_path(
            lambda path, x: jnp.concatenate([x, x]) if "layers" in jax.tree_util.keystr(path) else x, p
        )

    deep_params = stack_twice(params)
    toks = tokens_for((2, 10))
    for causal in (True, False):
        got, _ = T.forward(looped, params, toks, causal=causal)
        want, _ = T.forward(deep, deep_params, toks, causal=causal)
        np.testing.assert_allclose(got, want, atol=3e-5)
    got_bidir = got
    empty = init_cache(looped.cfg, 2, 1)  # read-only and empty (the in-place Sudoku sampler): the plain pass
    got_empty, _ = T.decode_block(looped, params, toks, empty)
    np.testing.assert_allclose(got_empty, got_bidir, atol=3e-5)
    once, _ = T.forward(T.Transformer(cfg), params, toks, causal=False)
    assert float(jnp.max(jnp.abs(once - got))) > 1e-3

    def loss(p):
        return jnp.mean(T.forward(looped, p, toks)[0] ** 2)

    def deep_loss(p):
        return jnp.mean(T.forward(deep, stack_twice(p), toks)[0] ** 2)

    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6),
        jax.grad(loss)(params),
        jax.grad(deep_loss)(params),
    )
    with pytest.raises(ValueError, match="depth_loops"):
        T.append(looped, params, toks[:, :4], init_cache(looped.cfg, 2, 8))
    with pytest.raises(ValueError, match="depth_loops"):
        tiny_cfg(depth_loops=0)


@pytest.mark.slow
def test_self_conditioning_zero_signal_is_normalised_embedding():
    cfg = tiny_cfg(self_conditioning=True)
    model, params = make(cfg)
    toks = tokens_for((2, 6))
    zeros = T.model_method(model, params, "null_sc_signal", (2, 6), kind="zeros")
    emb = T.model_method(model, params, "embed", toks)
    normed = emb / jnp.sqrt(jnp.mean(emb**2, -1, keepdims=True) + cfg.norm_eps)
    with_zero_sc, _ = T.forward(model, params, toks, causal=False, sc_signal=zeros)
    by_hand, _ = T.forward(model, params, toks, causal=False, input_embeddings=normed)
    np.testing.assert_allclose(with_zero_sc, by_hand, atol=1e-5)
    mean_sig = T.model_method(model, params, "null_sc_signal", (2, 6), kind="mean_embedding")
    with_mean, _ = T.forward(model, params, toks, causal=False, sc_signal=mean_sig)
    assert np.abs(with_mean - with_zero_sc).max() > 1e-4


@pytest.mark.slow
def test_sharded_forward_equals_unsharded():
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from hackable_diffusion.models.partitioning import logical_axes

    cfg = tiny_cfg(moe=dict(num_experts=4, top_k=2, hidden_dim=16, dispatch="sorted", capacity_factor=2.0))
    model, params = make(cfg)
    toks = tokens_for((4, 8))
    want, _ = T.forward(model, params, toks)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(1, 2, 2, 2), ("data", "fsdp", "expert", "tensor"))
    rules = {
        "embed": "fsdp",
        "heads": "tensor",
        "mlp": "tensor",
        "experts": "expert",
        "expert_mlp": "tensor",
        "vocab": "tensor",
    }

    def place(path, x):
        names = [getattr(k, "key", str(k)) for k in path]
        spec = [rules.get(a) if a else None for a in logical_axes(names, x.shape)]
        spec = [s if s and x.shape[i] % mesh.shape[s] == 0 else None for i, s in enumerate(spec)]
        return jax.device_put(x, NamedSharding(mesh, P(*spec)))

    sharded = jax.tree_util.tree_map_with_path(place, params)
    assert any(len(x.sharding.device_set) > 1 and not x.sharding.is_fully_replicated for x in jax.tree.leaves(sharded))
    batch = jax.device_put(toks, NamedSharding(mesh, P(("data", "fsdp"))))
    got, _ = jax.jit(lambda p, t: T.forward(model, p, t))(sharded, batch)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=3e-5)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(num_heads=4, num_kv_heads=3), "num_kv_heads"),
        (dict(global_num_kv_heads=3), "global_num_kv_heads"),
        (dict(sliding_window=0), "sliding_window"),
        (dict(num_layers=3), "layer_pattern"),
        (dict(layer_pattern=("local", "banana")), "layer_pattern"),
    ],
)
def test_impossible_configs_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_cfg(**overrides)


def test_moe_config_errors_and_unknown_keys():
    with pytest.raises(ValueError, match="top_k"):
        MoEConfig(num_experts=4, top_k=5, hidden_dim=8)
    with pytest.raises(ValueError, match="num_kv_heads"):
        TransformerConfig.from_dict(dict(presets.tiny(), num_kv_head=2))


def test_every_moe_preset_spells_out_every_option_so_config_flags_can_set_them():
    from hackable_diffusion import cli, recipes

    fields = {f.name for f in dataclasses.fields(MoEConfig)}
    for shape in (presets.diffusiongemma_26b_a4b(), presets.tiny(), presets.quickstart()):
        assert set(shape["moe"]) == fields
        assert shape["moe"]["load_balance_weight"] == 0.0  # the reference's choice: no auxiliary losses
    assert set(presets.small(moe=True)["moe"]) == fields
    # The text MoE recipe trains from scratch with capacity dropping: load-balance and z losses on.
    config = recipes.text_experiment("shakespeare", "masking", moe=True)
    assert set(config.model.moe) == fields
    assert config.model.moe.load_balance_weight == 1e-2 and config.model.moe.router_z_weight == 1e-3
    cli.check_overrides(config, ["--config.model.moe.load_balance_weight=0.05", "--config.model.moe.router_z_weight=0"])


def test_26b_a4b_parameter_count():
    counts = count_params(TransformerConfig.from_dict(presets.diffusiongemma_26b_a4b()))
    assert abs(counts["total_params"] / 25.2e9 - 1) < 0.005
    assert abs(counts["active_params_per_token"] / 3.8e9 - 1) < 0.03
