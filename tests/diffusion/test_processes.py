"""Noise processes: corruption marginals (binomial tests), fixed positions, priors, exact posteriors by enumeration."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion.diffusion.processes import MaskingProcess, UniformProcess, transition_posterior
from hackable_diffusion.diffusion.schedules import CosineSchedule, LinearSchedule, MD4CosineSchedule

TIMES = jnp.array([0.0, 0.05, 0.3, 0.5, 0.77, 0.95, 1.0])
NUM_TOKENS = 20_000  # per example (per time)


def _within_sigmas(count, n, p, sigmas=5.0):
    sd = np.sqrt(n * p * (1 - p))
    return abs(count - n * p) <= sigmas * max(sd, 1.0)


def test_masking_marginal_is_one_minus_alpha():
    process = MaskingProcess(vocab_size=11, schedule=MD4CosineSchedule(), mask_id=10)
    x0 = jax.random.randint(jax.random.key(0), (len(TIMES), NUM_TOKENS), 0, 10)
    xt, corrupted = process.corrupt(jax.random.key(1), x0, TIMES)
    np.testing.assert_array_equal(corrupted, xt == 10)
    np.testing.assert_array_equal(jnp.where(corrupted, x0, xt), x0)
    alpha = np.asarray(process.schedule(TIMES), np.float64)
    for row, a in enumerate(alpha):
        assert _within_sigmas(int(corrupted[row].sum()), NUM_TOKENS, 1 - a), (TIMES[row], corrupted[row].mean(), 1 - a)


def test_uniform_marginal_counts_self_replacement_and_skips_excluded_ids():
    excluded = (0, 1, 7)
    process = UniformProcess(vocab_size=12, schedule=LinearSchedule(), excluded_ids=excluded)
    n = process.num_allowed
    assert n == 9
    x0 = jnp.full((len(TIMES), NUM_TOKENS), 5)
    xt, corrupted = process.corrupt(jax.random.key(2), x0, TIMES)
    alpha = np.asarray(process.schedule(TIMES), np.float64)
    for row, a in enumerate(alpha):
        changed = int((xt[row] != x0[row]).sum())
        assert _within_sigmas(changed, NUM_TOKENS, (1 - a) * (1 - 1 / n)), (TIMES[row], changed / NUM_TOKENS)
        assert _within_sigmas(int(corrupted[row].sum()), NUM_TOKENS, 1 - a)
    assert not np.isin(np.asarray(xt), excluded).any()
    # Replacements are uniform over the 9 allowed tokens (5 sigma per token).
    replaced = np.asarray(xt[-1])
    counts = np.bincount(replaced, minlength=12)
    for token in range(12):
        expected = 0.0 if token in excluded else 1 / n
        assert _within_sigmas(counts[token], NUM_TOKENS, expected), (token, counts[token])


def test_clean_excluded_token_is_corrupted_into_allowed_tokens_only():
    process = UniformProcess(vocab_size=6, schedule=LinearSchedule(), excluded_ids=(1,))
    x0 = jnp.ones((1, NUM_TOKENS), jnp.int32)  # e.g. EOS, excluded from the noise
    xt, corrupted = process.corrupt(jax.random.key(3), x0, jnp.array([0.6]))
    assert np.all(np.asarray(xt)[np.asarray(corrupted)] != 1)
    assert _within_sigmas(int((xt != 1).sum()), NUM_TOKENS, float(1 - process.schedule(0.6)))


@pytest.mark.parametrize(
    "process",
    [
        MaskingProcess(vocab_size=9, schedule=LinearSchedule(eps=0.0), mask_id=0),
        UniformProcess(vocab_size=9, schedule=LinearSchedule(eps=0.0), excluded_ids=(8,)),
    ],
)
def test_fixed_positions_are_never_corrupted(process):
    key_x, key_f, key_c = jax.random.split(jax.random.key(4), 3)
    x0 = jax.random.randint(key_x, (4, 512), 1, 8)
    fixed = jax.random.bernoulli(key_f, 0.4, x0.shape)
    xt, corrupted = jax.jit(process.corrupt)(key_c, x0, jnp.ones(4), fixed)  # t = 1: everything else is resampled
    np.testing.assert_array_equal(jnp.where(fixed, xt, x0), x0)
    assert not np.asarray(corrupted & fixed).any()
    np.testing.assert_array_equal(corrupted, ~fixed)  # alpha(1) = 0 (eps = 0): every free token is resampled


def test_prior_samples():
    masking = MaskingProcess(vocab_size=5, schedule=LinearSchedule(), mask_id=2)
    np.testing.assert_array_equal(masking.prior_sample(jax.random.key(0), (3, 4)), jnp.full((3, 4), 2))
    uniform = UniformProcess(vocab_size=10, schedule=LinearSchedule(), excluded_ids=(9, 0, 4))
    draws = np.asarray(uniform.prior_sample(jax.random.key(1), (70_000,)))
    counts = np.bincount(draws, minlength=10)
    assert counts[[0, 4, 9]].sum() == 0
    for token in (1, 2, 3, 5, 6, 7, 8):
        assert _within_sigmas(counts[token], 70_000, 1 / 7)
    np.testing.assert_array_equal(uniform.allowed_vocab(), np.isin(np.arange(10), (0, 4, 9), invert=True))
    np.testing.assert_allclose(uniform.noise_distribution().sum(), 1.0, rtol=1e-6)


def test_invalid_configurations_raise():
    with pytest.raises(ValueError, match="mask_id"):
        MaskingProcess(vocab_size=5, schedule=LinearSchedule(), mask_id=5)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        UniformProcess(vocab_size=5, schedule=LinearSchedule(), excluded_ids=(5,))
    with pytest.raises(ValueError, match="duplicates"):
        UniformProcess(vocab_size=5, schedule=LinearSchedule(), excluded_ids=(1, 1))
    with pytest.raises(ValueError, match="at least 2"):
        UniformProcess(vocab_size=3, schedule=LinearSchedule(), excluded_ids=(0, 1))
    with pytest.raises(ValueError, match="schedule"):
        UniformProcess(vocab_size=5, schedule="linear")
    process = UniformProcess(vocab_size=5, schedule=LinearSchedule())
    x0 = jnp.zeros((2, 3), jnp.int32)
    with pytest.raises(ValueError, match="one time per example"):
        process.corrupt(jax.random.key(0), x0, jnp.zeros(3))
    with pytest.raises(ValueError, match="fixed"):
        process.corrupt(jax.random.key(0), x0, jnp.zeros(2), fixed=jnp.zeros((2, 4), bool))
    with pytest.raises(ValueError, match="vocab_size"):
        process.posterior_probs(x0, jnp.ones((2, 3, 4)) / 4, jnp.zeros(2), jnp.ones(2))


# ---------------------------------------------------------------------------------------------------------------------
# Posteriors, checked by enumeration on a small vocabulary.
# ---------------------------------------------------------------------------------------------------------------------

V = 5
PROCESSES = [
    MaskingProcess(vocab_size=V, schedule=LinearSchedule(), mask_id=4),
    UniformProcess(vocab_size=V, schedule=CosineSchedule()),
    UniformProcess(vocab_size=V, schedule=MD4CosineSchedule(), excluded_ids=(0, 3)),
]
PROCESS_IDS = ["masking", "uniform", "uniform_excluding_0_3"]
S_TIME, T_TIME = 0.35, 0.6


def _step_matrix(process, s, t):
    """q(x_t = j | x_s = k) as a (V, V) matrix, written from the definition (independently of the package)."""
    a_ts = float(process.schedule(t)) / float(process.schedule(s))
    pi = np.asarray(process.noise_distribution(), np.float64)
    return a_ts * np.eye(V) + (1 - a_ts) * pi[None, :]


def _marginal_matrix(process, t):
    """q(x_t = j | x0 = y) as a (V, V) matrix, from the package's marginal_probs."""
    return np.asarray(process.marginal_probs(jnp.arange(V)[None], jnp.array([t]))[0], np.float64)


def _clean_values(process):
    return [y for y in range(V) if not (isinstance(process, MaskingProcess) and y == process.mask_id)]


@pytest.mark.parametrize("process", PROCESSES, ids=PROCESS_IDS)
def test_marginals_compose_over_two_times(process):
    q_s, q_t = _marginal_matrix(process, S_TIME), _marginal_matrix(process, T_TIME)
    np.testing.assert_allclose(q_s @ _step_matrix(process, S_TIME, T_TIME), q_t, atol=1e-6)
    np.testing.assert_allclose(q_t.sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize("process", PROCESSES, ids=PROCESS_IDS)
def test_one_hot_posterior_is_bayes_rule(process):
    q_s, q_t = _marginal_matrix(process, S_TIME), _marginal_matrix(process, T_TIME)
    step = _step_matrix(process, S_TIME, T_TIME)
    pairs = [(x0, xt) for x0 in _clean_values(process) for xt in range(V) if q_t[x0, xt] > 1e-9]
    x0 = jnp.array([[p[0] for p in pairs]])
    xt = jnp.array([[p[1] for p in pairs]])
    post = np.asarray(process.posterior_probs(xt, jax.nn.one_hot(x0, V), jnp.array([S_TIME]), jnp.array([T_TIME]))[0])
    for row, (a, i) in enumerate(pairs):
        bayes = q_s[a] * step[:, i] / q_t[a, i]
        np.testing.assert_allclose(post[row], bayes, atol=2e-6, err_msg=f"x0={a}, xt={i}")
        assert post[row].sum() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("process", PROCESSES, ids=PROCESS_IDS)
def test_predicted_posterior_is_the_exact_reverse_step_for_the_true_x0_posterior(process):
    """With P = p(x0 | x_t) for a data distribution p0, posterior_probs gives p(x_s | x_t) under that data."""
    clean = _clean_values(process)
    p0 = np.zeros(V)
    p0[clean] = np.random.default_rng(0).dirichlet(np.ones(len(clean)))
    q_s, q_t = _marginal_matrix(process, S_TIME), _marginal_matrix(process, T_TIME)
    step = _step_matrix(process, S_TIME, T_TIME)
    observed = [i for i in range(V) if (p0 @ q_t)[i] > 1e-9]
    true_x0_posterior = np.stack([p0 * q_t[:, i] / (p0 @ q_t[:, i]) for i in observed])  # p(x0 | x_t = i)
    true_reverse = np.stack([(p0 @ q_s) * step[:, i] / (p0 @ q_t[:, i]) for i in observed])  # p(x_s | x_t = i)
    got = process.posterior_probs(
        jnp.array([observed]),
        jnp.asarray(true_x0_posterior, jnp.float32)[None],
        jnp.array([S_TIME]),
        jnp.array([T_TIME]),
    )[0]
    np.testing.assert_allclose(got, true_reverse, atol=2e-6)


@pytest.mark.parametrize("process", PROCESSES, ids=PROCESS_IDS)
def test_predicted_posterior_is_the_mixture_of_consistent_one_hot_posteriors(process):
    rng = np.random.default_rng(1)
    q_t = _marginal_matrix(process, T_TIME)
    probs = rng.dirichlet(np.ones(V), size=V)  # arbitrary predictions, one per observed token
    got = np.asarray(
        process.posterior_probs(
            jnp.arange(V)[None], jnp.asarray(probs, jnp.float32)[None], jnp.array([S_TIME]), jnp.array([T_TIME])
        )[0]
    )
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-6)
    for i in range(V):
        consistent = [y for y in _clean_values(process) if q_t[y, i] > 1e-9]
        weights = probs[i, consistent] / probs[i, consistent].sum()
        one_hots = process.posterior_probs(
            jnp.full((1, len(consistent)), i),
            jax.nn.one_hot(jnp.array([consistent]), V),
            jnp.array([S_TIME]),
            jnp.array([T_TIME]),
        )[0]
        np.testing.assert_allclose(got[i], weights @ np.asarray(one_hots), atol=2e-6)


def test_masking_posterior_copies_unmasked_tokens_and_ignores_mask_mass():
    process = PROCESSES[0]
    s, t = jnp.array([0.2]), jnp.array([0.7])
    probs = jnp.asarray(np.random.default_rng(2).dirichlet(np.ones(V), size=(1, 3)), jnp.float32)
    xt = jnp.array([[1, 4, 2]])
    post = process.posterior_probs(xt, probs, s, t)[0]
    np.testing.assert_allclose(post[0], np.eye(V)[1], atol=1e-7)
    np.testing.assert_allclose(post[2], np.eye(V)[2], atol=1e-7)
    a_s, a_t = float(process.schedule(0.2)), float(process.schedule(0.7))
    stay = (1 - a_s) / (1 - a_t)
    expected = (1 - stay) * np.asarray(probs[0, 1, :4]) / float(probs[0, 1, :4].sum())
    np.testing.assert_allclose(post[1, :4], expected, atol=1e-6)
    assert float(post[1, 4]) == pytest.approx(stay, abs=1e-6)
    # Moving probability onto the mask token does not change anything (SUBS).
    shifted = probs.at[0, 1, 4].add(5.0)
    np.testing.assert_allclose(process.posterior_probs(xt, shifted, s, t)[0], post, atol=1e-6)
    denoised = process.denoised_probs(xt, probs, t)[0]
    np.testing.assert_allclose(denoised[0], np.eye(V)[1], atol=1e-7)
    np.testing.assert_allclose(denoised[1, :4], np.asarray(probs[0, 1, :4]) / float(probs[0, 1, :4].sum()), atol=1e-6)


def test_uniform_posterior_keeps_an_excluded_observed_token():
    process = PROCESSES[2]  # 0 and 3 are excluded: an observed 3 must be clean.
    probs = jnp.full((1, 1, V), 1 / V)
    post = process.posterior_probs(jnp.array([[3]]), probs, jnp.array([0.1]), jnp.array([0.9]))
    np.testing.assert_allclose(post[0, 0], np.eye(V)[3], atol=1e-7)


def test_transition_posterior_batches_times():
    pi = jnp.full((V,), 1 / V)
    xt = jnp.array(list(itertools.product(range(V), repeat=2)))
    probs = jax.nn.softmax(jax.random.normal(jax.random.key(0), xt.shape + (V,)))
    alpha_s = jnp.linspace(0.5, 0.99, xt.shape[0])
    out = transition_posterior(xt, probs, alpha_s, alpha_s * 0.5, pi)
    np.testing.assert_allclose(out.sum(-1), 1.0, atol=1e-6)
    assert np.all(np.asarray(out) >= 0)
