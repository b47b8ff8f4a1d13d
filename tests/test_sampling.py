"""Sampling tests: cache equivalences of what the sampler calls, selection rules on hand-made logits, early stopping,
the canvas loop's invariants, block-autoregressive generation (errors, batching, determinism, infilling) and the AR
baseline. Tiny random model; shapes are shared between tests so each jit compiles once."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion.data.tokenizers import BOS_ID, EOS_ID, MASK_ID, PAD_ID
from hackable_diffusion.diffusion.processes import MaskingProcess
from hackable_diffusion.diffusion.schedules import LinearSchedule
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.sampling import early_stopping as E
from hackable_diffusion.sampling import selection as S
from hackable_diffusion.sampling import temperature as TEMP
from hackable_diffusion.sampling.canvas import DiffusionSampler, canvas_logits, denoise_canvas
from hackable_diffusion.sampling.generate import (
    ARSampling,
    commit_canvas,
    generate,
    generate_ar,
    pad_prompts,
    prefill,
    truncate_at_stop,
)

# Jitted model calls (an eager linen pass over a scanned model is far slower than compiling it once).
forward = jax.jit(T.forward, static_argnums=0, static_argnames=("causal",))

VOCAB = 64
CANVAS = 4
STEPS = 6


@pytest.fixture(scope="module")
def model_and_params():
    cfg = TransformerConfig.from_dict(dict(presets.tiny(vocab_size=VOCAB, moe=False), self_conditioning=True))
    model = T.Transformer(cfg)
    params = jax.jit(lambda key: T.init_params(model, key))(jax.random.key(0))
    # Sharper predictions than a fresh init, so entropies and confidences are not all near their maxima.
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x * 8.0 if "embedder" in jax.tree_util.keystr(path) else x, params
    )
    return model, params


def uniform_sampler(**changes):
    return DiffusionSampler.diffusiongemma(VOCAB, num_steps=STEPS, canvas_length=CANVAS).replace(**changes)


def masking_sampler(selection, **changes):
    options = dict(num_steps=STEPS, canvas_length=CANVAS) | changes
    return DiffusionSampler(MaskingProcess(VOCAB, LinearSchedule(), MASK_ID), selection=selection, **options)


PROMPTS = [[BOS_ID, 5, 6, 7], [BOS_ID, 9, 10, 11, 12, 13]]  # different lengths: row 0 is right-padded in a batch
WIDTH = 6
CACHE = WIDTH + 3 * CANVAS  # every two-row test uses this cache, so each jitted function compiles once


def prefilled_prompts(model, params):
    prompt, prompt_mask = pad_prompts(PROMPTS)
    _, cache = prefill(model, params, prompt, prompt_mask, cache_length=CACHE)
    return prompt, prompt_mask, cache


def some_sc_signal(model, params, seed):
    logits = jax.random.normal(jax.random.key(seed), (2, CANVAS, VOCAB))
    return jax.jit(lambda x: T.model_method(model, params, "sc_signal", x))(logits)


def logits_from_probs(probs):
    return jnp.log(jnp.asarray(probs, jnp.float32))


def info(step=0, num_steps=4, free=None, persistent=True, shape=(1, 4)):
    free = jnp.ones(shape, bool) if free is None else jnp.asarray(free)
    return S.StepInfo.at(step, num_steps, LinearSchedule(), free, persistent)


# ---------------------------------------------------------------------------------------------------------------------
# What the sampler calls vs. full forwards.
# ---------------------------------------------------------------------------------------------------------------------


def _self_condition(model, params, tokens, sc):
    emb = T.model_method(model, params, "embed", tokens)
    return model.apply({"params": params}, emb, sc, method=lambda m, e, s: m.self_conditioner(e, s))


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


# ---------------------------------------------------------------------------------------------------------------------
# Selection rules on hand-made logits.
# ---------------------------------------------------------------------------------------------------------------------

# Four positions with entropies (nats) ~0, 0.056, 0.693 and log 4 = 1.386 over a 4-token vocabulary.
PROBS = np.array(
    [
        [
            [1 - 3e-9, 1e-9, 1e-9, 1e-9],
            [0.99, 0.01 - 2e-9, 1e-9, 1e-9],
            [0.5, 0.5 - 2e-9, 1e-9, 1e-9],
            [0.25, 0.25, 0.25, 0.25],
        ]
    ]
)
KEYS1 = jax.random.split(jax.random.key(0), 1)


def test_entropy_bound_accepts_while_the_exclusive_sum_is_within_gamma():
    logits = logits_from_probs(PROBS)
    h = np.asarray(S.entropy(logits))[0]
    assert h[0] < 1e-6 and abs(h[3] - math.log(4)) < 1e-5
    cand = jnp.zeros((1, 4), jnp.int32)
    undecided = jnp.ones((1, 4), bool)
    for gamma, expected in [(0.0, [1, 0, 0, 0]), (0.05, [1, 1, 0, 0]), (0.1, [1, 1, 1, 0]), (0.8, [1, 1, 1, 1])]:
        accept, remask = S.EntropyBound(gamma)(KEYS1, logits, cand, undecided, info())
        np.testing.assert_array_equal(accept[0], np.array(expected, bool), err_msg=f"gamma={gamma}")
        assert not remask.any()
    # Masking: only undecided positions enter the sum, and at least one is always accepted.
    undecided = jnp.array([[False, False, True, True]])
    accept, _ = S.EntropyBound(0.0)(KEYS1, logits, cand, undecided, info())
    np.testing.assert_array_equal(accept[0], [False, False, True, False])
    accept, _ = S.EntropyBound(0.7)(KEYS1, logits, cand, undecided, info())
    np.testing.assert_array_equal(accept[0], [False, False, True, True])


def test_entropy_bound_min_count_spreads_a_step_budget():
    # Eight uncertain positions (entropy rising with the index): gamma 0.1 alone accepts one per step.
    flat = np.linspace(0.6, 0.25, 8)
    probs = np.stack([flat] + [(1 - flat) / 3] * 3, axis=-1)
    logits = logits_from_probs(probs)[None]
    cand = jnp.zeros((1, 8), jnp.int32)
    undecided = jnp.ones((1, 8), bool)
    plain, _ = S.EntropyBound(0.1)(KEYS1, logits, cand, undecided, info(step=0, num_steps=4, shape=(1, 8)))
    np.testing.assert_array_equal(plain[0], [1, 0, 0, 0, 0, 0, 0, 0])
    rule = S.make_selection("entropy_bound", gamma=0.1, min_count="even")
    assert rule == S.EntropyBound(0.1, min_count=S.EvenCount())
    # Budget of 4 steps for 8 positions: the even share, lowest entropies first.
    first, _ = rule(KEYS1, logits, cand, undecided, info(step=0, num_steps=4, shape=(1, 8)))
    np.testing.assert_array_equal(first[0], [1, 1, 0, 0, 0, 0, 0, 0])
    # Step 2 of 4 with only 3 decided (target 6): three more, among the undecided only.
    undecided = jnp.array([[False, True, False, True, False, True, True, True]])
    third, _ = rule(KEYS1, logits, cand, undecided, info(step=2, num_steps=4, shape=(1, 8)))
    np.testing.assert_array_equal(third[0], [0, 1, 0, 1, 0, 1, 0, 0])
    # Ahead of the budget the floor is one position; a generous bound still accepts more than the floor.
    ahead = jnp.array([[False] * 6 + [True] * 2])
    one, _ = rule(KEYS1, logits, cand, ahead, info(step=0, num_steps=4, shape=(1, 8)))
    np.testing.assert_array_equal(one[0], [0, 0, 0, 0, 0, 0, 1, 0])
    wide, _ = S.EntropyBound(100.0, min_count=S.EvenCount())(KEYS1, logits, cand, ahead, info(shape=(1, 8)))
    np.testing.assert_array_equal(wide[0], np.asarray(ahead[0]))


def test_confidence_threshold_accepts_confident_positions_and_always_progresses():
    logits = logits_from_probs(PROBS)
    cand = jnp.array([[0, 0, 1, 2]])  # confidences 1, 0.99, 0.5, 0.25
    undecided = jnp.ones((1, 4), bool)
    accept, _ = S.ConfidenceThreshold(0.9)(KEYS1, logits, cand, undecided, info())
    np.testing.assert_array_equal(accept[0], [True, True, False, False])
    # Nothing reaches tau among the undecided: exactly the most confident one is accepted.
    undecided = jnp.array([[False, False, True, True]])
    accept, _ = S.ConfidenceThreshold(0.9)(KEYS1, logits, cand, undecided, info())
    np.testing.assert_array_equal(accept[0], [False, False, True, False])
    accept, _ = S.ConfidenceThreshold(1.0)(KEYS1, logits, cand, jnp.zeros((1, 4), bool), info())
    assert not accept.any()  # nothing undecided, nothing accepted


def test_top_k_scores_and_counts():
    probs = (
        np.array(
            [
                [
                    [0.6, 0.4, 0.0, 0.0],  # confidence 0.6, margin 0.2
                    [0.5, 0.1, 0.05, 0.35],  # confidence 0.5, margin 0.15
                    [0.45, 0.05, 0.05, 0.45],  # margin 0
                    [0.9, 0.1, 0.0, 0.0],
                ]
            ]
        )
        + 1e-12
    )  # confidence 0.9, margin 0.8
    logits = logits_from_probs(probs)
    cand = jnp.zeros((1, 4), jnp.int32)
    undecided = jnp.ones((1, 4), bool)

    class Two:
        def __call__(self, n, info):
            return jnp.minimum(2, n)

    for score, expected in [(S.Confidence(), [1, 0, 0, 1]), (S.Margin(), [1, 0, 0, 1]), (S.NegEntropy(), [1, 0, 0, 1])]:
        accept, _ = S.TopK(score=score, count=Two())(KEYS1, logits, cand, undecided, info())
        np.testing.assert_array_equal(accept[0], np.array(expected, bool), err_msg=str(score))
    np.testing.assert_allclose(S.Margin()(logits, cand)[0], [0.2, 0.15, 0.0, 0.8], atol=1e-6)
    accept, _ = S.TopK(score=S.Confidence(), count=Two())(KEYS1, logits, cand, jnp.array([[0, 1, 1, 0]], bool), info())
    np.testing.assert_array_equal(accept[0], [False, True, True, False])  # only undecided positions compete


@pytest.mark.parametrize(
    "count", [S.ScheduleCount(), S.CosineCount(), S.EvenCount(), S.PowerCount(2.0), S.PowerCount(0.5)]
)
def test_counts_unmask_everything_by_the_last_step(count):
    num_steps, n = 7, 10
    free = jnp.ones((1, n), bool)
    undecided, history = n, []
    for step in range(num_steps):
        k = int(count(jnp.array([undecided]), S.StepInfo.at(step, num_steps, LinearSchedule(), free, True))[0])
        assert 1 <= k <= undecided or undecided == 0
        history.append(k)
        undecided -= k
    assert undecided == 0, history
    if isinstance(count, S.EvenCount):
        assert history == [2, 2, 2, 1, 1, 1, 1]  # LLaDA: 10 // 7 = 1 per step, remainder 3 to the first steps
    if isinstance(count, S.PowerCount):  # decided after step i: round(10 ((i+1)/7)^e)
        targets = [round(n * ((i + 1) / num_steps) ** count.exponent) for i in range(num_steps)]
        expected, decided = [], 0
        for target in targets:  # each step decides at least one position while any is left
            step_k = min(max(target - decided, 1), n - decided)
            expected.append(step_k)
            decided += step_k
        assert history == expected, (history, targets)
        assert (history[0] < history[-1]) == (count.exponent > 1), history
    if isinstance(count, S.ScheduleCount):  # uniform process: #free * alpha(s), all at the last step
        k = count(jnp.array([n]), S.StepInfo.at(2, 4, LinearSchedule(), free, False))
        assert int(k[0]) == round(n * float(LinearSchedule().alpha(0.25)))


def test_ancestral_unmask_probability_matches_md4():
    n = 20000
    logits = jnp.zeros((1, n, 4))
    cand = jnp.zeros((1, n), jnp.int32)
    step_info = info(step=1, num_steps=4, shape=(1, n))
    accept, _ = S.Ancestral()(KEYS1, logits, cand, jnp.ones((1, n), bool), step_info)
    a_s, a_t = float(step_info.alpha_s), float(step_info.alpha_t)
    expected = (a_s - a_t) / (1 - a_t)  # ~1/3 for the linear schedule, t = 0.75 -> s = 0.5
    assert abs(float(accept.mean()) - expected) < 4 * math.sqrt(expected * (1 - expected) / n)
    last, _ = S.Ancestral()(KEYS1, logits, cand, jnp.ones((1, n), bool), info(step=3, num_steps=4, shape=(1, n)))
    assert last.all()


def test_remdm_remasks_decided_tokens_with_probability_sigma():
    n = 20000
    free = jnp.ones((1, n), bool)
    undecided = jnp.arange(n)[None] % 2 == 0
    step_info = info(step=1, num_steps=4, free=free, shape=(1, n))
    a_s, a_t = float(step_info.alpha_s), float(step_info.alpha_t)
    sigma_max = min(1.0, (1 - a_s) / a_t)
    for rule, sigma in [(S.ReMDMCap(eta=0.2), min(0.2, sigma_max)), (S.ReMDMRescale(eta=0.5), 0.5 * sigma_max)]:
        accept, remask = rule(KEYS1, jnp.zeros((1, n, 4)), jnp.zeros((1, n), jnp.int32), undecided, step_info)
        assert not (accept & ~undecided).any() and not (remask & undecided).any()
        half = n // 2
        assert abs(float(remask.sum()) / half - sigma) < 4 * math.sqrt(sigma / half)
        unmask = (a_s - (1 - sigma) * a_t) / (1 - a_t)
        assert abs(float(accept.sum()) / half - unmask) < 4 * math.sqrt(unmask / half)
    with pytest.raises(ValueError, match="MaskingProcess"):
        uniform_sampler(selection=S.ReMDMCap())


def test_gumbel_top_k_noise_is_float32_and_seeded():
    logits = jnp.zeros((1, 8, 4))
    rule = S.TopK(score=S.Confidence(), count=S.ScheduleCount(), gumbel_scale=1.0)
    a, _ = rule(KEYS1, logits, jnp.zeros((1, 8), jnp.int32), jnp.ones((1, 8), bool), info(shape=(1, 8)))
    b, _ = rule(KEYS1, logits, jnp.zeros((1, 8), jnp.int32), jnp.ones((1, 8), bool), info(shape=(1, 8)))
    np.testing.assert_array_equal(a, b)
    assert S.row_gumbel(KEYS1, (3,)).dtype == jnp.float32


def test_top_k_also_above_adds_every_sure_position_to_the_count():
    # Margins by position: 0.98, 0.02, 0.9, 0.6, 0.98, 0.3 (top-2 of [p, 1-p] style rows); position 4 is decided.
    top = np.array([0.99, 0.51, 0.95, 0.8, 0.99, 0.65])
    probs = np.stack([top, 1 - top, np.full(6, 1e-9), np.full(6, 1e-9)], axis=-1)
    logits = logits_from_probs(probs)[None]
    undecided = jnp.array([[True, True, True, True, False, True]])
    cands = jnp.zeros((1, 6), jnp.int32)
    step = info(step=0, num_steps=6, shape=(1, 6))  # the even count decides one of the five undecided positions
    plain, _ = S.TopK(score=S.Margin())(KEYS1, logits, cands, undecided, step)
    np.testing.assert_array_equal(plain[0], [True, False, False, False, False, False])
    sure, _ = S.TopK(score=S.Margin(), also_above=0.85)(KEYS1, logits, cands, undecided, step)
    np.testing.assert_array_equal(sure[0], [True, False, True, False, False, False])  # + margin 0.9, not decided 4
    every, _ = S.TopK(score=S.Margin(), also_above=0.01)(KEYS1, logits, cands, undecided, step)
    np.testing.assert_array_equal(every[0], np.asarray(undecided[0]))
    assert S.make_selection("top_k_margin", also_above=0.9) == S.TopK(score=S.Margin(), also_above=0.9)
    with pytest.raises(ValueError, match="also_above"):
        S.TopK(also_above=1.5)


# ---------------------------------------------------------------------------------------------------------------------
# Temperature and early-stopping rules.
# ---------------------------------------------------------------------------------------------------------------------


def test_annealed_temperature_closed_form():
    temp = TEMP.AnnealedTemperature()
    np.testing.assert_allclose([temp(1.0), temp(0.0), temp(1 - 47 / 48)], [0.8, 0.4, 0.8 - 0.4 * 47 / 48], rtol=1e-6)
    np.testing.assert_allclose(TEMP.AnnealedTemperature(0.2, 1.0, 2.0)(0.5), 0.2 + 0.8 * 0.75, rtol=1e-6)
    np.testing.assert_allclose(TEMP.ConstantTemperature(0.7)(jnp.zeros(3)), [0.7] * 3)
    with pytest.raises(ValueError, match="min_temperature"):
        TEMP.AnnealedTemperature(0.9, 0.8)


def test_early_stopping_rules_per_row():
    sharp = logits_from_probs(np.array([[1 - 3e-9, 1e-9, 1e-9, 1e-9], [1e-9, 1 - 3e-9, 1e-9, 1e-9]]))
    flat = jnp.zeros((2, 4))
    logits = jnp.stack([sharp, flat])  # row 0 confident (argmax [0, 1]), row 1 uniform (argmax [0, 0])
    previous = jnp.array([[0, 1], [0, 0]])
    current = jnp.array([[0, 2], [0, 0]])
    free = jnp.ones((2, 2), bool)
    np.testing.assert_array_equal(E.TokenStability()(logits, previous, current, free), [True, True])
    np.testing.assert_array_equal(E.TokenStability(against="output")(logits, previous, current, free), [False, True])
    np.testing.assert_array_equal(E.EntropyBelow(0.005)(logits, previous, current, free), [True, False])
    np.testing.assert_array_equal(
        E.Chained([E.TokenStability(), E.EntropyBelow()])(logits, previous, current, free), [True, False]
    )
    # Fixed positions do not count: row 0 disagrees only at a fixed position.
    np.testing.assert_array_equal(
        E.TokenStability()(logits, jnp.array([[0, 3], [1, 1]]), current, jnp.array([[True, False], [True, True]])),
        [True, False],
    )
    assert not E.NoEarlyStop()(logits, previous, current, free).any()
    with pytest.raises(ValueError, match="non-empty"):
        E.Chained(())


def test_unknown_names_raise():
    with pytest.raises(ValueError, match="unknown selection rule 'nope'"):
        S.make_selection("nope")
    with pytest.raises(ValueError, match="unknown temperature"):
        TEMP.make_temperature("hot")
    with pytest.raises(ValueError, match="unknown early-stopping"):
        E.make_early_stopping("never")
    with pytest.raises(ValueError, match="does not take"):
        S.make_selection("entropy_bound", tau=0.3)
    assert S.make_selection("top_k_margin", gumbel_scale=0.5) == S.TopK(score=S.Margin(), gumbel_scale=0.5)
    assert S.make_selection("maskgit").count == S.CosineCount()
    assert S.make_selection("top_k_margin", count="power:1.5").count == S.PowerCount(1.5)
    assert S.make_selection("top_k_margin", count="cosine").count == S.CosineCount()
    for bad, message in [("power:x", "power:x"), ("cosine:2", "takes no argument"), ("fast", "unknown count rule")]:
        with pytest.raises(ValueError, match=message):
            S.make_selection("top_k_margin", count=bad)
    with pytest.raises(ValueError, match="exponent must be > 0"):
        S.PowerCount(0.0)


# ---------------------------------------------------------------------------------------------------------------------
# The canvas loop.
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StopWhenFirstTokenEven(E.EarlyStopping):
    """A test rule whose stopping step differs from row to row."""

    def __call__(self, logits, previous, current, free, previous_argmax=None):
        return current[:, 0] % 2 == 0


@pytest.fixture(scope="module")
def prefix_cache(model_and_params):
    return prefilled_prompts(*model_and_params)[2]


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
    one_per_step = S.TopK(score=S.Margin(), count=S.EvenCount())
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


def test_sc_temperature_feeds_back_the_models_own_probabilities(model_and_params, prefix_cache):
    """Tokens drawn near-greedily (T = 1e-3); with sc_temperature=1 the second step is conditioned on the expected
    embedding under the first step's raw probabilities (what training feeds back), by default on the T = 1e-3 ones."""
    model, params = model_and_params
    near_greedy = TEMP.AnnealedTemperature(1e-3, 1e-3)
    sampler = masking_sampler(
        S.TopK(score=S.Margin(), count=S.EvenCount()),
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


# ---------------------------------------------------------------------------------------------------------------------
# Block-autoregressive generation.
# ---------------------------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------------------------
# Autoregressive baseline.
# ---------------------------------------------------------------------------------------------------------------------


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
