"""Schedules: endpoints, monotonicity, exact derivatives, closed forms; time samplers: range and stratification."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion.diffusion import schedules as S

ALL_SCHEDULES = [
    S.LinearSchedule(),
    S.MD4CosineSchedule(),
    S.CosineSchedule(),
    S.PolynomialSchedule(power=2.0),
    S.PolynomialSchedule(power=3.5),
    S.PolynomialSchedule(power=0.5),
    S.GeometricSchedule(),
    S.GeometricSchedule(sigma_min=0.01, sigma_max=5.0, eps=1e-3),
    S.LogLinearSchedule(),
    S.LinearSchedule(eps=0.0),
]
IDS = [repr(s) for s in ALL_SCHEDULES]


@pytest.mark.parametrize("schedule", ALL_SCHEDULES, ids=IDS)
def test_endpoints_within_eps(schedule):
    assert abs(float(schedule(0.0)) - 1.0) <= schedule.eps + 1e-6
    assert abs(float(schedule(1.0))) <= schedule.eps + 1e-6
    assert float(schedule(0.0)) == pytest.approx(1.0 - schedule.eps, abs=1e-6)
    assert float(schedule(1.0)) == pytest.approx(schedule.eps, abs=1e-6)


@pytest.mark.parametrize("schedule", ALL_SCHEDULES, ids=IDS)
def test_monotone_decreasing_and_in_range(schedule):
    t = jnp.linspace(0.0, 1.0, 2001)
    alpha = np.asarray(schedule(t))
    assert np.all(np.diff(alpha) <= 1e-7), "alpha must not increase"
    assert alpha[0] - alpha[-1] > 0.99
    assert np.all(alpha >= schedule.eps - 1e-6) and np.all(alpha <= 1 - schedule.eps + 1e-6)
    assert np.all(np.asarray(schedule.alpha_prime(t[1:-1])) <= 0)


@pytest.mark.parametrize("schedule", ALL_SCHEDULES, ids=IDS)
def test_alpha_prime_equals_autodiff(schedule):
    t = jnp.linspace(0.01, 0.99, 97)
    autodiff = jax.vmap(jax.grad(lambda s: schedule.alpha(s)))(t)
    np.testing.assert_allclose(schedule.alpha_prime(t), autodiff, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("schedule", ALL_SCHEDULES, ids=IDS)
def test_alpha_prime_equals_finite_difference_in_float64(schedule):
    with jax.enable_x64(True):
        t = jnp.linspace(0.02, 0.98, 49, dtype=jnp.float64)
        h = 1e-6
        central = (schedule.alpha(t + h) - schedule.alpha(t - h)) / (2 * h)
        assert schedule.alpha_prime(t).dtype == jnp.float64
        np.testing.assert_allclose(schedule.alpha_prime(t), central, rtol=1e-6, atol=1e-8)


def test_closed_forms():
    eps = 1e-4
    t = 0.3
    scale = 1 - 2 * eps
    assert float(S.LinearSchedule()(t)) == pytest.approx(eps + scale * 0.7, rel=1e-6)
    assert float(S.MD4CosineSchedule()(t)) == pytest.approx(eps + scale * (1 - math.cos(math.pi / 2 * 0.7)), rel=1e-6)
    assert float(S.CosineSchedule()(t)) == pytest.approx(eps + scale * math.cos(math.pi * t / 2), rel=1e-6)
    assert float(S.PolynomialSchedule(power=3)(t)) == pytest.approx(eps + scale * (1 - t**3), rel=1e-6)
    sigma_bar = 1e-4 ** (1 - t) * 20.0**t
    raw = (math.exp(-sigma_bar) - math.exp(-20.0)) / (math.exp(-1e-4) - math.exp(-20.0))
    assert float(S.GeometricSchedule()(t)) == pytest.approx(eps + scale * raw, rel=1e-6)
    # Log-linear: MDLM's eps, sigma = -log alpha, and d sigma / dt = -alpha'/alpha.
    loglinear = S.LogLinearSchedule()
    assert loglinear.eps == 1e-3
    alpha = 1e-3 + (1 - 2e-3) * (1 - t)
    assert float(loglinear.total_noise(t)) == pytest.approx(-math.log(alpha), rel=1e-6)
    assert float(loglinear.noise_rate(t)) == pytest.approx((1 - 2e-3) / alpha, rel=1e-6)
    assert float(jax.grad(loglinear.total_noise)(t)) == pytest.approx(float(loglinear.noise_rate(t)), rel=1e-5)


def test_distinct_cosines_are_mirror_images():
    t = jnp.linspace(0, 1, 11)
    md4, hackable = S.MD4CosineSchedule(), S.CosineSchedule()
    np.testing.assert_allclose(md4(t), 1.0 - hackable(1.0 - t), atol=1e-6)
    assert float(md4(0.5)) != pytest.approx(float(hackable(0.5)), abs=1e-2)


def test_any_shape_and_call_equals_alpha():
    t = jax.random.uniform(jax.random.key(0), (2, 3, 4))
    for schedule in ALL_SCHEDULES:
        assert schedule(t).shape == (2, 3, 4)
        assert schedule.alpha_prime(t).shape == (2, 3, 4)
        np.testing.assert_array_equal(schedule(t), schedule.alpha(t))


def test_registry_builds_every_schedule_and_rejects_unknown_names():
    assert set(S.SCHEDULES) == {"linear", "md4_cosine", "cosine", "polynomial", "geometric", "loglinear"}
    assert S.make_schedule("polynomial", power=3, eps=1e-3) == S.PolynomialSchedule(power=3, eps=1e-3)
    assert isinstance(S.make_schedule("md4_cosine"), S.MD4CosineSchedule)
    with pytest.raises(ValueError, match="unknown schedule"):
        S.make_schedule("cosine_squared")
    assert isinstance(S.make_time_sampler("clipped_uniform", beta=0.45, omega=0.95), S.ClippedUniformTimeSampler)
    with pytest.raises(ValueError, match="unknown time sampler"):
        S.make_time_sampler("sobol")


def test_a_config_section_builds_the_named_class_with_its_fields():
    """`schedule_from_config`: `name` plus that class's fields; None (an unset slot of the config section) is the
    class default, and the default section is the linear schedule with eps 1e-4."""
    section = {"name": "polynomial", "power": 2.0, "eps": 1e-3, "sigma_min": None, "sigma_max": None}
    built = S.schedule_from_config(section)
    assert type(built) is S.PolynomialSchedule and built.power == 2.0 and built.eps == 1e-3
    assert S.schedule_from_config({"name": "loglinear", "eps": None}) == S.LogLinearSchedule()  # its own eps, 1e-3
    assert S.schedule_from_config(S.DEFAULT_SCHEDULE_SECTION) == S.LinearSchedule(eps=1e-4)
    assert S.schedule_from_config({"name": "geometric", "sigma_max": 5.0}) == S.GeometricSchedule(sigma_max=5.0)


def test_the_section_keys_are_the_fields_of_every_registered_schedule():
    assert S.schedule_arguments() == {"eps": float, "power": float, "sigma_min": float, "sigma_max": float}
    assert S.schedule_fields(S.PolynomialSchedule) == {"eps": float, "power": float}
    assert S.schedule_fields(S.LinearSchedule) == {"eps": float}


@pytest.mark.parametrize(
    "section, refused, fields",
    [
        ({"name": "linear", "eps": 1e-4, "power": 2.0}, "['power'] (schedules that do: power: polynomial)", "['eps']"),
        ({"name": "polynomial", "pwoer": None}, "['pwoer']", "['eps', 'power']"),  # no schedule has it: set or not
        ({"name": "geometric", "sigma": 3.0}, "['sigma']", "['eps', 'sigma_max', 'sigma_min']"),
    ],
)
def test_a_field_the_named_schedule_does_not_take_is_one_line_naming_its_fields(section, refused, fields):
    with pytest.raises(ValueError) as error:
        S.schedule_from_config(section)
    message = str(error.value)
    assert f"does not take {refused}" in message and message.endswith(f"its fields are {fields}.")
    assert "\n" not in message
    with pytest.raises(ValueError, match="unknown schedule 'cosine_squared'; choose one of"):
        S.schedule_from_config({"name": "cosine_squared"})
    with pytest.raises(ValueError, match=r"does not take \['power'\]"):
        S.make_schedule("cosine", power=2.0)


def test_invalid_parameters_raise():
    with pytest.raises(ValueError, match="eps"):
        S.LinearSchedule(eps=0.5)
    with pytest.raises(ValueError, match="power"):
        S.PolynomialSchedule(power=0.0)
    with pytest.raises(ValueError, match="sigma_min"):
        S.GeometricSchedule(sigma_min=5.0, sigma_max=1.0)
    with pytest.raises(ValueError, match="t_min"):
        S.UniformTimeSampler(t_min=0.5, t_max=0.5)
    with pytest.raises(ValueError, match="beta"):
        S.ClippedUniformTimeSampler(beta=0.9, omega=0.3)
    with pytest.raises(ValueError, match="t_max"):
        S.AntitheticTimeSampler(t_min=0.0, t_max=1.5)
    with pytest.raises(TypeError):
        S.Schedule()  # abstract


@pytest.mark.parametrize(
    "sampler, low, high",
    [
        (S.UniformTimeSampler(), 0.0, 1.0),
        (S.UniformTimeSampler(t_min=1e-4, t_max=1 - 1e-4), 1e-4, 1 - 1e-4),
        (S.AntitheticTimeSampler(t_min=0.1, t_max=0.6), 0.1, 0.6),
        (S.ClippedUniformTimeSampler(beta=0.45, omega=0.95), 0.45, 0.95),
    ],
)
def test_time_samplers_stay_in_range_and_are_deterministic(sampler, low, high):
    key = jax.random.key(3)
    t = np.asarray(sampler(key, 4096))
    assert t.shape == (4096,)
    assert t.min() >= low and t.max() <= high
    # Roughly uniform over the interval: the mean is within 5 standard errors of the midpoint.
    se = (high - low) / math.sqrt(12 * 4096)
    assert abs(t.mean() - (low + high) / 2) < 5 * se
    np.testing.assert_array_equal(t, sampler(key, 4096))


@pytest.mark.parametrize("batch_size", [1, 7, 64, 1000])
def test_antithetic_sampler_puts_exactly_one_sample_per_stratum(batch_size):
    t_min, t_max = 0.2, 0.9
    sampler = S.AntitheticTimeSampler(t_min=t_min, t_max=t_max)
    for seed in range(3):
        t = np.asarray(sampler(jax.random.key(seed), batch_size), np.float64)
        strata = np.floor((t - t_min) / ((t_max - t_min) / batch_size)).astype(int)
        np.testing.assert_array_equal(np.sort(strata), np.arange(batch_size))


def test_schedule_and_time_sampler_defaults_are_their_papers():
    """MD4's poly2 as the polynomial default, SEDD's geometric noise range (1e-4, 20), MDLM's log-linear eps 1e-3,
    BD3-LM's clipped mask-rate range [0.3, 0.8]."""
    assert S.PolynomialSchedule().power == 2.0
    assert (S.GeometricSchedule().sigma_min, S.GeometricSchedule().sigma_max) == (1e-4, 20.0)
    assert S.LogLinearSchedule().eps == 1e-3
    assert (S.ClippedUniformTimeSampler().beta, S.ClippedUniformTimeSampler().omega) == (0.3, 0.8)


def test_a_geometric_schedule_with_equal_noise_ends_is_refused():
    with pytest.raises(ValueError, match="sigma_min < sigma_max"):
        S.GeometricSchedule(sigma_min=1.0, sigma_max=1.0)
