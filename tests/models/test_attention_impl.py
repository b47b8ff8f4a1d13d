"""models/attention.py: `attention_impl="dot_product"` (jax.nn.dot_product_attention over the concatenated cache and
block; cuDNN's fused kernel on a GPU) computes the same function as the einsum path in every run mode: full causal and
bidirectional passes, prefill then one-token decode (the cache written), and a canvas reading the cache in decoder mode
(both window conventions), with sliding-window local layers, K = V global layers, padded rows and the grid bias."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.sampling.prompts import prefill

ATOL = 2e-5


def _pair(**overrides):
    shape = dict(presets.tiny(vocab_size=64, moe=False), k_eq_v_global=True, sliding_window=3)
    shape.update(overrides)
    cfg = TransformerConfig.from_dict(shape)
    einsum = T.Transformer(cfg)
    fused = T.Transformer(dataclasses.replace(cfg, attention_impl="dot_product"))
    return einsum, fused, T.init_params(einsum, jax.random.key(0))


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=ATOL, rtol=1e-5)


def test_full_passes_are_equal():
    einsum, fused, params = _pair()
    tokens = jax.random.randint(jax.random.key(1), (2, 10), 4, 64)
    for causal in (True, False):
        _close(T.forward(fused, params, tokens, causal=causal)[0], T.forward(einsum, params, tokens, causal=causal)[0])


@pytest.mark.parametrize("decoder_window", ["per_token", "cache_tail"])
def test_prefill_decode_and_canvas_over_the_cache_are_equal(decoder_window):
    einsum, fused, params = _pair(decoder_window=decoder_window)
    tokens = jax.random.randint(jax.random.key(2), (2, 9), 4, 64)
    mask = np.ones((2, 9), bool)
    mask[1, 6:] = False  # a right-padded row: its padding never becomes a valid slot
    results = []
    for model in (einsum, fused):
        cache = init_cache(model.cfg, 2, 20)
        prefill_logits, cache = T.append(model, params, tokens, cache, token_mask=mask)
        step_logits, cache = T.append(model, params, tokens[:, :1], cache)  # one-token decode, writes the cache
        canvas = jax.random.randint(jax.random.key(3), (2, 6), 4, 64)
        canvas_logits, _ = T.decode_block(model, params, canvas, cache)  # decoder mode: reads, never writes
        results.append((prefill_logits, step_logits, canvas_logits, cache))
    (p0, s0, c0, k0), (p1, s1, c1, k1) = results
    _close(p1[mask], p0[mask])
    _close(s1, s0)
    _close(c1, c0)
    jax.tree.map(_close, k1, k0)


def test_the_grid_bias_is_applied_the_same_way():
    from hackable_diffusion.tasks.sudoku.structure import grid_prior

    einsum, fused, params = _pair(**grid_prior(4, 1.0), layer_pattern=("global", "global"))
    tokens = jax.random.randint(jax.random.key(4), (2, 16), 4, 64)
    params = jax.tree_util.tree_map_with_path(  # distinct per-head biases, so a head-order mix-up would show
        lambda p, x: x + jax.random.normal(jax.random.key(5), x.shape) if "grid_bias" in jax.tree_util.keystr(p) else x,
        params,
    )
    _close(T.forward(fused, params, tokens, causal=False)[0], T.forward(einsum, params, tokens, causal=False)[0])


def test_an_unknown_implementation_is_refused():
    with pytest.raises(ValueError, match="attention_impl"):
        TransformerConfig.from_dict(dict(presets.tiny(), attention_impl="flash"))


def test_per_head_products_for_few_tokens_equal_the_einsums():
    """`layers.to_heads` / `from_heads` (a dot batched over the heads for <= PER_HEAD_MAX_TOKENS tokens) equal the
    plain einsums they replace, values and gradients, for q (n, d, h), k (k, d, h), kv (2, k, d, h) and the output."""
    from hackable_diffusion.models import layers as L

    keys = jax.random.split(jax.random.key(0), 6)
    x = jax.random.normal(keys[0], (2, 3, 16))
    weights = {
        "td,ndh->tnh": jax.random.normal(keys[1], (4, 16, 8)),
        "td,kdh->tkh": jax.random.normal(keys[2], (2, 16, 8)),
        "td,ckdh->tckh": jax.random.normal(keys[3], (2, 2, 16, 8)),
    }
    assert 2 * 3 <= L.PER_HEAD_MAX_TOKENS
    for eqn, w in weights.items():
        want = L.token_einsum(eqn, x, w, jnp.float32)
        np.testing.assert_allclose(L.to_heads(x, w, jnp.float32), want, rtol=1e-5, atol=1e-5)
        grad = jax.grad(lambda x, w: jnp.sum(jnp.sin(L.to_heads(x, w, jnp.float32))), argnums=(0, 1))(x, w)
        ref = jax.grad(lambda x, w: jnp.sum(jnp.sin(L.token_einsum(eqn, x, w, jnp.float32))), argnums=(0, 1))(x, w)
        for a, b in zip(grad, ref):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    heads = jax.random.normal(keys[4], (2, 3, 4, 8))
    w_o = jax.random.normal(keys[5], (4, 8, 16))
    want = L.token_einsum("tnh,nhd->td", heads, w_o, jnp.float32)
    np.testing.assert_allclose(L.from_heads(heads, w_o, jnp.float32), want, rtol=1e-5, atol=1e-5)
    many = jax.random.normal(keys[0], (2, L.PER_HEAD_MAX_TOKENS, 16))  # above the threshold: the einsum itself
    np.testing.assert_array_equal(
        L.to_heads(many, weights["td,ndh->tnh"], jnp.float32),
        L.token_einsum("td,ndh->tnh", many, weights["td,ndh->tnh"], jnp.float32),
    )


@pytest.mark.parametrize("window", ["per_token", "cache_tail"])
def test_training_decodes_each_canvas_as_sampling_does_under_both_window_conventions(window):
    """The training objective decodes every canvas of a sequence in one call; under either decoder-window convention
    each canvas's logits equal those of sampling, which decodes that canvas alone against the cached clean prefix
    (under `cache_tail` the local layers' window is counted from each query's own canvas, past the window here)."""
    cfg = TransformerConfig.from_dict(dict(presets.tiny(moe=False), decoder_window=window))
    assert cfg.sliding_window < 24  # canvases 2 and 3 sit past the window
    model = T.Transformer(cfg)
    params = T.init_params(model, jax.random.key(0))
    b, l, c = 1, 32, 8
    clean = jax.random.randint(jax.random.key(1), (b, l), 4, 64)
    noisy = jax.random.randint(jax.random.key(2), (b, l), 4, 64)
    token_mask = jnp.ones((b, l), bool)
    _, cache = T.append(model, params, clean, init_cache(cfg, b, l), token_mask=token_mask)
    canvas_of = jnp.arange(l) // c
    prefix = (canvas_of[None, :, None] > canvas_of[None, None, :]) & cache.valid[:, None, :]
    own_canvas = (canvas_of[:, None] == canvas_of[None, :])[None] & token_mask[:, None, :]
    training, _ = T.decode_block(
        model, params, noisy, cache, token_mask=token_mask, prefix_mask=jnp.broadcast_to(prefix, (b, l, l)),
        positions=T.positions_from_mask(token_mask), self_mask=own_canvas,
    )
    for k in (1, 3):
        _, prompt_cache = prefill(model, params, clean[:, : k * c], jnp.ones((b, k * c), bool), cache_length=k * c + c)
        sampling, _ = T.decode_block(model, params, noisy[:, k * c : (k + 1) * c], prompt_cache)
        np.testing.assert_allclose(sampling, training[:, k * c : (k + 1) * c], atol=5e-5)
