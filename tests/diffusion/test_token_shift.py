"""Token shift (diffusion/token_shift.py): where each shifted prediction comes from, the objective's ELBO under the
shift against references built from the model's own passes, and the config wiring."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion import builders, recipes
from hackable_diffusion.diffusion import objectives as O
from hackable_diffusion.diffusion import token_shift
from hackable_diffusion.diffusion.processes import MaskingProcess
from hackable_diffusion.diffusion.schedules import LinearSchedule, UniformTimeSampler
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.models.config import TransformerConfig

V, MASK = 32, 3
FULLY_NOISED = UniformTimeSampler(1.0 - 1e-7, 1.0)  # with eps = 0: every free position MASK, ELBO weight 1 / t ~ 1


def test_shift_sequence_logits_reads_left_neighbour_and_encoder_at_canvas_starts():
    b, l, v, c = 1, 6, 2, 3
    decoder = jnp.arange(l, dtype=jnp.float32)[None, :, None] * jnp.ones((b, l, v))
    encoder = 100.0 + decoder
    shifted = token_shift.shift_sequence_logits(decoder, encoder, c)[0, :, 0]
    # position 0: no token before it; 1, 2: decoder at 0, 1; 3 (a canvas start): encoder at 2; 4, 5: decoder at 3, 4
    np.testing.assert_array_equal(shifted, [0.0, 0.0, 1.0, 102.0, 3.0, 4.0])
    one_canvas = token_shift.shift_sequence_logits(decoder, None, l)[0, :, 0]
    np.testing.assert_array_equal(one_canvas, [0.0, 0.0, 1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError, match="multiple of canvas_len"):
        token_shift.shift_sequence_logits(decoder, encoder, 4)
    np.testing.assert_array_equal(token_shift.first_scored(3), [False, True, True])


def test_shift_canvas_logits_and_last_real_logits():
    canvas = jnp.arange(8, dtype=jnp.float32).reshape(1, 4, 2)
    before = jnp.asarray([[-1.0, -2.0]])
    out = token_shift.shift_canvas_logits(canvas, before)
    np.testing.assert_array_equal(out[0], [[-1, -2], [0, 1], [2, 3], [4, 5]])
    with pytest.raises(ValueError, match="before the canvas"):
        token_shift.shift_canvas_logits(canvas, jnp.zeros((1, 3)))
    logits = jnp.arange(12, dtype=jnp.float32).reshape(2, 3, 2)
    mask = jnp.asarray([[True, True, False], [False, False, False]])  # right-padded; row 1 has no real token
    previous = jnp.asarray([[9.0, 9.0], [7.0, 7.0]])
    np.testing.assert_array_equal(token_shift.last_real_logits(logits, mask, previous), [[2, 3], [7, 7]])
    np.testing.assert_array_equal(token_shift.last_real_logits(logits, jnp.ones((2, 3), bool)), [[4, 5], [10, 11]])


def _model():
    cfg = TransformerConfig.from_dict(presets.tiny(vocab_size=V, moe=False))
    model = T.Transformer(cfg)
    return model, T.init_params(model, jax.random.key(0))


def _masking():
    return MaskingProcess(vocab_size=V, schedule=LinearSchedule(eps=0.0), mask_id=MASK)


def _nll(logits, targets):
    """Per-position NLL with the MASK logit dropped, as the masking ELBO's parameterisation does (SUBS)."""
    logits = logits.astype(jnp.float32).at[..., MASK].set(-jnp.inf)
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]


def test_one_token_canvases_with_shift_are_the_ar_model():
    """Canvases of one token, fully masked: each prediction is the encoder's logits of the token before it, so the
    ELBO is the AR negative log-likelihood of tokens 1 .. l-1 (MASK excluded; token 0 is not scored)."""
    model, params = _model()
    x0 = jax.random.randint(jax.random.key(1), (2, 8), 4, V)
    obj = O.DiffusionPretrainObjective(model, _masking(), time_sampler=FULLY_NOISED, canvas_len=1, token_shift=True)
    elbo, scored = jax.jit(obj.elbo_per_example)(params, {"tokens": x0}, jax.random.key(2))
    np.testing.assert_array_equal(scored, [7, 7])
    ar_logits, _ = T.forward(model, params, x0, causal=True)
    expected = _nll(ar_logits[:, :-1], x0[:, 1:]).sum(-1)
    np.testing.assert_allclose(elbo, expected, rtol=1e-4)
    unshifted = O.DiffusionPretrainObjective(model, _masking(), time_sampler=FULLY_NOISED, canvas_len=1)
    elbo_plain, _ = jax.jit(unshifted.elbo_per_example)(params, {"tokens": x0}, jax.random.key(2))
    assert np.abs(np.asarray(elbo_plain)[:, None] - np.asarray(expected)[:, None]).max() > 1e-2  # the shift matters


def test_block_elbo_with_shift_equals_sampler_style_reference():
    """Canvases of 4: inside a canvas the prediction is the decoder's logits one to the left (a sampler-style decode
    of the all-MASK canvas against the clean canvases before it), at a canvas start the encoder's."""
    model, params = _model()
    b, l, c = 2, 12, 4
    x0 = jax.random.randint(jax.random.key(3), (b, l), 4, V)
    obj = O.DiffusionPretrainObjective(model, _masking(), time_sampler=FULLY_NOISED, canvas_len=c, token_shift=True)
    elbo, scored = jax.jit(obj.elbo_per_example)(params, {"tokens": x0}, jax.random.key(4))
    np.testing.assert_array_equal(scored, [l - 1, l - 1])

    encoder, _ = T.forward(model, params, x0, causal=True)
    predictions = []
    for k in range(l // c):
        cache = init_cache(model.cfg, b, l)
        if k:
            _, cache = T.append(model, params, x0[:, : c * k], cache)
        noisy = jnp.full((b, c), MASK).at[:, 0].set(x0[:, 0] if k == 0 else MASK)  # token 0 stays clean
        decoded, _ = T.decode_block(model, params, noisy, cache)
        first = jnp.zeros_like(encoder[:, 0]) if k == 0 else encoder[:, c * k - 1]
        predictions.append(jnp.concatenate([first[:, None], decoded[:, :-1]], axis=1))
    predictions = jnp.concatenate(predictions, axis=1)
    expected = _nll(predictions[:, 1:], x0[:, 1:]).sum(-1)
    np.testing.assert_allclose(elbo, expected, rtol=1e-4)


def test_token_shift_config_reaches_objective_and_sampler():
    config = recipes.text_experiment("shakespeare", "masking", moe=False)
    config.model = presets.tiny(vocab_size=V, moe=False)
    config.diffusion.token_shift = True
    model, _ = _model()
    process = builders.build_process(config, V)
    objective = builders.build_objective(config, model, process)
    assert objective.token_shift
    assert builders.build_sampler(config, process).token_shift
    config.diffusion.token_shift = False
    assert not builders.build_objective(config, model, process).token_shift
    assert not builders.build_sampler(config, process).token_shift
    with pytest.raises(ValueError, match="self-conditioning"):
        O.DiffusionPretrainObjective(model, process, canvas_len=4, token_shift=True, self_condition_prob=0.5)
