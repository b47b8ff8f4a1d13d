"""Losses: ELBO closed forms, continuous vs many-step discrete ELBO, UDLM's formula, CE by hand, the enumerable toy."""

import math

import enumerable_toy  # experiments/likelihood/enumerable_toy.py (on sys.path through tests/conftest.py)
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion.diffusion import elbos as L
from hackable_diffusion.diffusion.processes import MaskingProcess, UniformProcess
from hackable_diffusion.diffusion.schedules import CosineSchedule, LinearSchedule, MD4CosineSchedule

B, LEN, V = 4, 6, 7
TIMES = jnp.array([0.2, 0.45, 0.7, 0.9])


def _problem(process, seed=0, logit_scale=1.5):
    k_x, k_c, k_l = jax.random.split(jax.random.key(seed), 3)
    high = V - 1 if isinstance(process, MaskingProcess) else V
    x0 = jax.random.randint(k_x, (B, LEN), 0, high)  # masking: mask_id = V - 1 is never data
    xt, _ = process.corrupt(k_c, x0, TIMES)
    logits = logit_scale * jax.random.normal(k_l, (B, LEN, V)) + jax.nn.one_hot(x0, V)
    return x0, xt, logits


MASKING = MaskingProcess(vocab_size=V, schedule=LinearSchedule(), mask_id=V - 1)
UNIFORM = UniformProcess(vocab_size=V, schedule=LinearSchedule())
UNIFORM_EXCLUDING = UniformProcess(vocab_size=V, schedule=MD4CosineSchedule(), excluded_ids=(0, 5))


@pytest.mark.parametrize("process", [MASKING, UNIFORM, UNIFORM_EXCLUDING], ids=["masking", "uniform", "uniform_excl"])
def test_perfect_prediction_gives_zero_elbo(process):
    x0, xt, _ = _problem(process)
    perfect = 40.0 * jax.nn.one_hot(x0, V)
    np.testing.assert_allclose(L.process_elbo(perfect, x0, xt, TIMES, process), 0.0, atol=1e-5)
    # ... while a wrong model pays something in every example with a noised position.
    _, _, logits = _problem(process)
    wrong = np.asarray(L.process_elbo(logits, x0, xt, TIMES, process))
    noised = np.asarray(jnp.any(xt != x0, axis=-1))
    assert noised.sum() >= 3 and np.all(wrong[noised] > 0) and np.all(wrong >= 0)


def test_masking_weight_is_one_over_t_for_the_linear_schedule():
    t = jnp.linspace(0.02, 1.0, 50)
    weight = L.masking_elbo_weight(LinearSchedule(), t)
    np.testing.assert_allclose(weight, 1.0 / t, rtol=6e-3)  # eps = 1e-4 shifts it by eps / t relative
    eps = 1e-4
    np.testing.assert_allclose(weight, (1 - 2 * eps) / (1 - eps - (1 - 2 * eps) * (1 - t)), rtol=1e-5)
    np.testing.assert_allclose(L.masking_elbo_weight(LinearSchedule(eps=0.0), t), 1.0 / t, rtol=1e-5)


def test_masking_elbo_by_hand_and_mask_logit_is_irrelevant():
    x0, xt, logits = _problem(MASKING, seed=1)
    got = L.masking_elbo(logits, x0, xt, TIMES, MASKING.schedule, MASKING.mask_id)
    lg, a, b, t = np.asarray(logits, np.float64), np.asarray(x0), np.asarray(xt), np.asarray(TIMES, np.float64)
    expected = []
    for n in range(B):
        alpha = 1e-4 + (1 - 2e-4) * (1 - t[n])
        weight = (1 - 2e-4) / (1 - alpha)
        total = 0.0
        for i in range(LEN):
            if b[n, i] == V - 1:
                row = lg[n, i, : V - 1]
                total += math.log(np.exp(row).sum()) - row[a[n, i]]
        expected.append(weight * total)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    moved = logits.at[..., V - 1].set(100.0)
    np.testing.assert_allclose(L.masking_elbo(moved, x0, xt, TIMES, MASKING.schedule, MASKING.mask_id), got, rtol=1e-6)
    loss_mask = jnp.zeros((B, LEN), bool).at[:, :3].set(True)
    partial = L.masking_elbo(logits, x0, xt, TIMES, MASKING.schedule, MASKING.mask_id, loss_mask)
    assert np.all(np.asarray(partial) <= np.asarray(got) + 1e-6)


@pytest.mark.parametrize(
    "process",
    [
        UNIFORM,
        UNIFORM_EXCLUDING,
        UniformProcess(vocab_size=V, schedule=CosineSchedule(), excluded_ids=(3,)),
        MASKING,
        MaskingProcess(vocab_size=V, schedule=MD4CosineSchedule(), mask_id=0),
    ],
    ids=["uniform", "uniform_excl", "uniform_cosine_excl", "masking", "masking_md4cos"],
)
def test_continuous_elbo_is_the_many_step_limit_of_the_discrete_elbo(process):
    high = V if isinstance(process, UniformProcess) else V - 1
    k_x, k_c, k_l = jax.random.split(jax.random.key(5), 3)
    x0 = jax.random.randint(k_x, (B, LEN), 0, high)
    if isinstance(process, MaskingProcess):
        x0 = jnp.where(x0 >= process.mask_id, x0 + 1, x0)
    xt, _ = process.corrupt(k_c, x0, TIMES)
    logits = 1.5 * jax.random.normal(k_l, (B, LEN, V)) + jax.nn.one_hot(x0, V)
    continuous = np.asarray(L.process_elbo(logits, x0, xt, TIMES, process))
    with jax.enable_x64(True):
        logits64 = jnp.asarray(np.asarray(logits), jnp.float64)
        times64 = jnp.asarray(np.asarray(TIMES), jnp.float64)
        coarse = np.asarray(L.discrete_time_elbo(logits64, x0, xt, times64, process, num_steps=200))
        half = np.asarray(L.discrete_time_elbo(logits64, x0, xt, times64, process, num_steps=1000))
        fine = np.asarray(L.discrete_time_elbo(logits64, x0, xt, times64, process, num_steps=2000))
        # The float32 discrete ELBO agrees too.
        np.testing.assert_allclose(L.discrete_time_elbo(logits, x0, xt, TIMES, process, 2000), fine, rtol=1e-3)
    np.testing.assert_allclose(fine, continuous, rtol=5e-3, atol=1e-4)
    # Convergence is first order in 1/num_steps: 10x more steps brings it ~10x closer, and Richardson
    # extrapolation (2 D_2000 - D_1000) removes the leading error term.
    assert np.all(np.abs(fine - continuous) <= 0.2 * np.abs(coarse - continuous) + 1e-4)
    np.testing.assert_allclose(2 * fine - half, continuous, rtol=2e-4, atol=1e-4)


def _udlm_reference(x_theta, x0, xt, alpha, alpha_prime, n):
    """UDLM (Schiff et al. 2024) continuous-time integrand for one position, written from the paper's formula."""
    xbar = n * alpha * np.eye(n)[x0] + (1 - alpha)
    xbar_theta = n * alpha * x_theta + (1 - alpha)
    i = xt
    log_term = sum(xbar[j] / xbar[i] * math.log(xbar_theta[i] * xbar[j] / (xbar_theta[j] * xbar[i])) for j in range(n))
    return alpha_prime / (n * alpha) * (n / xbar[i] - n / xbar_theta[i] - log_term)


@pytest.mark.slow
def test_uniform_elbo_matches_udlm_formula_after_reparameterisation():
    schedule = LinearSchedule()
    rng = np.random.default_rng(3)
    cases = [(2, 2, 0.3), (2, 4, 0.3), (0, 6, 0.85), (5, 1, 0.05), (3, 3, 0.97)]  # (x0, xt, t)
    references, predictions = [], []
    for x0, xt, t in cases:
        alpha, alpha_prime = 1e-4 + (1 - 2e-4) * (1 - t), -(1 - 2e-4)
        x_theta = rng.dirichlet(np.ones(V))
        references.append(_udlm_reference(x_theta, x0, xt, alpha, alpha_prime, V))
        # UDLM's x_theta(y) corresponds to our p(x0 = y | x_t) proportional to x_theta(y) q_t(x_t | y).
        likelihood = alpha * (np.arange(V) == xt) + (1 - alpha) / V
        predictions.append(x_theta * likelihood / (x_theta * likelihood).sum())
    x0, xt, t = (np.array(column) for column in zip(*cases))
    with jax.enable_x64(True):
        got = L.uniform_elbo(
            jnp.log(jnp.asarray(np.stack(predictions)))[:, None],
            jnp.asarray(x0)[:, None],
            jnp.asarray(xt)[:, None],
            jnp.asarray(t, jnp.float64),
            schedule,
        )
        np.testing.assert_allclose(got, references, rtol=1e-9, atol=1e-12)


def test_uniform_elbo_masks_and_stays_finite_with_gradients():
    x0, xt, logits = _problem(UNIFORM_EXCLUDING, seed=2)
    allowed = UNIFORM_EXCLUDING.allowed_vocab()
    full = L.uniform_elbo(logits, x0, xt, TIMES, UNIFORM_EXCLUDING.schedule, allowed)
    loss_mask = jnp.zeros((B, LEN), bool).at[:, 1:4].set(True)
    part = L.uniform_elbo(logits, x0, xt, TIMES, UNIFORM_EXCLUDING.schedule, allowed, loss_mask)
    rest = L.uniform_elbo(logits, x0, xt, TIMES, UNIFORM_EXCLUDING.schedule, allowed, ~loss_mask)
    np.testing.assert_allclose(part + rest, full, rtol=1e-5)
    assert np.all(np.asarray(full) >= 0)
    grads = jax.grad(lambda lg: L.uniform_elbo(lg, x0, xt, TIMES, UNIFORM_EXCLUDING.schedule, allowed).sum())(logits)
    assert np.all(np.isfinite(np.asarray(grads)))
    with pytest.raises(ValueError, match="allowed"):
        L.uniform_elbo(logits, x0, xt, TIMES, UNIFORM.schedule, jnp.ones(V + 1, bool))


def test_bf16_logits_are_handled_in_float32():
    x0, xt, logits = _problem(UNIFORM, seed=3)
    low = logits.astype(jnp.bfloat16)
    reference = L.uniform_elbo(low.astype(jnp.float32), x0, xt, TIMES, UNIFORM.schedule)
    got = L.uniform_elbo(low, x0, xt, TIMES, UNIFORM.schedule)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, reference, rtol=1e-6)
    assert L.canvas_cross_entropy(low, x0).dtype == jnp.float32
    assert L.masking_elbo(low, x0, xt, TIMES, MASKING.schedule, V - 1).dtype == jnp.float32


def test_prior_kl_closed_forms():
    x0 = jnp.array([[0, 3, 5]])
    alpha1 = 1e-4
    masking = MaskingProcess(vocab_size=V, schedule=LinearSchedule(), mask_id=V - 1)
    per_token = alpha1 * math.log(V) + (1 - alpha1) * math.log((1 - alpha1) / (1 - alpha1 + alpha1 / V))
    np.testing.assert_allclose(L.prior_kl(x0, masking), [3 * per_token], rtol=1e-3)
    q_x0 = alpha1 + (1 - alpha1) / V  # uniform: the prior is exactly uniform over V
    per_token = q_x0 * math.log(V * q_x0) + (V - 1) * ((1 - alpha1) / V) * math.log(1 - alpha1)
    np.testing.assert_allclose(L.prior_kl(x0, UNIFORM), [3 * per_token], rtol=1e-3)
    excluding = UniformProcess(vocab_size=V, schedule=LinearSchedule(), excluded_ids=(0,))  # x0 = 0 is excluded
    q = np.array([alpha1] + [(1 - alpha1) / (V - 1)] * (V - 1))
    prior = alpha1 / V + (1 - alpha1) * np.array([0.0] + [1 / (V - 1)] * (V - 1))
    np.testing.assert_allclose(L.prior_kl(x0[:, :1], excluding), [np.sum(q * np.log(q / prior))], rtol=1e-3)


def test_reconstruction_copies_unmasked_tokens():
    x0 = jnp.array([[1, 2, 3]])
    xt = jnp.array([[1, V - 1, 3]])
    logits = jnp.log(jnp.array([[[0.1, 0.2, 0.3, 0.1, 0.1, 0.1, 0.1]] * 3]))
    got = L.reconstruction_nll(logits, x0, xt, MASKING)
    assert float(got[0]) == pytest.approx(-math.log(0.3 / 0.9), rel=1e-5)  # mask mass (0.1) renormalised away


def test_canvas_cross_entropy_by_hand():
    logits = jnp.log(jnp.array([[[0.25, 0.75], [0.5, 0.5], [0.9, 0.1]], [[0.2, 0.8], [0.6, 0.4], [0.3, 0.7]]]))
    targets = jnp.array([[1, 0, 1], [0, 0, 1]])
    mask = jnp.array([[True, True, False], [False, False, False]])
    got = L.canvas_cross_entropy(logits, targets, mask)
    np.testing.assert_allclose(got, [(math.log(4 / 3) + math.log(2)) / 2, 0.0], rtol=1e-6)
    unmasked = L.canvas_cross_entropy(logits, targets)
    np.testing.assert_allclose(unmasked[1], (math.log(5) + math.log(1 / 0.6) + math.log(1 / 0.7)) / 3, rtol=1e-6)


def test_masked_token_cross_entropy_is_the_pooled_mean_over_masked_positions():
    # vocab [a, b, MASK]; mask_id 2. Row 0 has two masked positions, row 1 one, row 2 none.
    probs = jnp.array([0.25, 0.75, 0.0])
    logits = jnp.broadcast_to(jnp.log(probs + 1e-30), (3, 3, 3)).at[..., 2].set(5.0)  # mask logit is dropped
    x0 = jnp.array([[1, 0, 1], [0, 1, 1], [0, 0, 1]])
    xt = jnp.array([[2, 2, 1], [2, 1, 1], [0, 0, 1]])
    got = L.masked_token_cross_entropy(logits, x0, xt, mask_id=2)
    pooled = (math.log(4 / 3) + math.log(4) + math.log(4)) / 3
    np.testing.assert_allclose(jnp.mean(got), pooled, rtol=1e-5)
    np.testing.assert_allclose(got[2], 0.0)
    # The loss mask removes a masked position from both the sum and the count.
    keep = jnp.array([[True, False, True], [True, True, True], [True, True, True]])
    got = L.masked_token_cross_entropy(logits, x0, xt, mask_id=2, loss_mask=keep)
    np.testing.assert_allclose(jnp.mean(got), (math.log(4 / 3) + math.log(4)) / 2, rtol=1e-5)


def test_token_reweighting_weighs_each_masked_position_by_alpha_times_one_minus_p_to_the_gamma():
    # MGDM (Ye et al. 2024): CE_i * alpha * (1 - p_i)^gamma, pooled over the masked positions as before.
    probs = jnp.array([0.25, 0.75, 0.0])
    logits = jnp.broadcast_to(jnp.log(probs + 1e-30), (2, 3, 3)).at[..., 2].set(5.0)
    x0 = jnp.array([[1, 0, 1], [0, 1, 1]])
    xt = jnp.array([[2, 2, 1], [2, 1, 1]])  # masked: (0,0) p=.75, (0,1) p=.25, (1,0) p=.25
    got = L.masked_token_cross_entropy(logits, x0, xt, mask_id=2, token_reweight=(0.25, 1.0))
    want = 0.25 * (0.25 * math.log(4 / 3) + 0.75 * math.log(4) + 0.75 * math.log(4)) / 3
    np.testing.assert_allclose(jnp.mean(got), want, rtol=1e-5)
    squared = L.masked_token_cross_entropy(logits, x0, xt, mask_id=2, token_reweight=(1.0, 2.0))
    np.testing.assert_allclose(jnp.mean(squared), (0.0625 * math.log(4 / 3) + 2 * 0.5625 * math.log(4)) / 3, rtol=1e-5)
    plain = L.masked_token_cross_entropy(logits, x0, xt, mask_id=2)
    np.testing.assert_allclose(L.masked_token_cross_entropy(logits, x0, xt, 2, token_reweight=(0.5, 0.0)), plain / 2)
    # Not stop-gradiented (focal form): d/dl [(1 - e^-l) l] = (1 - e^-l) + l e^-l.
    nll = jnp.array(0.7)
    grad = jax.grad(lambda l: L.token_reweight_factor(l, 1.0, 1.0) * l)(nll)
    np.testing.assert_allclose(grad, (1 - math.exp(-0.7)) + 0.7 * math.exp(-0.7), rtol=1e-6)
    with pytest.raises(ValueError, match="gamma >= 0"):
        L.token_reweight_factor(nll, 1.0, -1.0)


def test_autoregressive_cross_entropy_by_hand():
    probs = jnp.array([[[0.1, 0.6, 0.3], [0.2, 0.2, 0.6], [0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3]]])
    tokens = jnp.array([[0, 1, 2, 0]])
    mean, count = L.autoregressive_cross_entropy(jnp.log(probs), tokens)
    assert int(count[0]) == 3  # position 0 is never a target
    assert float(mean[0]) == pytest.approx(-(math.log(0.6) + math.log(0.6) + math.log(0.5)) / 3, rel=1e-6)
    mask = jnp.array([[True, False, True, True]])  # drop the target at position 1
    mean, count = L.autoregressive_cross_entropy(jnp.log(probs), tokens, mask)
    assert int(count[0]) == 2
    assert float(mean[0]) == pytest.approx(-(math.log(0.6) + math.log(0.5)) / 2, rel=1e-6)
    bits = L.bits_per_token(mean * count, count)
    assert float(bits) == pytest.approx(-(math.log2(0.6) + math.log2(0.5)) / 2, rel=1e-6)


def test_input_validation():
    x0, xt, logits = _problem(UNIFORM)
    with pytest.raises(ValueError, match="t must have shape"):
        L.uniform_elbo(logits, x0, xt, TIMES[:2], UNIFORM.schedule)
    with pytest.raises(ValueError, match="mask_id"):
        L.masking_elbo(logits, x0, xt, TIMES, MASKING.schedule, V)
    with pytest.raises(ValueError, match="loss_mask"):
        L.canvas_cross_entropy(logits, x0, jnp.ones((B, LEN + 1), bool))
    with pytest.raises(ValueError, match="num_steps"):
        L.discrete_time_elbo(logits, x0, xt, TIMES, UNIFORM, 0)


@pytest.mark.slow
def test_toy_masking_elbo_is_tight_and_uniform_elbo_bounds_the_nll():
    """Exact models on an enumerable non-factorised distribution: masking ELBO = NLL, uniform ELBO >= NLL."""
    result = enumerable_toy.run(num_samples=20_000, seed=0)
    nll = result["true_nll_bits"]
    assert result["total_correlation_bits"] > 0.5  # clearly non-factorised
    assert result["masking_tight"], result
    assert result["uniform_bound_ok"], result
    # Without Monte Carlo: both bounds hold and are tight up to the O(eps) endpoint terms.
    for key in ("elbo_masking_exact_bits", "elbo_uniform_exact_bits"):
        assert nll - 1e-5 <= result[key] <= nll + 2e-3, (key, result)


def test_generalised_kl_matches_its_formula_either_side_of_the_large_ratio_switch():
    """f(r, r^) = r log(r / r^) - r + r^ from logs, in float64: moderate log-ratios, and d = log r - log r^ just under
    and over 30 (where r - r^ stops being computed as r^ expm1(d)); r = 0 gives r^, r^ = 0 < r gives inf, both 0
    give 0."""
    pairs = [(math.log(2), math.log(3)), (math.log(3), math.log(2)), (0.0, 0.0), (29.5, 0.0), (30.5, 0.0), (35.0, 2.0)]
    log_r, log_r_hat = (np.array(column) for column in zip(*pairs))
    with jax.enable_x64(True):
        got = np.asarray(L._generalised_kl(jnp.asarray(log_r), jnp.asarray(log_r_hat)))
        edges = np.asarray(L._generalised_kl(jnp.array([-np.inf, 0.5, -np.inf]), jnp.array([-0.7, -np.inf, -np.inf])))
    r, r_hat = np.exp(log_r), np.exp(log_r_hat)
    np.testing.assert_allclose(got, r * (log_r - log_r_hat) - r + r_hat, rtol=1e-10)
    np.testing.assert_allclose(edges, [math.exp(-0.7), np.inf, 0.0], rtol=1e-12)


def test_bits_per_token_without_loss_tokens_is_zero_and_with_one_is_its_nats_in_bits():
    assert float(L.bits_per_token(jnp.array([0.0, 0.0]), jnp.array([0, 0]))) == 0.0
    np.testing.assert_allclose(L.bits_per_token(jnp.array([2.0, 0.0]), jnp.array([1, 0])), 2.0 / math.log(2), rtol=1e-6)


def test_malformed_shapes_are_named_in_the_error():
    x0, xt, logits = _problem(UNIFORM)
    with pytest.raises(ValueError, match="need logits"):  # x0 and xt agree with each other but not with the logits
        L.uniform_elbo(logits, x0[:, 1:], xt[:, 1:], TIMES, UNIFORM.schedule)
    with pytest.raises(ValueError, match=rf"t must have shape \(batch,\) = \({B},\), got \(2,\)"):
        L.masking_elbo(logits, x0, xt, TIMES[:2], MASKING.schedule, MASKING.mask_id)


@pytest.mark.parametrize("eps", [1e-4, 1.3e-3, 0.05])
def test_prior_kl_is_the_exact_kl_in_float64_and_close_in_float32(eps):
    """sum_k q_k log(q_k / p_k) with q = eps onehot(x0) + (1 - eps) pi and p = eps / V + (1 - eps) pi. With eps 1.3e-3
    the uniform prior's ratio r = (q - p) / p at x0 is 7.8e-3, just under the series switch (|r| < 1e-2): the float64
    value then checks the series to its truncation error (~r^3 / 10 relative); eps 0.05 is over it."""
    x0 = [0, 3, 5]
    processes = [
        MaskingProcess(vocab_size=V, schedule=LinearSchedule(eps=eps), mask_id=V - 1),
        UniformProcess(vocab_size=V, schedule=LinearSchedule(eps=eps)),
        UniformProcess(vocab_size=V, schedule=LinearSchedule(eps=eps), excluded_ids=(1,)),
    ]
    for process in processes:
        pi = np.asarray(process.noise_distribution(), np.float64)
        prior = eps / V + (1 - eps) * pi
        want = 0.0
        for token in x0:
            q = eps * np.eye(V)[token] + (1 - eps) * pi
            want += np.sum(np.where(q > 0, q * np.log(np.where(q > 0, q, 1.0) / prior), 0.0))
        with jax.enable_x64(True):
            np.testing.assert_allclose(L.prior_kl(jnp.array([x0]), process), [want], rtol=2e-7)
        np.testing.assert_allclose(L.prior_kl(jnp.array([x0]), process), [want], rtol=2e-5)


def test_discrete_time_elbo_steps_back_one_grid_step_clipped_at_zero():
    """s = max(t - 1/num_steps, 0): with num_steps 2, t = 0.3 and 0.5 step back to s = 0, t = 0.8 and 1 to 0.3 and 0.5;
    the value is num_steps * KL(q(x_s | x_t, x0) || p(x_s | x_t)) per position, summed."""
    t = jnp.array([0.3, 0.5, 0.8, 1.0])
    s = jnp.array([0.0, 0.0, 0.3, 0.5])
    for process in (UNIFORM, MASKING):
        x0, xt, logits = _problem(process, seed=4)
        xt, _ = process.corrupt(jax.random.key(9), x0, t)
        got = L.discrete_time_elbo(logits, x0, xt, t, process, num_steps=2)
        model = np.asarray(process.posterior_probs(xt, jax.nn.softmax(logits), s, t), np.float64)
        data = np.asarray(process.posterior_probs(xt, jax.nn.one_hot(x0, V), s, t), np.float64)
        kl = np.sum(data * np.log(np.where(data > 0, data / np.where(data > 0, model, 1.0), 1.0)), axis=-1)
        np.testing.assert_allclose(got, 2 * kl.sum(-1), rtol=1e-4, atol=1e-6)


def test_masked_token_cross_entropy_with_no_masked_position_and_with_one():
    probs = jnp.array([0.25, 0.75, 0.0])
    logits = jnp.broadcast_to(jnp.log(probs + 1e-30), (2, 2, 3))
    x0 = jnp.array([[1, 0], [0, 1]])
    np.testing.assert_array_equal(L.masked_token_cross_entropy(logits, x0, x0, mask_id=2), [0.0, 0.0])
    one = L.masked_token_cross_entropy(logits, x0, jnp.array([[1, 2], [0, 1]]), mask_id=2)  # only (0, 1): p = 0.25
    np.testing.assert_allclose(one, [2 * math.log(4), 0.0], rtol=1e-5)


def test_reconstruction_nll_sums_over_the_loss_positions_only():
    x0, xt, logits = _problem(MASKING, seed=6)
    xt = jnp.where(jnp.arange(LEN) % 2 == 0, MASKING.mask_id, x0)  # every other position masked
    keep = jnp.zeros((B, LEN), bool).at[:, :4].set(True)
    full = L.reconstruction_nll(logits, x0, xt, MASKING)
    part = L.reconstruction_nll(logits, x0, xt, MASKING, keep)
    rest = L.reconstruction_nll(logits, x0, xt, MASKING, ~keep)
    np.testing.assert_allclose(part + rest, full, rtol=1e-6)
    assert np.all(np.asarray(rest) > 0) and np.all(np.asarray(part) > 0)


def test_discrete_time_elbo_with_one_step_and_a_loss_mask():
    x0, xt, logits = _problem(UNIFORM, seed=7)
    one_step = L.discrete_time_elbo(logits, x0, xt, TIMES, UNIFORM, num_steps=1)  # s = 0 for every t <= 1
    assert np.all(np.isfinite(np.asarray(one_step))) and np.all(np.asarray(one_step) > 0)
    keep = jnp.zeros((B, LEN), bool).at[:, 2:].set(True)
    part = L.discrete_time_elbo(logits, x0, xt, TIMES, UNIFORM, 5, keep)
    rest = L.discrete_time_elbo(logits, x0, xt, TIMES, UNIFORM, 5, ~keep)
    np.testing.assert_allclose(part + rest, L.discrete_time_elbo(logits, x0, xt, TIMES, UNIFORM, 5), rtol=1e-5)


def test_autoregressive_cross_entropy_of_an_example_without_targets_is_zero():
    probs = jnp.full((2, 3, 4), 0.25)
    tokens = jnp.array([[0, 1, 2], [3, 2, 1]])
    mean, count = L.autoregressive_cross_entropy(jnp.log(probs), tokens, jnp.array([[True] * 3, [True, False, False]]))
    np.testing.assert_array_equal(count, [2, 0])
    np.testing.assert_allclose(mean, [math.log(4), 0.0], rtol=1e-6)
