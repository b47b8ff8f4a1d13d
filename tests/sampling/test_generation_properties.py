"""Property-based checks (hypothesis) of generation where the reference implementation has bugs: a batch of prompts
padded on random sides equals each prompt alone, and block generation near the cache end is refused or exact.

Shapes are fixed per property so that every example reuses the same compiled programs; hypothesis draws contents,
lengths, padding sides and offsets. `HD_HYPOTHESIS_PROFILE=thorough` runs thousands of examples (tests/_hypothesis_profiles.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _hypothesis_profiles import THOROUGH
from hypothesis import given, settings
from hypothesis import strategies as st

from hackable_diffusion.data.tokenizers import BOS_ID
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.sampling.generate import generate
from hackable_diffusion.sampling.sampler import DiffusionSampler

pytestmark = pytest.mark.slow

VOCAB, WIDTH, BATCH, CANVAS = 48, 6, 3, 4


ATOL = 1e-4  # float32 noise: a different cache size changes the softmax summation order


@pytest.fixture(scope="module")
def model_and_params():
    """Local layers with a window of 3 (smaller than prompt + canvas) and a global layer; a self-conditioner."""
    shape = dict(presets.tiny(vocab_size=VOCAB, moe=False), sliding_window=3, self_conditioning=True)
    shape["layer_pattern"] = ("local", "global")
    model = T.Transformer(TransformerConfig.from_dict(shape))
    params = jax.jit(lambda k: T.init_params(model, k))(jax.random.key(0))
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: x * 6.0 if "embedder" in jax.tree_util.keystr(p) else x, params
    )  # sharper than a fresh init, so that differences are visible
    return model, params


append = jax.jit(T.append, static_argnums=0)


decode_block = T.decode_block


def padded_batch(prompts, left):
    """Prompts padded to WIDTH on the left or the right (per row), with their masks."""
    tokens = np.zeros((len(prompts), WIDTH), np.int32)
    mask = np.zeros((len(prompts), WIDTH), bool)
    for i, (prompt, on_left) in enumerate(zip(prompts, left)):
        start = WIDTH - len(prompt) if on_left else 0
        tokens[i, start : start + len(prompt)] = prompt
        mask[i, start : start + len(prompt)] = True
    return jnp.asarray(tokens), jnp.asarray(mask)


prompt_strategy = st.lists(st.integers(4, VOCAB - 1), min_size=1, max_size=WIDTH)


@settings(max_examples=THOROUGH and 2000 or 8)
@given(
    prompts=st.lists(prompt_strategy, min_size=BATCH, max_size=BATCH),
    left=st.lists(st.booleans(), min_size=BATCH, max_size=BATCH),
    next_tokens=st.lists(st.integers(4, VOCAB - 1), min_size=BATCH, max_size=BATCH),
    canvas=st.lists(st.integers(0, VOCAB - 1), min_size=BATCH * CANVAS, max_size=BATCH * CANVAS),
)
def test_padded_batch_equals_each_prompt_alone(model_and_params, prompts, left, next_tokens, canvas):
    """Prefill, one-token decode, a canvas in decoder mode and a committed canvas: each row of a batch of prompts of
    random lengths, padded on random sides, gives what the prompt gives alone (local and global layers)."""
    model, params = model_and_params
    tokens, mask = padded_batch(prompts, left)
    canvas = jnp.asarray(np.array(canvas, np.int32).reshape(BATCH, CANVAS))
    nxt = jnp.asarray(np.array(next_tokens, np.int32)[:, None])
    sc = T.model_method(model, params, "null_sc_signal", (BATCH, CANVAS))

    cache = init_cache(model.cfg, BATCH, WIDTH + 1 + CANVAS + 1)
    pre, cache = append(model, params, tokens, cache, token_mask=mask)
    step, cache = append(model, params, nxt, cache)
    denoised, _ = decode_block(model, params, canvas, cache, sc_signal=sc)
    _, committed = append(model, params, canvas, cache)
    after, _ = append(model, params, nxt, committed)

    for row, prompt in enumerate(prompts):
        alone = init_cache(model.cfg, 1, WIDTH + 1 + CANVAS + 1)  # one cache size: one compile of each step
        a_pre, alone = append(model, params, jnp.asarray([prompt], jnp.int32), alone)
        a_step, alone = append(model, params, nxt[row : row + 1], alone)
        a_den, _ = decode_block(model, params, canvas[row : row + 1], alone, sc_signal=sc[row : row + 1])
        _, a_com = append(model, params, canvas[row : row + 1], alone)
        a_after, _ = append(model, params, nxt[row : row + 1], a_com)
        np.testing.assert_allclose(np.asarray(pre)[row][np.asarray(mask)[row]], np.asarray(a_pre)[0], atol=ATOL)
        np.testing.assert_allclose(np.asarray(step)[row], np.asarray(a_step)[0], atol=ATOL)
        np.testing.assert_allclose(np.asarray(denoised)[row], np.asarray(a_den)[0], atol=ATOL)
        np.testing.assert_allclose(np.asarray(after)[row], np.asarray(a_after)[0], atol=ATOL)


@settings(max_examples=THOROUGH and 1000 or 8)  # each cache length compiles the sampler once
@given(
    prompt_len=st.sampled_from([1, 4]),
    canvases=st.integers(1, 2),
    slack=st.sampled_from([-CANVAS - 1, -CANVAS, -1, 0, 1, CANVAS - 1, CANVAS]),
    seed=st.integers(0, 2**16),
)
def test_block_generation_near_the_cache_end_is_refused_or_exact(model_and_params, prompt_len, canvases, slack, seed):
    """Asking for canvases around the cache's length: either refused up front, or every canvas produced is the one a
    roomy cache produces (nothing wraps around to overwrite the prompt)."""
    model, params = model_and_params
    sampler = DiffusionSampler.diffusiongemma(VOCAB, num_steps=2, canvas_length=CANVAS)
    prompt = [[BOS_ID] + list(range(4, 4 + prompt_len - 1))] if prompt_len > 1 else [[BOS_ID]]
    wanted = canvases * CANVAS
    cache_length = prompt_len + wanted + slack
    roomy = generate(
        model,
        params,
        prompt,
        sampler=sampler,
        key=seed,
        max_new_tokens=wanted,
        cache_length=prompt_len + wanted + CANVAS,
        stop_tokens=(),
    )
    try:
        tight = generate(
            model,
            params,
            prompt,
            sampler=sampler,
            key=seed,
            max_new_tokens=wanted,
            cache_length=cache_length,
            stop_tokens=(),
        )
    except ValueError as err:
        assert "cache" in str(err)
        assert cache_length < prompt_len + wanted
        return
    produced = int(np.asarray(tight.lengths)[0])
    assert produced <= wanted and produced % CANVAS == 0
    assert prompt_len + produced <= cache_length  # never past the end
    np.testing.assert_array_equal(np.asarray(tight.tokens)[0, :produced], np.asarray(roomy.tokens)[0, :produced])
