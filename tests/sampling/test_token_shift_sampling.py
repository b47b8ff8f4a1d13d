"""Sampling a token-shift model (`DiffusionSampler(token_shift=True)`): canvases of one token decoded greedily are AR
greedy decoding; the on-device loop equals the host loop; a padded row equals the row alone; clear errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny_sampling import PROMPTS, forward, masking_sampler, prefilled_prompts

from hackable_diffusion.data.tokenizers import MASK_ID
from hackable_diffusion.sampling import selection as S
from hackable_diffusion.sampling.canvas import denoise_canvas
from hackable_diffusion.sampling.generate import generate
from hackable_diffusion.sampling.temperature import AnnealedTemperature

GREEDY = AnnealedTemperature(1e-6, 1e-6)  # logits / 1e-6 dwarf the Gumbel noise: the argmax is drawn


def shift_sampler(**changes):
    options = dict(token_shift=True, self_conditioning=False, temperature=GREEDY) | changes
    return masking_sampler(S.EntropyBound(0.1), **options)


def test_one_token_canvases_decoded_greedily_are_ar_greedy_decoding(model_and_params):
    model, params = model_and_params
    new = 5
    sampler = shift_sampler(canvas_length=1, num_steps=1)
    result = generate(model, params, PROMPTS, sampler=sampler, key=0, max_new_tokens=new, stop_tokens=())
    for row, prompt in enumerate(PROMPTS):
        sequence = list(prompt)
        for _ in range(new):  # the slow reference: a full causal forward over the sequence so far, no cache
            logits, _ = forward(model, params, jnp.asarray([sequence]), causal=True)
            sequence.append(int(jnp.argmax(logits[0, -1].at[MASK_ID].set(-jnp.inf))))
        np.testing.assert_array_equal(result.tokens[row], sequence[len(prompt) :])


def test_shift_sampling_on_device_equals_host_loop_and_rows_are_independent(model_and_params):
    model, params = model_and_params
    sampler = shift_sampler(temperature=AnnealedTemperature(0.5, 1.0))
    kwargs = dict(sampler=sampler, key=jax.random.split(jax.random.key(5), 2), max_new_tokens=10, stop_tokens=())
    host = generate(model, params, PROMPTS, **kwargs)
    device = generate(model, params, PROMPTS, on_device=True, **kwargs)
    np.testing.assert_array_equal(host.tokens, device.tokens)
    np.testing.assert_array_equal(host.steps, device.steps)
    alone = generate(model, params, PROMPTS[:1], **dict(kwargs, key=kwargs["key"][:1]))  # row 0 without padding
    np.testing.assert_array_equal(alone.tokens[0], host.tokens[0])
    plain = generate(model, params, PROMPTS, **dict(kwargs, sampler=sampler.replace(token_shift=False)))
    assert not np.array_equal(plain.tokens, host.tokens)  # the shift changes what is read


def test_shift_sampler_errors(model_and_params):
    model, params = model_and_params
    _, _, cache = prefilled_prompts(model, params)
    canvas = jnp.full((2, 4), MASK_ID)
    with pytest.raises(ValueError, match="before_logits"):
        denoise_canvas(model, params, cache, canvas, 0, sampler=shift_sampler())
    with pytest.raises(ValueError, match="self_conditioning=False"):
        denoise_canvas(
            model, params, cache, canvas, 0, sampler=shift_sampler(self_conditioning=None), before_logits=None
        )
