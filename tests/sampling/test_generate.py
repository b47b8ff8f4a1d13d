"""Block-autoregressive generation and the AR baseline (`sampling/generate.py`, `autoregressive.py`): errors, rows
stopping independently, padded batches, the cache end, greedy AR with a cache equal to full forwards, top-k / top-p
filters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny_sampling import CACHE, CANVAS, PROMPTS, VOCAB, WIDTH, forward, uniform_sampler

from hackable_diffusion.data.tokenizers import BOS_ID, EOS_ID, PAD_ID
from hackable_diffusion.models import transformer as T
from hackable_diffusion.sampling.autoregressive import ARSampling, generate_ar
from hackable_diffusion.sampling.generate import generate
from hackable_diffusion.sampling.prompts import pad_prompts
from hackable_diffusion.sampling.sampler import DiffusionSampler


def test_generate_errors_never_wrap(model_and_params):
    model, params = model_and_params
    sampler = uniform_sampler()
    with pytest.raises(ValueError, match="cache slots"):
        generate(model, params, PROMPTS, sampler=sampler, key=0, max_new_tokens=8, cache_length=8)
    with pytest.raises(ValueError, match="cache slots"):  # a canvas longer than the whole context
        generate(
            model, params, PROMPTS, sampler=sampler.replace(canvas_length=64), key=0, max_new_tokens=8, cache_length=32
        )
    with pytest.raises(ValueError, match=r"rows \[1\] have no real token"):
        generate(model, params, [[BOS_ID, 4], []], sampler=sampler, key=0, max_new_tokens=8)
    with pytest.raises(ValueError, match="empty prompt"):
        generate(model, params, jnp.zeros((1, 0), jnp.int32), sampler=sampler, key=0, max_new_tokens=8)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, params, PROMPTS, sampler=sampler, key=0, max_new_tokens=0)
    with pytest.raises(ValueError, match="vocab_size"):
        generate(model, params, PROMPTS, sampler=DiffusionSampler.diffusiongemma(VOCAB + 1), key=0, max_new_tokens=8)
    with pytest.raises(ValueError, match="keys for a batch"):
        generate(model, params, PROMPTS, sampler=sampler, key=jax.random.split(jax.random.key(0), 3), max_new_tokens=8)
    no_sc_model = T.Transformer(model.cfg.replace(self_conditioning=False))
    with pytest.raises(ValueError, match="no self-conditioner"):
        generate(no_sc_model, params, PROMPTS, sampler=sampler.replace(self_conditioning=True), key=0, max_new_tokens=8)
    with pytest.raises(ValueError, match="num_steps"):
        sampler.replace(num_steps=0)


@pytest.fixture(scope="module")
def batch_run(model_and_params):
    model, params = model_and_params
    keys = jax.random.split(jax.random.key(7), 2)
    # Row 0 gets a fixed EOS at generated position 5 (canvas 1): it must stop there. Row 1 gets a fixed infill
    # token at position 9 (canvas 2).
    fixed = np.zeros((2, 10), bool)
    given = np.zeros((2, 10), np.int32)
    fixed[0, 5], given[0, 5] = True, EOS_ID
    fixed[1, 9], given[1, 9] = True, 42
    kwargs = dict(sampler=uniform_sampler(), max_new_tokens=10)
    result = generate(model, params, PROMPTS, key=keys, fixed=fixed, fixed_tokens=given, **kwargs)
    return keys, fixed, given, kwargs, result


@pytest.mark.slow
def test_generate_stops_rows_independently_with_fixed_positions(batch_run):
    _, _, _, _, result = batch_run
    tokens = result.tokens
    assert tokens.shape == (2, 10)
    first_eos = np.flatnonzero(tokens[0] == EOS_ID)[0]
    assert first_eos <= 5 and (tokens[0, first_eos + 1 :] == PAD_ID).all()
    assert result.lengths[0] == first_eos + 1
    assert result.steps.shape == (2, 3) and result.steps[0, 2] == 0  # row 0 was done before canvas 2
    assert (result.steps[1] >= 1).all()
    if not (tokens[1, :9] == EOS_ID).any():
        assert tokens[1, 9] == 42  # the infilled token survives
    assert result.forward_passes == 1 + int(result.steps.max(axis=0).sum()) + result.num_canvases
    assert int(result.cache.end_index) == CACHE  # prompt width + every committed canvas


@pytest.mark.slow
def test_the_loop_over_canvases_on_device_equals_the_host_loop(model_and_params, batch_run):
    """`on_device=True` (one compiled loop over canvases) gives the host loop's tokens, lengths, steps, forward passes
    and cache: with fixed positions and rows stopping at different canvases, with every row stopping early (the
    loop ends before its last canvas), and with a masking sampler and a max_new_tokens that cuts the last canvas."""
    from _tiny_sampling import masking_sampler

    from hackable_diffusion.sampling import selection as S

    model, params = model_and_params
    keys, fixed, given, kwargs, host = batch_run
    cases = [(dict(key=keys, fixed=fixed, fixed_tokens=given, **kwargs), host)]
    early = np.zeros((2, 12), bool)
    early[:, 1] = True  # both rows forced to EOS in canvas 0: canvases 1 and 2 never run
    stop_early = dict(key=3, fixed=early, fixed_tokens=np.where(early, EOS_ID, 0), **dict(kwargs, max_new_tokens=12))
    masking = dict(key=5, sampler=masking_sampler(S.EntropyBound(0.5)), max_new_tokens=7)
    cases += [(stop_early, None), (masking, None)]
    for case, result in cases:
        result = result or generate(model, params, PROMPTS, **case)
        fused = generate(model, params, PROMPTS, on_device=True, **case)
        np.testing.assert_array_equal(fused.tokens, result.tokens)
        np.testing.assert_array_equal(fused.lengths, result.lengths)
        np.testing.assert_array_equal(fused.steps, result.steps)
        assert fused.forward_passes == result.forward_passes
        assert int(fused.cache.end_index) == int(result.cache.end_index)
        np.testing.assert_array_equal(fused.cache.valid, result.cache.valid)
        for a, b in zip(fused.cache.layers, result.cache.layers):
            np.testing.assert_allclose(a["k"], b["k"], atol=1e-6)
    assert generate(model, params, PROMPTS, on_device=True, **stop_early).steps.shape == (2, 1)  # stopped after one
    with pytest.raises(ValueError, match="on_device=False"):
        generate(model, params, PROMPTS, on_device=True, return_trajectory=True, **masking)


@pytest.mark.slow
def test_same_prompt_alone_and_in_a_padded_batch_give_the_same_tokens(model_and_params, batch_run):
    model, params = model_and_params
    keys, fixed, given, kwargs, result = batch_run
    alone = generate(model, params, [PROMPTS[0]], key=keys[0:1], fixed=fixed[:1], fixed_tokens=given[:1], **kwargs)
    np.testing.assert_array_equal(alone.tokens[0], result.tokens[0])
    np.testing.assert_array_equal(alone.steps[0], result.steps[0, : alone.num_canvases])
    again = generate(model, params, PROMPTS, key=keys, fixed=fixed, fixed_tokens=given, **kwargs)
    np.testing.assert_array_equal(again.tokens, result.tokens)  # same seed, same output
    other = generate(
        model, params, PROMPTS, key=jax.random.split(jax.random.key(8), 2), fixed=fixed, fixed_tokens=given, **kwargs
    )
    assert (other.tokens != result.tokens).any()


def test_short_cache_stops_before_a_canvas_that_would_not_fit(model_and_params, batch_run):
    model, params = model_and_params
    keys, fixed, given, kwargs, result = batch_run
    # The cache of the batch run (16 slots for prompt 4 + 3 canvases); ask for far more tokens than fit.
    alone = generate(
        model,
        params,
        [PROMPTS[0]],
        key=keys[0:1],
        sampler=kwargs["sampler"],
        max_new_tokens=40,
        cache_length=4 + 3 * CANVAS,
        stop_tokens=(),
    )
    assert alone.num_canvases == 3 and int(alone.cache.end_index) == 4 + 3 * CANVAS
    assert (alone.tokens[0, 3 * CANVAS :] == PAD_ID).all() and alone.lengths[0] == 3 * CANVAS


@pytest.mark.slow
def test_ar_greedy_with_cache_equals_argmax_of_full_forwards(model_and_params):
    model, params = model_and_params
    new = CACHE - WIDTH
    result = generate_ar(model, params, PROMPTS, key=0, max_new_tokens=new, stop_tokens=())
    assert result.forward_passes == 1 + new
    # Teacher-forced full causal forwards over [prompt; generated]: each prefix's next-token logits, both rows in one
    # right-padded batch (padding is exact, see test_model).
    seqs, seq_mask = pad_prompts([prompt + result.tokens[row].tolist() for row, prompt in enumerate(PROMPTS)])
    logits, _ = forward(model, params, seqs, token_mask=seq_mask, causal=True)
    for row, prompt in enumerate(PROMPTS):
        want = np.asarray(jnp.argmax(logits[row, len(prompt) - 1 : len(prompt) - 1 + new], axis=-1))
        np.testing.assert_array_equal(result.tokens[row], want)
    # Per-row stop: stop at a token row 0 produces; its later tokens become PAD, row 1 is unaffected unless it too
    # produces that token.
    stop = int(result.tokens[0, 2])
    stopped = generate_ar(model, params, PROMPTS, key=0, max_new_tokens=new, stop_tokens=(stop,))
    for row in range(2):
        hits = np.flatnonzero(result.tokens[row] == stop)
        end = hits[0] + 1 if hits.size else new
        np.testing.assert_array_equal(stopped.tokens[row, :end], result.tokens[row, :end])
        assert (stopped.tokens[row, end:] == PAD_ID).all() and stopped.lengths[row] == end


def test_ar_top_k_top_p_filters():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda s: np.asarray(s.filter_logits(logits) > -1e29)[0].tolist()
    assert kept(ARSampling(1.0, top_k=2)) == [True, True, False, False]
    assert kept(ARSampling(1.0, top_p=0.75)) == [True, True, False, False]  # 0.5 + 0.3 reaches 0.75
    assert kept(ARSampling(1.0, top_p=0.85)) == [True, True, True, False]
    assert kept(ARSampling(1.0, top_p=0.1)) == [True, False, False, False]  # the top token is always kept
    keys = jax.random.split(jax.random.key(0), 2000)
    draws = ARSampling(1.0, top_k=2)(keys, jnp.broadcast_to(logits, (2000, 4)))
    assert set(np.unique(draws).tolist()) == {0, 1}
    assert abs(float((draws == 0).mean()) - 0.625) < 0.05
    with pytest.raises(ValueError, match="top_p"):
        ARSampling(top_p=0.0)
