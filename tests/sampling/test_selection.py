"""Selection rules and count rules (`sampling/selection.py`, `scores.py`, `counts.py`, `remasking.py`) on hand-made
logits: entropy bound, confidence threshold, top-k with its scores, counts and sure positions, ancestral MD4 unmasking,
ReMDM remasking, Gumbel noise, and the factory's errors."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny_sampling import info, logits_from_probs, uniform_sampler

from hackable_diffusion.diffusion.schedules import LinearSchedule
from hackable_diffusion.sampling import counts as C
from hackable_diffusion.sampling import early_stopping as E
from hackable_diffusion.sampling import remasking as RM
from hackable_diffusion.sampling import scores as SC
from hackable_diffusion.sampling import selection as S
from hackable_diffusion.sampling import selection_base as SB
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
    h = np.asarray(SC.entropy(logits))[0]
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
    assert rule == S.EntropyBound(0.1, min_count=C.EvenCount())
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
    wide, _ = S.EntropyBound(100.0, min_count=C.EvenCount())(KEYS1, logits, cand, ahead, info(shape=(1, 8)))
    np.testing.assert_array_equal(wide[0], np.asarray(ahead[0]))


def test_left_to_right_rule_decodes_in_reading_order_skipping_what_is_decided():
    rule = S.make_selection("left_to_right")
    assert rule == S.TopK(score=SC.LeftToRight(), count=C.EvenCount())
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
    assert list(np.argsort(SC.dilated_rank(8))) == [0, 4, 2, 6, 1, 3, 5, 7]
    assert sorted(SC.dilated_rank(12)) == list(range(12))  # any length: a permutation
    rule = S.make_selection("dilated")
    assert rule == S.TopK(score=SC.DilatedOrder(), count=C.EvenCount())
    assert S.make_selection("dilated", count="cosine").count == C.CosineCount()
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

    for score, expected in [
        (SC.Confidence(), [1, 0, 0, 1]), (SC.Margin(), [1, 0, 0, 1]), (SC.NegEntropy(), [1, 0, 0, 1])
    ]:
        accept, _ = S.TopK(score=score, count=Two())(KEYS1, logits, cand, undecided, info())
        np.testing.assert_array_equal(accept[0], np.array(expected, bool), err_msg=str(score))
    np.testing.assert_allclose(SC.Margin()(logits, cand)[0], [0.2, 0.15, 0.0, 0.8], atol=1e-6)
    accept, _ = S.TopK(score=SC.Confidence(), count=Two())(KEYS1, logits, cand, jnp.array([[0, 1, 1, 0]], bool), info())
    np.testing.assert_array_equal(accept[0], [False, True, True, False])  # only undecided positions compete


@pytest.mark.parametrize(
    "count", [C.ScheduleCount(), C.CosineCount(), C.EvenCount(), C.PowerCount(2.0), C.PowerCount(0.5)]
)
def test_counts_unmask_everything_by_the_last_step(count):
    num_steps, n = 7, 10
    free = jnp.ones((1, n), bool)
    undecided, history = n, []
    for step in range(num_steps):
        k = int(count(jnp.array([undecided]), SB.StepInfo.at(step, num_steps, LinearSchedule(), free, True))[0])
        assert 1 <= k <= undecided or undecided == 0
        history.append(k)
        undecided -= k
    assert undecided == 0, history
    if isinstance(count, C.EvenCount):
        assert history == [2, 2, 2, 1, 1, 1, 1]  # LLaDA: 10 // 7 = 1 per step, remainder 3 to the first steps
    if isinstance(count, C.PowerCount):  # decided after step i: round(10 ((i+1)/7)^e)
        targets = [round(n * ((i + 1) / num_steps) ** count.exponent) for i in range(num_steps)]
        expected, decided = [], 0
        for target in targets:  # each step decides at least one position while any is left
            step_k = min(max(target - decided, 1), n - decided)
            expected.append(step_k)
            decided += step_k
        assert history == expected, (history, targets)
        assert (history[0] < history[-1]) == (count.exponent > 1), history
    if isinstance(count, C.ScheduleCount):  # uniform process: #free * alpha(s), all at the last step
        k = count(jnp.array([n]), SB.StepInfo.at(2, 4, LinearSchedule(), free, False))
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
    for rule, sigma in [(RM.ReMDMCap(eta=0.2), min(0.2, sigma_max)), (RM.ReMDMRescale(eta=0.5), 0.5 * sigma_max)]:
        accept, remask = rule(KEYS1, jnp.zeros((1, n, 4)), jnp.zeros((1, n), jnp.int32), undecided, step_info)
        assert not (accept & ~undecided).any() and not (remask & undecided).any()
        half = n // 2
        assert abs(float(remask.sum()) / half - sigma) < 4 * math.sqrt(sigma / half)
        unmask = (a_s - (1 - sigma) * a_t) / (1 - a_t)
        assert abs(float(accept.sum()) / half - unmask) < 4 * math.sqrt(unmask / half)
    with pytest.raises(ValueError, match="MaskingProcess"):
        uniform_sampler(selection=RM.ReMDMCap())


def test_gumbel_top_k_noise_is_float32_and_seeded():
    logits = jnp.zeros((1, 8, 4))
    rule = S.TopK(score=SC.Confidence(), count=C.ScheduleCount(), gumbel_scale=1.0)
    a, _ = rule(KEYS1, logits, jnp.zeros((1, 8), jnp.int32), jnp.ones((1, 8), bool), info(shape=(1, 8)))
    b, _ = rule(KEYS1, logits, jnp.zeros((1, 8), jnp.int32), jnp.ones((1, 8), bool), info(shape=(1, 8)))
    np.testing.assert_array_equal(a, b)
    assert SB.row_gumbel(KEYS1, (3,)).dtype == jnp.float32


def test_top_k_also_above_adds_every_sure_position_to_the_count():
    # Margins by position: 0.98, 0.02, 0.9, 0.6, 0.98, 0.3 (top-2 of [p, 1-p] style rows); position 4 is decided.
    top = np.array([0.99, 0.51, 0.95, 0.8, 0.99, 0.65])
    probs = np.stack([top, 1 - top, np.full(6, 1e-9), np.full(6, 1e-9)], axis=-1)
    logits = logits_from_probs(probs)[None]
    undecided = jnp.array([[True, True, True, True, False, True]])
    cands = jnp.zeros((1, 6), jnp.int32)
    step = info(step=0, num_steps=6, shape=(1, 6))  # the even count decides one of the five undecided positions
    plain, _ = S.TopK(score=SC.Margin())(KEYS1, logits, cands, undecided, step)
    np.testing.assert_array_equal(plain[0], [True, False, False, False, False, False])
    sure, _ = S.TopK(score=SC.Margin(), also_above=0.85)(KEYS1, logits, cands, undecided, step)
    np.testing.assert_array_equal(sure[0], [True, False, True, False, False, False])  # + margin 0.9, not decided 4
    every, _ = S.TopK(score=SC.Margin(), also_above=0.01)(KEYS1, logits, cands, undecided, step)
    np.testing.assert_array_equal(every[0], np.asarray(undecided[0]))
    assert S.make_selection("top_k_margin", also_above=0.9) == S.TopK(score=SC.Margin(), also_above=0.9)
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
    assert S.make_selection("top_k_margin", gumbel_scale=0.5) == S.TopK(score=SC.Margin(), gumbel_scale=0.5)
    assert S.make_selection("maskgit").count == C.CosineCount()
    assert S.make_selection("top_k_margin", count="power", count_exponent=1.5).count == C.PowerCount(1.5)
    assert S.make_selection("top_k_margin", count="power").count == C.PowerCount()
    assert S.make_selection("top_k_margin", count="cosine").count == C.CosineCount()
    assert S.make_selection("entropy_bound", min_count="even").min_count == C.EvenCount()
    for count, exponent, message in [
        ("cosine", 2.0, "takes no exponent"),
        ("fast", None, "unknown count rule"),
        (None, 2.0, "count_exponent needs count='power'"),
    ]:
        with pytest.raises(ValueError, match=message):
            S.make_selection("top_k_margin", count=count, count_exponent=exponent)
    with pytest.raises(ValueError, match="exponent must be > 0"):
        C.PowerCount(0.0)


def test_neg_logit_removes_a_token_from_the_softmax_and_stays_finite():
    got = jax.nn.softmax(jnp.array([0.0, 2.0, SC.NEG_LOGIT]))
    np.testing.assert_allclose(got, [*jax.nn.softmax(jnp.array([0.0, 2.0])).tolist(), 0.0], rtol=1e-6)
    assert np.isfinite(np.float32(SC.NEG_LOGIT) * 2)


def test_top_k_ties_go_to_the_lower_index_in_a_long_row():
    scores = jnp.zeros((2, 300)).at[1, 150:].set(1.0)  # row 0: all tied; row 1: the upper half tied higher
    chosen = S.top_k_mask(scores, jnp.ones((2, 300), bool), jnp.array([5, 5]))
    np.testing.assert_array_equal(np.flatnonzero(chosen[0]), np.arange(5))
    np.testing.assert_array_equal(np.flatnonzero(chosen[1]), 150 + np.arange(5))


def test_confidence_of_the_candidate_and_of_the_top_from_logits_and_from_their_summary():
    probs = jnp.array([[[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]]])
    logits = logits_from_probs(probs)
    candidates = jnp.array([[2, 0]])
    summary = SC.LogitSummary(
        max=logits.max(-1),
        argmax=logits.argmax(-1),
        second=jnp.sort(logits, -1)[..., -2],
        sumexp=jnp.sum(jnp.exp(logits - logits.max(-1, keepdims=True)), -1),
        entropy=SC.entropy(logits),
        at_candidate=jnp.take_along_axis(logits, candidates[..., None], -1)[..., 0],
    )
    for source in (logits, summary):
        np.testing.assert_allclose(SC.Confidence()(source, candidates), [[0.2, 0.1]], rtol=1e-5)
        np.testing.assert_allclose(SC.Confidence(of_top=True)(source, candidates), [[0.5, 0.6]], rtol=1e-5)


def test_scores_counts_and_rules_are_frozen_and_a_rule_of_ones_own_must_be_too():
    things = [SC.Confidence(), SC.Margin(), SC.NegEntropy(), SC.DilatedOrder(), SC.LeftToRight(), C.ScheduleCount()]
    things += [C.CosineCount(), C.EvenCount(), C.PowerCount(), S.TopK(), S.Ancestral(), S.EntropyBound()]
    for thing in things + [S.ConfidenceThreshold(), RM.ReMDMCap(), RM.ReMDMRescale()]:
        hash(thing)  # static arguments of the jitted sampler
        with pytest.raises(dataclasses.FrozenInstanceError):
            thing.extra = 1
    with pytest.raises(TypeError, match="frozen"):

        @dataclasses.dataclass
        class Mutable(SB.SelectionRule):
            def __call__(self, keys, logits, candidates, undecided, info):
                return undecided, undecided


def test_schedule_count_is_the_expected_number_unmasked_at_the_step():
    """#undecided (alpha_s - alpha_t) / (1 - alpha_t), rounded (masking); #free alpha_s without persistence."""
    n = jnp.array([6, 9])
    at = info(step=1, num_steps=4, shape=(2, 9))  # t = 0.75, s = 0.5: alpha_t ~ 0.25, alpha_s ~ 0.5
    np.testing.assert_array_equal(C.ScheduleCount()(n, at), [2, 3])  # 6 / 3, 9 / 3
    uniform = info(step=1, num_steps=4, shape=(2, 9), persistent=False)
    np.testing.assert_array_equal(C.ScheduleCount()(n, uniform), [3, 4])  # round(3.0), round(4.5) to even


def test_cosine_count_follows_maskgits_cosine_of_the_steps_done():
    """After step i, floor(#free cos(pi/2 (i+1)/S)) stay masked: 10 free, S = 4 -> 9, 7, 3, 0 still masked."""
    n_free, steps = 10, 4
    undecided, want = 10, []
    for step in range(steps):
        k = int(C.CosineCount()(jnp.array([undecided]), info(step=step, num_steps=steps, shape=(1, n_free)))[0])
        want.append(k)
        undecided -= k
    assert want == [1, 2, 4, 3]


def test_power_count_defaults_to_the_square_and_remdm_to_the_papers_etas():
    n, steps = 16, 4  # decided after step i: round(16 ((i + 1) / 4)^2) = 1, 4, 9, 16
    undecided, got = n, []
    for step in range(steps):
        k = int(C.PowerCount()(jnp.array([undecided]), info(step=step, num_steps=steps, shape=(1, n)))[0])
        got.append(k)
        undecided -= k
    assert got == [1, 3, 5, 7]
    assert (RM.ReMDMCap().eta, RM.ReMDMRescale().eta) == (0.008, 0.015)


def test_which_rules_take_a_logit_summary():
    assert S.EntropyBound().chunkable() and S.Ancestral().chunkable() and RM.ReMDMCap().chunkable()
    assert S.TopK(score=SC.Margin()).chunkable() and S.ConfidenceThreshold().chunkable()


def test_ancestral_draws_one_row_of_uniforms_per_batch_row():
    keys = jax.random.split(jax.random.key(4), 3)
    undecided = jnp.ones((3, 5), bool)
    at = info(step=1, num_steps=4, shape=(3, 5))
    accept, remask = S.Ancestral()(keys, None, None, undecided, at)
    assert accept.shape == remask.shape == (3, 5)
    np.testing.assert_array_equal(accept, SB.row_uniform(keys, (5,)) < (at.alpha_s - at.alpha_t) / (1 - at.alpha_t))


def test_top_k_refuses_a_zero_threshold_and_confidence_threshold_accepts_a_score_equal_to_tau():
    with pytest.raises(ValueError, match="also_above must lie in"):
        S.TopK(also_above=0.0)
    logits = jnp.zeros((1, 3, 2)).at[0, 2, 0].set(5.0)  # positions 0 and 1: confidence exactly 0.5
    rule = S.ConfidenceThreshold(tau=0.5)
    accept, _ = rule(KEYS1, logits, jnp.zeros((1, 3), jnp.int32), jnp.ones((1, 3), bool), info(shape=(1, 3)))
    np.testing.assert_array_equal(accept, [[True, True, True]])


def test_gumbel_top_1_picks_a_position_with_probability_softmax_of_score_over_scale():
    """Gumbel-top-k: with k = 1 the chosen position is distributed as softmax(score / gumbel_scale)."""
    rows, c = 8000, jnp.array([0.2, 0.5, 0.9])
    logits = jnp.broadcast_to(jnp.log(jnp.stack([c, 1 - c], -1)), (rows, 3, 2))
    rule = S.TopK(score=SC.Confidence(), count=C.ScheduleCount(), gumbel_scale=0.5)
    keys = jax.random.split(jax.random.key(7), rows)
    undecided = jnp.ones((rows, 3), bool)
    accept, _ = rule(keys, logits, jnp.zeros((rows, 3), jnp.int32), undecided, info(num_steps=3, shape=(rows, 3)))
    assert np.all(np.asarray(accept).sum(-1) == 1)
    np.testing.assert_allclose(np.asarray(accept).mean(0), jax.nn.softmax(c / 0.5), atol=0.02)


def test_margin_from_logits_and_from_their_summary():
    probs = jnp.array([[[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]]])
    logits = logits_from_probs(probs)
    top = jnp.sort(logits, -1)
    summary = SC.LogitSummary(
        max=top[..., -1],
        argmax=logits.argmax(-1),
        second=top[..., -2],
        sumexp=jnp.sum(jnp.exp(logits - top[..., -1:]), -1),
        entropy=SC.entropy(logits),
        at_candidate=top[..., -1],
    )
    for source in (logits, summary):
        np.testing.assert_allclose(SC.Margin()(source, None), [[0.2, 0.3]], rtol=1e-5)


def test_dilated_rank_of_a_length_that_is_not_a_power_of_two():
    # levels: 0 first, then 4 (divisible by 4), then 2, then the odd positions by index
    np.testing.assert_array_equal(SC.dilated_rank(6), [0, 3, 2, 4, 1, 5])


def test_power_count_without_persistence_counts_from_nothing_decided():
    uniform = info(step=1, num_steps=4, shape=(1, 16), persistent=False)  # decided after step 1: round(16 / 4) = 4
    np.testing.assert_array_equal(C.PowerCount()(jnp.array([16]), uniform), [4])


def test_the_rule_base_class_is_abstract_and_a_rule_of_ones_own_neither_remasks_nor_takes_a_summary():
    with pytest.raises(TypeError, match="abstract"):
        SB.SelectionRule()

    @dataclasses.dataclass(frozen=True)
    class Everything(SB.SelectionRule):
        def __call__(self, keys, logits, candidates, undecided, info):
            return undecided, jnp.zeros_like(undecided)

    assert not Everything.remasks and not Everything().chunkable()
    assert RM.ReMDMCap.remasks and not S.TopK.remasks and not S.EntropyBound.remasks


def test_entropy_bound_defaults_to_diffusiongemmas_gamma_refuses_a_negative_one_and_breaks_ties_by_index():
    assert S.EntropyBound().gamma == 0.1  # SampleFromPredictions(entropy_bound=0.1)
    with pytest.raises(ValueError):
        S.EntropyBound(gamma=-0.5)
    # 300 positions of equal entropy ln 2: the exclusive sums 0, ln 2, 2 ln 2 are within 2.5 ln 2, so 3 are accepted,
    # the first three
    rule = S.EntropyBound(gamma=2.5 * math.log(2))
    accept, _ = rule(KEYS1, jnp.zeros((1, 300, 2)), jnp.zeros((1, 300), jnp.int32), jnp.ones((1, 300), bool),
                     info(shape=(1, 300)))  # fmt: skip
    np.testing.assert_array_equal(np.flatnonzero(accept[0]), [0, 1, 2])


def test_rule_arguments_are_checked_at_their_bounds():
    closed_ends = [S.TopK(also_above=1.0), S.TopK(gumbel_scale=0.0), RM.ReMDMCap(eta=0.0)]  # built, not refused
    closed_ends += [S.ConfidenceThreshold(tau=0.0), S.ConfidenceThreshold(tau=1.0)]
    assert [rule.remasks for rule in closed_ends] == [False, False, True, False, False]
    bad = [lambda: S.TopK(gumbel_scale=-0.5), lambda: S.ConfidenceThreshold(tau=-0.5),
           lambda: S.ConfidenceThreshold(tau=1.5), lambda: RM.ReMDMCap(eta=-0.5)]  # fmt: skip
    for make in bad:
        with pytest.raises(ValueError):
            make()
    with pytest.raises(TypeError, match="abstract"):
        RM._ReMDM()  # sigma is left to the subclasses


def test_top_k_also_above_accepts_a_score_equal_to_the_threshold():
    logits = jnp.zeros((1, 3, 2)).at[0, 2, 0].set(5.0)  # positions 0 and 1: confidence exactly 0.5
    rule = S.TopK(score=SC.Confidence(), count=C.ScheduleCount(), also_above=0.5)  # the count alone takes position 2
    accept, _ = rule(KEYS1, logits, jnp.zeros((1, 3), jnp.int32), jnp.ones((1, 3), bool), info(shape=(1, 3)))
    np.testing.assert_array_equal(accept, [[True, True, True]])


@pytest.mark.parametrize("rule, sigma", [(RM.ReMDMCap(eta=0.3), 0.3), (RM.ReMDMRescale(eta=0.5), 0.25)])
def test_remdm_unmasks_and_remasks_with_the_posterior_probabilities(rule, sigma):
    """Step 2 of 4 (t = 0.5, s = 0.25): sigma_max = min(1, (1 - alpha_s) / alpha_t) ~ 0.5, so cap 0.3 gives sigma 0.3 and
    rescale 0.5 gives 0.25; unmask with (alpha_s - (1 - sigma) alpha_t) / (1 - alpha_t), remask a decided token with
    sigma, each against the position's one uniform. The last step unmasks everything and remasks nothing."""
    keys = jax.random.split(jax.random.key(5), 3)
    undecided = jnp.tile(jnp.array([True, False]), (3, 50))
    at = info(step=2, num_steps=4, shape=(3, 100))
    accept, remask = rule(keys, None, None, undecided, at)
    np.testing.assert_allclose(jnp.minimum(1.0, (1 - at.alpha_s) / at.alpha_t), 0.5, rtol=1e-3)
    unmask = (at.alpha_s - (1 - sigma) * at.alpha_t) / (1 - at.alpha_t)
    u = SB.row_uniform(keys, (100,))
    assert 0 < int(accept.sum()) < 150 and 0 < int(remask.sum()) < 150
    np.testing.assert_array_equal(accept, undecided & (u < unmask))
    np.testing.assert_array_equal(remask, ~undecided & (u < sigma))
    accept, remask = rule(keys, None, None, undecided, info(step=3, num_steps=4, shape=(3, 100)))
    np.testing.assert_array_equal(accept, undecided)
    assert not np.any(remask)


def test_remdm_rescale_eta_is_at_most_one_and_the_named_rules_are_built_as_named():
    assert RM.ReMDMRescale(eta=1.0).eta == 1.0
    with pytest.raises(ValueError):
        RM.ReMDMRescale(eta=1.5)
    assert S.make_selection("top_k_top_probability").score == SC.Confidence(of_top=True)
    with pytest.raises(TypeError):
        S.make_selection("top_k_margin", "cosine")  # the count is keyword-only


def test_entropy_and_top_index_with_an_impossible_token():
    logits = jnp.array([[[0.0, 0.0, -jnp.inf], [1.0, 3.0, 2.0]]])  # p = 0 adds nothing (not 0 * -inf)
    np.testing.assert_allclose(SC.entropy(logits)[0, 0], math.log(2), rtol=1e-6)
    np.testing.assert_array_equal(SC.top_index(logits), [[0, 1]])
    zeros = jnp.zeros((1, 2))
    summary = SC.LogitSummary(zeros, jnp.array([[2, 0]]), zeros, zeros, zeros, zeros)
    np.testing.assert_array_equal(SC.top_index(summary), [[2, 0]])  # a summary's own argmax


def test_counts_without_persistence_count_from_nothing_decided():
    uniform = info(step=1, num_steps=4, shape=(1, 8), persistent=False)
    np.testing.assert_array_equal(C.EvenCount()(jnp.array([8]), uniform), [4])  # 2 per step, 2 steps done
    np.testing.assert_array_equal(C.CosineCount()(jnp.array([8]), uniform), [3])  # 8 - floor(8 cos(pi / 4)) = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        uniform.step = 2
