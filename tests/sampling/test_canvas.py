"""The canvas loop (`sampling/canvas.py`): what the sampler calls equals full forwards with hand-built masks; rows
stop independently; committed tokens never change; score and self-conditioning temperatures; the last step's
guarantees. Tiny random model."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny_sampling import (
    CACHE,
    CANVAS,
    VOCAB,
    forward,
    masking_sampler,
    prefilled_prompts,
    some_sc_signal,
    uniform_sampler,
)

from hackable_diffusion.data.tokenizers import EOS_ID, MASK_ID, PAD_ID
from hackable_diffusion.models import transformer as T
from hackable_diffusion.sampling import counts as C
from hackable_diffusion.sampling import early_stopping as E
from hackable_diffusion.sampling import scores as SC
from hackable_diffusion.sampling import selection as S
from hackable_diffusion.sampling import temperature as TEMP
from hackable_diffusion.sampling.canvas import canvas_logits, denoise_canvas
from hackable_diffusion.sampling.generate import (
    commit_canvas,
    truncate_at_stop,
)
from hackable_diffusion.sampling.prompts import prefill


def _self_condition(model, params, tokens, sc):
    emb = T.model_method(model, params, "embed", tokens)
    return model.apply({"params": params}, emb, sc, method=lambda m, e, s: m.self_conditioner(e, s))


@pytest.mark.slow
def test_canvas_logits_equal_full_forward_with_hand_built_mask(model_and_params):
    model, params = model_and_params
    prompt, prompt_mask, cache = prefilled_prompts(model, params)
    p = prompt.shape[1]
    canvas = jax.random.randint(jax.random.key(1), (2, CANVAS), 4, VOCAB)
    sc = some_sc_signal(model, params, 2)
    got = canvas_logits(model, params, cache, canvas, sc)

    token_mask = np.concatenate([np.asarray(prompt_mask), np.ones((2, CANVAS), bool)], axis=1)
    mask = np.zeros((2, p + CANVAS, p + CANVAS), bool)
    for row in range(2):
        for q in range(p + CANVAS):
            for k in range(p + CANVAS):
                visible = k <= q if q < p else True  # prompt causal; canvas sees every prompt token and itself
                mask[row, q, k] = visible and token_mask[row, k]
    embeddings = jax.jit(
        lambda p, c, x: jnp.concatenate(
            [T.model_method(model, params, "embed", p), _self_condition(model, params, c, x)], axis=1
        )
    )(prompt, canvas, sc)
    want, _ = forward(
        model,
        params,
        jnp.concatenate([prompt, canvas], axis=1),
        token_mask=jnp.asarray(token_mask),
        mask=jnp.asarray(mask),
        input_embeddings=embeddings,
    )
    np.testing.assert_allclose(got, want[:, p:], atol=3e-5)


def test_commit_then_next_canvas_equals_prefill_of_prompt_and_canvas(model_and_params):
    model, params = model_and_params
    prompt, prompt_mask, cache = prefilled_prompts(model, params)
    p = prompt.shape[1]
    raw = jnp.array([[20, EOS_ID, 21, 22], [30, 31, 32, 33]])
    canvas, stopped = truncate_at_stop(raw, jnp.array([EOS_ID]), jnp.array([True, True]))
    np.testing.assert_array_equal(canvas, [[20, EOS_ID, PAD_ID, PAD_ID], [30, 31, 32, 33]])
    np.testing.assert_array_equal(stopped, [True, False])

    committed = commit_canvas(model, params, cache, canvas)
    whole = jnp.concatenate([prompt, canvas], axis=1)
    whole_mask = jnp.concatenate([prompt_mask, canvas != PAD_ID], axis=1)
    _, prefilled = prefill(model, params, whole, whole_mask, cache_length=CACHE)
    assert int(committed.end_index) == int(prefilled.end_index) == p + CANVAS
    np.testing.assert_array_equal(committed.valid, prefilled.valid)
    np.testing.assert_array_equal(committed.positions, prefilled.positions)
    for a, b in zip(committed.layers, prefilled.layers):
        np.testing.assert_allclose(a["k"], b["k"], atol=3e-5)
        np.testing.assert_allclose(a["v"], b["v"], atol=3e-5)
    nxt = jnp.array([[40, 41, 42, 43], [44, 45, 46, 47]])
    sc = some_sc_signal(model, params, 3)
    np.testing.assert_allclose(
        canvas_logits(model, params, committed, nxt, sc), canvas_logits(model, params, prefilled, nxt, sc), atol=3e-5
    )
    # Row 0 holds 4 prompt + 2 canvas tokens, row 1 6 + 4: the next canvas continues each row's own count.
    np.testing.assert_array_equal(committed.next_positions(), [6, 10])


@dataclasses.dataclass(frozen=True)
class StopWhenFirstTokenEven(E.EarlyStopping):
    """A test rule whose stopping step differs from row to row."""

    def __call__(self, logits, previous, current, free, previous_argmax=None):
        return current[:, 0] % 2 == 0


@pytest.fixture(scope="module")
def prefix_cache(model_and_params):
    return prefilled_prompts(*model_and_params)[2]


@pytest.mark.slow
def test_early_stopping_stops_rows_independently_and_freezes_finished_rows(model_and_params, prefix_cache):
    model, params = model_and_params
    sampler = uniform_sampler(early_stopping=StopWhenFirstTokenEven(), num_steps=8)
    init = sampler.initial_canvas(jax.random.key(3), 2)
    fixed = jnp.array([[False, True, False, False]] * 2)
    init = init.at[:, 1].set(17)
    keys = jax.random.split(jax.random.key(4), 2)
    result = denoise_canvas(
        model, params, prefix_cache, init, keys, sampler=sampler, fixed=fixed, return_trajectory=True
    )
    traj = np.asarray(result.trajectory)
    steps = np.asarray(result.steps)
    assert len(set(steps.tolist())) > 1, f"rows should stop at different steps with this seed, got {steps}"
    for row in range(2):
        even = np.flatnonzero(traj[:, row, 0] % 2 == 0)
        expected = even[0] + 1 if even.size else sampler.num_steps
        assert steps[row] == expected  # the step that triggers the stop is kept
        for later in range(steps[row], sampler.num_steps):
            np.testing.assert_array_equal(traj[later, row], traj[steps[row] - 1, row])
        np.testing.assert_array_equal(result.canvas[row], traj[steps[row] - 1, row])
    assert int(result.forward_passes) == steps.max()
    assert (traj[:, :, 1] == 17).all()  # a fixed position never changes

    again = denoise_canvas(
        model, params, prefix_cache, init, keys, sampler=sampler, fixed=fixed, return_trajectory=True
    )
    np.testing.assert_array_equal(again.canvas, result.canvas)  # same key, same output
    inactive = denoise_canvas(
        model,
        params,
        prefix_cache,
        init,
        keys,
        sampler=sampler,
        fixed=fixed,
        active=jnp.array([True, False]),
        return_trajectory=True,
    )
    np.testing.assert_array_equal(inactive.canvas[1], init[1])
    assert int(inactive.steps[1]) == 0
    np.testing.assert_array_equal(inactive.canvas[0], result.canvas[0])  # other rows do not notice


def test_masking_sampler_never_changes_committed_tokens_and_threshold_progresses(model_and_params, prefix_cache):
    model, params = model_and_params
    sampler = masking_sampler(S.ConfidenceThreshold(tau=0.99), early_stopping=E.NoEarlyStop(), num_steps=8)
    fixed = jnp.array([[False, True, False, False], [False] * 4])
    init = jnp.where(fixed, 21, sampler.initial_canvas(jax.random.key(5), 2))
    result = denoise_canvas(
        model, params, prefix_cache, init, jax.random.key(6), sampler=sampler, fixed=fixed, return_trajectory=True
    )
    traj = np.concatenate([np.asarray(init)[None], np.asarray(result.trajectory)])
    assert not (np.asarray(result.canvas) == MASK_ID).any()  # everything unmasked
    assert (traj[:, np.asarray(fixed)] == 21).all()
    for step in range(1, traj.shape[0]):
        committed = traj[step - 1] != MASK_ID
        np.testing.assert_array_equal(traj[step][committed], traj[step - 1][committed])
    # At least one token per step: a row with n free positions needs at most n steps, and then stops.
    free = np.asarray(~fixed).sum(axis=1)
    assert (np.asarray(result.steps) <= free).all() and (np.asarray(result.steps) >= 1).all()


def test_score_temperature_ranks_by_the_models_own_probabilities(model_and_params, prefix_cache):
    """Near-greedy tokens (T = 1e-3) but margins scored at T = 1: the first committed position is the one whose raw
    top-1 minus top-2 probability is largest (at T = 1e-3 every margin would round to 1)."""
    model, params = model_and_params
    one_per_step = S.TopK(score=SC.Margin(), count=C.EvenCount())
    sampler = masking_sampler(
        one_per_step,
        early_stopping=E.NoEarlyStop(),
        num_steps=CANVAS,
        temperature=TEMP.AnnealedTemperature(1e-3, 1e-3),
        score_temperature=1.0,
    )
    init = sampler.initial_canvas(jax.random.key(9), 2)
    result = denoise_canvas(
        model, params, prefix_cache, init, jax.random.key(10), sampler=sampler, return_trajectory=True
    )
    null = T.model_method(model, params, "null_sc_signal", (2, CANVAS), kind=sampler.null_signal)
    logits = canvas_logits(model, params, prefix_cache, init, null) + sampler.logit_bias()
    top2 = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), 2)[0]
    first = np.asarray(result.trajectory[0]) != MASK_ID
    assert (first.sum(axis=1) == 1).all()
    expected = np.asarray(jnp.argmax(top2[..., 0] - top2[..., 1], axis=1))
    assert (expected != 0).any()  # ties at T = 1e-3 would go to position 0: the check can tell the two apart
    np.testing.assert_array_equal(first.argmax(axis=1), expected)
    with pytest.raises(ValueError, match="score_temperature"):
        sampler.replace(score_temperature=0.0)


@pytest.mark.slow
def test_sc_temperature_feeds_back_the_models_own_probabilities(model_and_params, prefix_cache):
    """Tokens drawn near-greedily (T = 1e-3); with sc_temperature=1 the second step is conditioned on the expected
    embedding under the first step's raw probabilities (what training feeds back), by default on the T = 1e-3 ones."""
    model, params = model_and_params
    near_greedy = TEMP.AnnealedTemperature(1e-3, 1e-3)
    sampler = masking_sampler(
        S.TopK(score=SC.Margin(), count=C.EvenCount()),
        early_stopping=E.NoEarlyStop(),
        num_steps=2,
        temperature=near_greedy,
        score_temperature=1.0,
    )
    init = sampler.initial_canvas(jax.random.key(11), 2)
    null = T.model_method(model, params, "null_sc_signal", (2, CANVAS), kind=sampler.null_signal)
    first_logits = canvas_logits(model, params, prefix_cache, init, null) + sampler.logit_bias()

    def second_step_argmax(fed_back_logits, after_first):
        signal = T.model_method(model, params, "sc_signal", fed_back_logits)
        logits = canvas_logits(model, params, prefix_cache, after_first, signal) + sampler.logit_bias()
        return np.asarray(jnp.argmax(logits, axis=-1))

    finals = {}
    for sc_temperature in (None, 1.0):
        run = sampler.replace(sc_temperature=sc_temperature)
        result = denoise_canvas(
            model, params, prefix_cache, init, jax.random.key(12), sampler=run, return_trajectory=True
        )
        after_first = result.trajectory[0]
        fed_back = first_logits / (1e-3 if sc_temperature is None else sc_temperature)
        left = np.asarray(after_first) == MASK_ID  # decided by the second step
        assert left.sum() == 4  # two cells per row per step
        np.testing.assert_array_equal(np.asarray(result.canvas)[left], second_step_argmax(fed_back, after_first)[left])
        finals[sc_temperature] = np.asarray(result.canvas)
    assert (finals[None] != finals[1.0]).any()  # the two signals lead to different cells: the check tells them apart
    with pytest.raises(ValueError, match="sc_temperature"):
        sampler.replace(sc_temperature=0.0)


@pytest.mark.parametrize("early_stopping", [E.NoEarlyStop(), E.EntropyBelow(threshold=1e9)])
def test_masking_canvas_ends_unmasked_with_a_short_budget(model_and_params, prefix_cache, early_stopping):
    """Entropy-bound accepts few positions of an unsure model; the last step (or an early stop) still leaves no MASK."""
    model, params = model_and_params
    sampler = masking_sampler(S.EntropyBound(gamma=0.0), early_stopping=early_stopping, num_steps=2)
    init = sampler.initial_canvas(jax.random.key(7), 2)
    result = denoise_canvas(model, params, prefix_cache, init, jax.random.key(8), sampler=sampler)
    assert not (np.asarray(result.canvas) == MASK_ID).any()


def test_uniform_canvas_last_step_takes_every_candidate(model_and_params, prefix_cache):
    """The reference re-noises every position its rule does not accept, on the budget's last step too; here the last
    step leaves no fresh noise token. With a rule that accepts one position per step and a near-greedy temperature, a
    one-step budget returns the model's argmax at every position (up to near-ties), not one argmax and noise."""
    model, params = model_and_params
    sampler = uniform_sampler(
        selection=S.EntropyBound(gamma=0.0),
        temperature=TEMP.ConstantTemperature(1e-4),
        early_stopping=E.NoEarlyStop(),
        num_steps=1,
        self_conditioning=False,
    )
    init = sampler.initial_canvas(jax.random.key(11), 2)
    result = denoise_canvas(model, params, prefix_cache, init, jax.random.key(12), sampler=sampler)
    null = T.model_method(model, params, "null_sc_signal", init.shape, kind=sampler.null_signal)
    logits = np.asarray(canvas_logits(model, params, prefix_cache, init, null), np.float32)
    chosen = np.take_along_axis(logits, np.asarray(result.canvas)[..., None], axis=-1)[..., 0]
    np.testing.assert_array_less(logits.max(axis=-1) - 0.05, chosen)


def test_a_committing_uniform_sampler_keeps_what_it_accepted_and_the_reference_does_not(model_and_params, prefix_cache):
    """`commit`: a token accepted at one step is the token at every later step (the dilated rule, one position a
    step on a canvas of 4); the reference sampler (commit off) re-draws accepted positions, and a masking sampler
    refuses the flag."""
    model, params = model_and_params
    common = dict(
        selection=S.make_selection("dilated"), early_stopping=E.NoEarlyStop(), num_steps=CANVAS,
        temperature=TEMP.ConstantTemperature(5.0),  # hot: a re-drawn token differs
    )  # fmt: skip
    init = uniform_sampler().initial_canvas(jax.random.key(13), 2)
    runs = {}
    for commit in (True, False):
        result = denoise_canvas(
            model, params, prefix_cache, init, jax.random.key(14), sampler=uniform_sampler(commit=commit, **common),
            return_trajectory=True,
        )  # fmt: skip
        runs[commit] = np.asarray(result.trajectory)
        assert np.asarray(result.steps).tolist() == [CANVAS, CANVAS]  # no early stop with positions undecided
    order = np.argsort(SC.dilated_rank(CANVAS))  # the position the rule decides at each step
    kept = runs[True]
    for step, position in enumerate(order):
        assert (kept[step:, :, position] == kept[-1][None, :, position]).all()
    assert any((runs[False][step:, :, p] != runs[False][-1][None, :, p]).any() for step, p in enumerate(order[:-1]))
    with pytest.raises(ValueError, match="commit"):
        masking_sampler(S.make_selection("dilated"), commit=True)
