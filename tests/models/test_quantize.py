"""models/quantize.py: FP8 weight-only quantization with per-output-channel scales — the round-trip error bound of
e4m3, every channel using the full range, what is and is not quantized, the storage, and the logits error of a model
decoding with the quantized weights."""

import jax
import jax.numpy as jnp
import numpy as np

from hackable_diffusion.checkpoints import quantized_runs
from hackable_diffusion.models import presets
from hackable_diffusion.models import quantize as Q
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig


def test_round_trip_error_is_within_e4m3_rounding_and_channels_use_the_full_range():
    w = jax.random.normal(jax.random.key(0), (3, 64, 48)) * jnp.linspace(0.01, 5.0, 48)  # channels of many scales
    q, scale = Q.quantize_leaf(w, (-2,))
    assert q.dtype == Q.FP8 and scale.shape == (3, 1, 48)
    back = q.astype(jnp.float32) * scale
    # 3 mantissa bits: rounding to nearest is within 2^-4 of the value; below the normal range, within half a step
    bound = 2.0**-4 * jnp.abs(w) + scale * 2.0**-10
    assert bool(jnp.all(jnp.abs(back - w) <= bound))
    np.testing.assert_array_equal(jnp.max(jnp.abs(q.astype(jnp.float32)), axis=-2), Q.FP8_MAX)
    zero_q, zero_scale = Q.quantize_leaf(jnp.zeros((4, 2)), (-2,))
    assert bool(jnp.all(zero_scale == 1.0)) and bool(jnp.all(zero_q.astype(jnp.float32) == 0.0))


def _tiny():
    cfg = TransformerConfig.from_dict(dict(presets.tiny(vocab_size=64, moe=True), k_eq_v_global=False))
    model = T.Transformer(cfg)
    return model, T.init_params(model, jax.random.key(1))


def test_only_matmul_weights_are_quantized_and_storage_shrinks():
    model, params = _tiny()
    values, scales = Q.quantize_fp8(params)
    flat_v = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(values)[0]}
    flat_p = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(params)[0]}
    quantized = {k for k, v in flat_v.items() if v.dtype == Q.FP8}
    for key in flat_p:
        expect = any(name in key for name in Q.CONTRACTED_AXES)
        assert (key in quantized) == expect, key
    assert any("router_logits" in k for k in flat_p) and not any("router" in k for k in quantized)
    assert any("kv_einsum" in k for k in quantized) and any("moe']['linear" in k for k in quantized)
    bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    stored = Q.nbytes(values) + Q.nbytes(scales)
    assert stored < 0.75 * Q.nbytes(bf16), (stored, Q.nbytes(bf16))


def test_scales_are_per_output_channel_of_each_einsum():
    model, params = _tiny()
    _, scales = Q.quantize_fp8(params)
    flat = {jax.tree_util.keystr(p): s for p, s in jax.tree_util.tree_flatten_with_path(scales)[0] if s is not None}
    shapes = {k: v.shape for k, v in flat.items()}
    # leading 1: the stacked layer-group axis. Contracted axes (the einsum's input dims) are 1, the rest kept.
    assert shapes["['layers']['block_0']['attn']['q_einsum']"] == (1, 4, 1, 8)  # (N, D, H): contract D
    assert shapes["['layers']['block_0']['attn']['kv_einsum']"] == (1, 2, 2, 1, 8)  # (2, K, D, H)
    assert shapes["['layers']['block_0']['attn']['attn_vec_einsum']"] == (1, 1, 1, 32)  # (N, H, D): contract N, H
    assert shapes["['layers']['block_0']['mlp2']['gating_einsum']"] == (1, 2, 48, 1)  # (2, F, D): contract D
    assert shapes["['layers']['block_0']['mlp2']['linear']"] == (1, 1, 32)  # (F, D): contract F
    assert shapes["['layers']['block_0']['moe']['gating_einsum']"] == (1, 4, 2, 16, 1)  # (E, 2, F, D)
    assert shapes["['layers']['block_0']['moe']['linear']"] == (1, 4, 1, 32)  # (E, F, D)
    assert shapes["['embedder']['input_embedding']"] == (64, 1)  # the tied head contracts D: one scale per token


def test_decoding_with_fp8_weights_stays_close_to_the_full_precision_logits():
    """Random-weight models amplify any perturbation of the weights (bf16 rounding, 2^-9 relative, moves these
    logits by about 1%), so the bound is relative to bf16's: e4m3 rounds 2^4 times coarser. The trained-run
    likelihood change is measured by experiments/fp8_likelihood.py."""
    model, params = _tiny()
    tokens = jax.random.randint(jax.random.key(2), (2, 12), 4, 64)
    want, _ = T.forward(model, params, tokens)
    values, scales = Q.quantize_fp8(params)
    fp8 = jax.jit(lambda v, s, t: T.forward(model, Q.dequantize(v, s, jnp.float32), t)[0])(values, scales, tokens)
    bf16_params = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), params)
    bf16, _ = T.forward(model, bf16_params, tokens)

    def rel(x):
        return float(jnp.sqrt(jnp.mean((x - want) ** 2)) / jnp.sqrt(jnp.mean(want**2)))

    assert 0 < rel(bf16) < rel(fp8) < min(0.25, 32 * rel(bf16)), (rel(bf16), rel(fp8))
    # the argmax of the next-token distribution is kept almost everywhere
    assert float(jnp.mean(jnp.argmax(fp8, -1) == jnp.argmax(want, -1))) >= 0.8


def test_quantized_params_are_dequantized_inside_every_model_call(tmp_path):
    """A `QuantizedParams` goes wherever params go: forward, decode_block and a model method equal the same calls on
    the weights dequantized outside; `save_quantized` / `load_quantized` round-trip it bit for bit."""
    from hackable_diffusion.models.attention import init_cache

    model = T.Transformer(TransformerConfig.from_dict(presets.tiny(vocab_size=64, moe=False)))
    params = T.init_params(model, jax.random.key(1))
    quantized = Q.quantize_params(params)
    outside = quantized.dequantize(jnp.float32)
    tokens = jax.random.randint(jax.random.key(2), (2, 6), 4, 64)
    np.testing.assert_allclose(
        T.forward(model, quantized, tokens)[0], T.forward(model, outside, tokens)[0], rtol=1e-6, atol=1e-6
    )
    _, cache = T.append(model, outside, tokens, init_cache(model.cfg, 2, 10))
    canvas = tokens[:, :4]
    np.testing.assert_allclose(
        T.decode_block(model, quantized, canvas, cache)[0],
        T.decode_block(model, outside, canvas, cache)[0],
        rtol=1e-6,
        atol=1e-6,
    )
    np.testing.assert_array_equal(
        T.model_method(model, quantized, "embed", tokens), T.model_method(model, outside, "embed", tokens)
    )
    assert not np.allclose(T.forward(model, params, tokens)[0], T.forward(model, quantized, tokens)[0])  # FP8 moved it

    loaded = quantized_runs.load_quantized(quantized_runs.save_quantized(quantized, tmp_path / "fp8"))
    for a, b in zip(jax.tree.leaves(quantized), jax.tree.leaves(loaded), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32)))
    assert jax.tree.structure(quantized) == jax.tree.structure(loaded)
