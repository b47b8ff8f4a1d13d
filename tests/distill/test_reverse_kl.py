"""On-policy reverse-KL distillation: the path log-probability against the sampler's own draw, the teacher's ELBO
against its exact value on an enumerable canvas, and the policy gradient against the exact gradient of
KL(student || teacher) computed by enumerating every canvas."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion.diffusion.processes import MaskingProcess, UniformProcess
from hackable_diffusion.diffusion.schedules import LinearSchedule
from hackable_diffusion.distill import methods
from hackable_diffusion.distill.reverse_kl import (
    ReverseKLLoss,
    commit_steps,
    leave_one_out,
    path_entropies,
    path_log_probs,
)
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.sampling.early_stopping import NoEarlyStop
from hackable_diffusion.sampling.sampler import DiffusionSampler
from hackable_diffusion.sampling.selection import make_selection

M, VOCAB, ALLOWED = 3, 7, (4, 5, 6)  # mask id; ids 0-2 forbidden, so a canvas position takes one of 3 tokens
PREFIX = np.array([[4, 6, 5]], np.int32)


def tiny(seed):
    cfg = TransformerConfig.from_dict(dict(presets.tiny(moe=False), vocab_size=VOCAB))
    model = T.Transformer(cfg)
    return model, T.init_params(model, jax.random.key(seed))


def sampler(steps=2, canvas=2):
    return DiffusionSampler(
        process=MaskingProcess(VOCAB, LinearSchedule(), M),
        selection=make_selection("top_k_margin"),
        early_stopping=NoEarlyStop(),
        num_steps=steps,
        canvas_length=canvas,
        forbidden_tokens=(0, 1, 2),
    )


def batch(copies=1):
    b = PREFIX.shape[0] * copies
    return {
        "prefix": jnp.tile(PREFIX, (copies, 1)),
        "prefix_mask": jnp.ones((b, PREFIX.shape[1]), bool),
        "canvas_tokens": jnp.zeros((b, 2), jnp.int32),
        "fixed": jnp.zeros((b, 2), bool),
    }


def canvas_logits(model, params, canvases):
    """Each canvas decoded against the prefix, the plain reference way (one row per canvas)."""
    canvases = jnp.asarray(canvases, jnp.int32)
    n = canvases.shape[0]
    cache = init_cache(model.cfg, n, PREFIX.shape[1])
    _, cache = T.append(model, params, jnp.tile(PREFIX, (n, 1)), cache)
    return T.decode_block(model, params, canvases, cache)[0].astype(jnp.float32)


def test_commit_steps_and_the_path_log_probability_by_hand():
    start = jnp.array([[M, M, M]])
    trajectory = jnp.array([[[M, 5, M]], [[4, 5, 6]]])
    committed = commit_steps(start, trajectory, M)
    np.testing.assert_array_equal(committed[:, 0], [[False, True, False], [True, False, True]])
    logits = jax.random.normal(jax.random.key(0), (2, 1, 3, 8))
    temperatures = jnp.array([0.8, 0.5])
    bias = jnp.zeros(8).at[M].set(-1e30)
    got = path_log_probs(logits, trajectory[-1], committed, temperatures, bias)
    lp = [jax.nn.log_softmax((logits[s, 0] + bias) / temperatures[s]) for s in range(2)]
    np.testing.assert_allclose(got, [[lp[0][1, 5]], [lp[1][0, 4] + lp[1][2, 6]]], rtol=1e-6)
    entropy = [-jnp.sum(jnp.where(jnp.isfinite(x), jnp.exp(x) * x, 0.0), -1) for x in lp]
    want = [[entropy[0][1]], [entropy[1][0] + entropy[1][2]]]
    np.testing.assert_allclose(path_entropies(logits, committed, temperatures, bias), want, rtol=1e-6)


def test_leave_one_out_centres_on_the_other_samples_and_vanishes_on_ties():
    costs = jnp.array([[1.0, 5.0], [2.0, 5.0], [6.0, 5.0]])
    np.testing.assert_allclose(leave_one_out(costs)[:, 0], [1 - 4, 2 - 3.5, 6 - 1.5])
    np.testing.assert_array_equal(leave_one_out(costs)[:, 1], 0.0)


def exact_elbo_weights(schedule, num=200_000):
    """A_pattern = integral of w(t) P(pattern | t) dt over the masking ELBO's t, for 1 and 2 masked positions of 2."""
    t = (np.arange(num) + 0.5) / num
    t = np.clip(t, 1e-3, 1.0)
    alpha = np.asarray(schedule.alpha(jnp.asarray(t)))
    weight = -np.asarray(schedule.alpha_prime(jnp.asarray(t))) / (1 - alpha)
    return np.mean(weight * (1 - alpha) * alpha), np.mean(weight * (1 - alpha) ** 2)


def first_position(model, student, smp):
    """The position the margin rule commits first from the empty canvas (the same for every draw)."""
    margin = jnp.sort(canvas_logits(model, student, [[M, M]])[0] + smp.logit_bias(), axis=-1)
    return int(jnp.argmax(margin[:, -1] - margin[:, -2]))


def exact_objective(model, student, teacher, smp, beta, a):
    """sum_x q(x) [log q(x) - beta ELBO_teacher(x)] / 2 over every canvas x, by enumeration; also sum_x q(x)."""
    one, two = exact_elbo_weights(smp.process.schedule)
    canvases = np.array(list(itertools.product(ALLOWED, repeat=2)), np.int32)
    # the teacher's exact ELBO: patterns {0}, {1} (weight `one`) and {0, 1} (weight `two`, both terms)
    patterns = np.concatenate([[[M, M]], [[M, x[1]] for x in canvases], [[x[0], M] for x in canvases]])
    lp_teacher = jax.nn.log_softmax(canvas_logits(model, teacher, patterns).at[..., M].set(-jnp.inf), axis=-1)
    both, first_only, second_only = lp_teacher[0], lp_teacher[1 : 1 + 9], lp_teacher[1 + 9 :]
    idx = np.arange(9)
    elbo = one * (first_only[idx, 0, canvases[:, 0]] + second_only[idx, 1, canvases[:, 1]]) + two * (
        both[0, canvases[:, 0]] + both[1, canvases[:, 1]]
    )
    # the student's sampler: step 0 commits position a, step 1 the other, at the sampler's temperatures
    bias = smp.logit_bias()
    t0, t1 = smp.temperature(1.0), smp.temperature(0.5)
    empty = canvas_logits(model, student, [[M, M]])[0]
    second = [[x[0], M] if a == 0 else [M, x[1]] for x in canvases]
    later = canvas_logits(model, student, second)
    log_q = (
        jax.nn.log_softmax((empty[a] + bias) / t0)[canvases[:, a]]
        + jax.nn.log_softmax((later[idx, 1 - a] + bias) / t1)[idx, canvases[:, 1 - a]]
    )
    return jnp.sum(jnp.exp(log_q) * (log_q - beta * elbo)) / 2, jnp.sum(jnp.exp(log_q))


def flat(tree):
    return np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])


def gradient_estimates(loss, student, copies, seeds=8):
    grad_fn = jax.jit(jax.grad(lambda p, k: loss(p, batch(copies), k)[0]))
    return np.stack([flat(grad_fn(student, jax.random.key(seed))) for seed in range(seeds)])


def assert_matches(exact, estimates):
    e, g = flat(exact), estimates.mean(axis=0)
    cosine = e @ g / np.linalg.norm(e) / np.linalg.norm(g)
    assert cosine > 0.97, cosine
    assert 0.9 < np.linalg.norm(g) / np.linalg.norm(e) < 1.1, np.linalg.norm(g) / np.linalg.norm(e)


def test_the_policy_gradient_matches_the_exact_gradient_of_the_reverse_kl():
    model, teacher = tiny(0)
    _, student = tiny(1)
    smp, beta = sampler(), 1.5
    loss = ReverseKLLoss(model, teacher, smp, group_size=512, elbo_draws=2, target_sharpness=beta)
    a = first_position(model, student, smp)
    exact, total = jax.grad(lambda p: exact_objective(model, p, teacher, smp, beta, a), has_aux=True)(student)
    assert np.isclose(float(total), 1.0, atol=1e-5)  # the enumerated canvases are the whole support
    assert_matches(exact, gradient_estimates(loss, student, copies=1))  # 4,096 canvases


def test_shared_elbo_noise_and_exact_entropies_keep_the_gradient_and_cut_its_variance():
    """64 prompts x 8 samples per seed: with the group's ELBO noise shared and the step entropies exact, the mean of
    8 estimates still matches the enumerated gradient, and one estimate varies less than the plain estimator's."""
    model, teacher = tiny(0)
    _, student = tiny(1)
    smp, beta = sampler(), 1.5
    exact = jax.grad(lambda p: exact_objective(model, p, teacher, smp, beta, first_position(model, student, smp))[0])(
        student
    )
    common = dict(group_size=8, elbo_draws=2, target_sharpness=beta)
    lower = gradient_estimates(
        ReverseKLLoss(model, teacher, smp, shared_noise=True, exact_entropy=True, **common), student, copies=64
    )
    plain = gradient_estimates(ReverseKLLoss(model, teacher, smp, **common), student, copies=64)
    assert_matches(exact, lower)
    variance = {name: np.mean(np.sum((g - g.mean(0)) ** 2, axis=1)) for name, g in (("lower", lower), ("plain", plain))}
    assert variance["lower"] < 0.6 * variance["plain"], variance


@pytest.mark.parametrize("tau, shared", [(1.0, False), (0.5, False), (1.0, True)])
def test_the_teacher_elbo_estimate_averages_to_the_exact_elbo(tau, shared):
    """At target temperature tau the exact value reads the teacher's logits / tau (each conditional renormalised);
    shared: both canvases of the prompt read the same noise levels and masks, each estimate still unbiased."""
    model, teacher = tiny(0)
    smp = sampler()
    loss = ReverseKLLoss(
        model, teacher, smp, group_size=2, elbo_draws=4096, target_temperature=tau, shared_noise=shared
    )
    tokens = jnp.array([[4, 6], [5, 5]])
    got = loss.teacher_elbo(batch(), tokens, jnp.zeros((2, 2), bool), jax.random.key(0))  # 2 canvases, 1 prompt
    one, two = exact_elbo_weights(smp.process.schedule)
    logits = canvas_logits(model, teacher, [[M, M], [M, 6], [4, M], [M, M], [M, 5], [5, M]]) / tau
    lp = jax.nn.log_softmax(logits.at[..., M].set(-jnp.inf), -1)
    want = [
        one * (lp[1, 0, 4] + lp[2, 1, 6]) + two * (lp[0, 0, 4] + lp[0, 1, 6]),
        one * (lp[4, 0, 5] + lp[5, 1, 5]) + two * (lp[3, 0, 5] + lp[3, 1, 5]),
    ]
    np.testing.assert_allclose(got, want, rtol=0.03)


def test_reverse_kl_refuses_a_uniform_run_and_a_group_of_one():
    with pytest.raises(ValueError, match="consistency"):
        methods.ReverseKLDistillation(2).check_process(persistent=False)
    with pytest.raises(ValueError, match="group_size"):
        methods.ReverseKLDistillation(2, group_size=1)
    model, teacher = tiny(0)
    with pytest.raises(ValueError, match="group_size"):
        ReverseKLLoss(model, teacher, sampler(), group_size=1)


def test_reverse_kl_refuses_samplers_whose_path_it_cannot_score_and_needs_an_elbo_draw():
    model, teacher = tiny(0)
    uniform = sampler().replace(process=UniformProcess(VOCAB, LinearSchedule()))
    with pytest.raises(ValueError, match="needs a masking run"):
        ReverseKLLoss(model, teacher, uniform)
    with pytest.raises(ValueError, match="plain passes"):
        ReverseKLLoss(model, teacher, sampler().replace(token_shift=True))
    with pytest.raises(ValueError, match="elbo_draws=0 >= 1"):
        ReverseKLLoss(model, teacher, sampler(), elbo_draws=0)
    assert ReverseKLLoss(model, teacher, sampler(), group_size=2, elbo_draws=1).elbo_draws == 1


def test_the_metrics_are_the_per_token_costs_of_the_rolled_out_canvases():
    """cost = (log q - beta log p) / free tokens per canvas; the metrics are its mean, the mean of -log q and log p per
    free token, and the mean over prompts of the cost's spread within a prompt's group. One prompt has a fixed
    position, so its canvases have one free token."""
    model, teacher = tiny(0)
    _, student = tiny(1)
    beta = 1.5
    loss = ReverseKLLoss(model, teacher, sampler(), group_size=3, elbo_draws=2, target_sharpness=beta)
    two = batch(copies=2)
    two = dict(two, fixed=jnp.array([[True, False], [False, False]]), canvas_tokens=jnp.array([[5, 0], [0, 0]]))
    key = jax.random.key(3)
    _, metrics = loss(student, two, key)
    rollout_key, elbo_key = jax.random.split(key)
    start, trajectory, fixed = loss.rollout(student, two, rollout_key)
    np.testing.assert_array_equal(trajectory[-1][0::2, 0], 5)  # the fixed position kept its token
    log_q = jnp.sum(loss.student_path_log_probs(student, two, start, trajectory)[0], axis=0)
    log_p = loss.teacher_elbo(two, trajectory[-1], fixed, elbo_key)
    free = jnp.sum(~fixed, axis=-1)
    np.testing.assert_array_equal(free, [1, 2, 1, 2, 1, 2])
    cost = (log_q - beta * log_p) / free
    np.testing.assert_allclose(metrics["cost_per_token"], jnp.mean(cost), rtol=1e-5)
    np.testing.assert_allclose(metrics["student_nll_per_token"], -jnp.mean(log_q / free), rtol=1e-5)
    np.testing.assert_allclose(metrics["teacher_elbo_per_token"], jnp.mean(log_p / free), rtol=1e-5)
    spread = np.mean([np.std(np.asarray(cost)[prompt::2]) for prompt in range(2)])
    np.testing.assert_allclose(metrics["cost_std_in_group"], spread, rtol=1e-5)


def test_the_loss_defaults_are_the_distillation_method_defaults():
    """ReverseKLLoss and config.distill's ReverseKLDistillation state the same defaults (group size, ELBO draws,
    sharpness, target temperature, shared noise, exact entropies)."""
    method = {f.name: f.default for f in dataclasses.fields(methods.ReverseKLDistillation)}
    loss = {f.name: f.default for f in dataclasses.fields(ReverseKLLoss) if f.default is not dataclasses.MISSING}
    assert set(loss) == {"group_size", "elbo_draws", "target_sharpness", "target_temperature", "shared_noise",
                         "exact_entropy"}  # fmt: skip
    assert loss == {name: method[name] for name in loss}


def test_the_student_path_log_probability_of_a_three_step_rollout_matches_plain_passes():
    """Each step's log q read from one pass per state (start, then the trajectory but its last canvas), against
    `path_log_probs` over plain per-canvas passes; three steps, so the states and the final canvas are not the
    trajectory's first and second entries by accident."""
    model, teacher = tiny(0)
    _, student = tiny(1)
    smp = sampler(steps=3, canvas=3)
    loss = ReverseKLLoss(model, teacher, smp, group_size=2, elbo_draws=1)
    three = dict(batch(), canvas_tokens=jnp.zeros((1, 3), jnp.int32), fixed=jnp.zeros((1, 3), bool))
    start, trajectory, _ = loss.rollout(student, three, jax.random.key(2))
    assert trajectory.shape == (3, 2, 3) and not np.array_equal(trajectory[1], trajectory[2])
    got = loss.student_path_log_probs(student, three, start, trajectory)[0]
    logits = jnp.stack([canvas_logits(model, student, state) for state in (start, trajectory[0], trajectory[1])])
    temperatures = jnp.array([smp.temperature(t) for t in (1.0, 2 / 3, 1 / 3)], jnp.float32)
    committed = commit_steps(start, trajectory, M)
    want = path_log_probs(logits, trajectory[-1], committed, temperatures, smp.logit_bias())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_the_loss_is_frozen():
    model, teacher = tiny(0)
    loss = ReverseKLLoss(model, teacher, sampler())
    with pytest.raises(dataclasses.FrozenInstanceError):
        loss.group_size = 8


def test_a_zero_target_temperature_reads_the_samplers_temperature():
    """target_temperature 0 divides the teacher's logits by the sampler's temperature at each draw's t (below 1 for
    this sampler's schedule, so sharper than target temperature 1): finite, and not the estimate at temperature 1."""
    model, teacher = tiny(0)
    smp = sampler()
    assert float(smp.temperature(0.3)) < 1.0
    tokens, fixed, key = jnp.array([[4, 6], [5, 5]]), jnp.zeros((2, 2), bool), jax.random.key(1)
    own = ReverseKLLoss(model, teacher, smp, group_size=2, elbo_draws=4, target_temperature=0.0)
    one = ReverseKLLoss(model, teacher, smp, group_size=2, elbo_draws=4, target_temperature=1.0)
    got = np.asarray(own.teacher_elbo(batch(), tokens, fixed, key))
    assert np.all(np.isfinite(got))
    assert not np.allclose(got, one.teacher_elbo(batch(), tokens, fixed, key), rtol=1e-3)
