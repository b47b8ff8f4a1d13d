"""Selection rules and count rules (`sampling/selection.py`) on hand-made logits: entropy bound, confidence threshold,
top-k with its scores, counts and sure positions, ancestral MD4 unmasking, ReMDM remasking, Gumbel noise, and the
factory's errors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny_sampling import info, logits_from_probs, uniform_sampler

from hackable_diffusion.diffusion.schedules import LinearSchedule
from hackable_diffusion.sampling import early_stopping as E
from hackable_diffusion.sampling import selection as S
from hackable_diffusion.sampling import temperature as TEMP

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


def test_left_to_right_rule_decodes_in_reading_order_skipping_what_is_decided():
    rule = S.make_selection("left_to_right")
    assert rule == S.TopK(score=S.LeftToRight(), count=S.EvenCount())
    logits = jax.random.normal(jax.random.key(2), (2, 6, 5))  # the logits do not matter
    cand = jnp.zeros((2, 6), jnp.int32)
    undecided = jnp.array([[False, True, True, False, True, True], [True] * 6])  # row 0: positions 0 and 3 given
    order = [[], []]
    for step in range(6):
        accept, remask = rule(KEYS1, logits, cand, undecided, info(step=step, num_steps=6, shape=(2, 6)))
        assert not remask.any() and not (accept & ~undecided).any()
        for row in range(2):
            order[row] += list(np.flatnonzero(accept[row]))
        undecided = undecided & ~accept
    assert order == [[1, 2, 4, 5], [0, 1, 2, 3, 4, 5]] and not undecided.any()
    two_steps, _ = rule(KEYS1, logits, cand, jnp.ones((2, 6), bool), info(step=0, num_steps=2, shape=(2, 6)))
    np.testing.assert_array_equal(two_steps[0], [1, 1, 1, 0, 0, 0])  # 6 positions in 2 steps: the left half first


def test_dilated_rule_decides_far_apart_positions_first_and_fills_the_gaps():
    assert list(np.argsort(S.dilated_rank(8))) == [0, 4, 2, 6, 1, 3, 5, 7]
    assert sorted(S.dilated_rank(12)) == list(range(12))  # any length: a permutation
    rule = S.make_selection("dilated")
    assert rule == S.TopK(score=S.DilatedOrder(), count=S.EvenCount())
    assert S.make_selection("dilated", count="cosine").count == S.CosineCount()
    # The logits do not matter: a canvas of 32 in 4 steps takes the multiples of 4, then 2 mod 4, then the odd ones.
    logits = jax.random.normal(jax.random.key(1), (2, 32, 5))
    cand = jnp.zeros((2, 32), jnp.int32)
    undecided = jnp.ones((2, 32), bool)
    steps = []
    for step in range(4):
        accept, remask = rule(KEYS1, logits, cand, undecided, info(step=step, num_steps=4, shape=(2, 32)))
        assert not remask.any() and not (accept & ~undecided).any()
        np.testing.assert_array_equal(accept[0], accept[1])
        steps.append(np.flatnonzero(accept[0]))
        undecided = undecided & ~accept
    assert not undecided.any()
    assert list(steps[0]) == list(range(0, 32, 4)) and list(steps[1]) == list(range(2, 32, 4))
    assert list(steps[2]) == list(range(1, 16, 2)) and list(steps[3]) == list(range(17, 32, 2))
    for chosen in steps:  # no two neighbours are decided in the same step
        assert np.all(np.diff(chosen) > 1)
    # Fixed positions are skipped: the order continues with the next undecided ones.
    undecided = jnp.ones((1, 8), bool).at[0, 0].set(False)
    accept, _ = rule(KEYS1, logits[:1, :8], cand[:1, :8], undecided, info(step=0, num_steps=2, shape=(1, 8)))
    np.testing.assert_array_equal(np.flatnonzero(accept[0]), [2, 4, 6])


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
    assert S.make_selection("top_k_margin", count="power", count_exponent=1.5).count == S.PowerCount(1.5)
    assert S.make_selection("top_k_margin", count="power").count == S.PowerCount()
    assert S.make_selection("top_k_margin", count="cosine").count == S.CosineCount()
    assert S.make_selection("entropy_bound", min_count="even").min_count == S.EvenCount()
    for count, exponent, message in [
        ("cosine", 2.0, "takes no exponent"),
        ("fast", None, "unknown count rule"),
        (None, 2.0, "count_exponent needs count='power'"),
    ]:
        with pytest.raises(ValueError, match=message):
            S.make_selection("top_k_margin", count=count, count_exponent=exponent)
    with pytest.raises(ValueError, match="exponent must be > 0"):
        S.PowerCount(0.0)
