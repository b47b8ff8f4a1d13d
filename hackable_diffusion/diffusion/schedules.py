"""Noise schedules alpha(t) and training-time samplers for t.

A schedule gives the keep-probability alpha(t) of a discrete diffusion process for t in [0, 1]: a token of the clean
sequence survives to time t with probability alpha(t) (otherwise it is masked or resampled, see `processes.py`).
alpha(0) = 1 is clean data, alpha(1) = 0 is pure noise, and alpha decreases in between.

References:
    * MD4, Shi et al. 2024, "Simplified and Generalized Masked Diffusion for Discrete Data": alpha(t) = eps + (1 -
        2 eps) a(t) with a(t) = 1 - t (linear), 1 - t^k (polynomial), 1 - cos(pi/2 (1 - t)) (cosine).
    * MDLM, Sahoo et al. 2024: log-linear total noise sigma(t) = -log(1 - (1 - eps) t), i.e. alpha = 1 - (1 - eps) t;
        antithetic (low-discrepancy) time sampling.
    * SEDD, Lou et al. 2024: geometric total noise sigma_bar(t) = sigma_min^(1-t) sigma_max^t, alpha = exp(-sigma_bar).
    * google/hackable_diffusion: cosine alpha(t) = cos(pi t / 2) (named `CosineSchedule` here; the MD4 one is
        `MD4CosineSchedule`).
    * BD3-LM, Arriola et al. 2025: "clipped" mask rates t ~ U[beta, omega] (`ClippedUniformTimeSampler`).
    * DiffusionGemma reference: linear schedule (noise probability t) with t ~ U[1e-4, 1 - 1e-4].

Deliberate choices and differences:
    * Every schedule is clipped the MD4 way, alpha(t) = eps + (1 - 2 eps) a(t), with one shared `eps` field (default
        1e-4), so alpha(t) lies in [eps, 1 - eps], the weight -alpha'/(1 - alpha) of the masking ELBO stays finite at
        t = 0, and the derivative stays exact: alpha'(t) = (1 - 2 eps) a'(t).
    * `LogLinearSchedule` uses the same symmetric clipping (default eps 1e-3, MDLM's value). MDLM's own alpha is
        1 - (1 - eps) t, which equals 1 at t = 0; ours is 1 - eps there. Its alpha is the linear one; the class
        exists for the sigma (total noise) view, `total_noise(t) = -log alpha(t)`, shared by every schedule.
    * `GeometricSchedule`: SEDD's exp(-sigma_bar(t)) is 1 - sigma_min at t = 0 and exp(-sigma_max) at t = 1, so we
        rescale it affinely to hit the endpoints exactly before the common clipping:
            a(t) = (exp(-sigma_bar(t)) - exp(-sigma_max)) / (exp(-sigma_min) - exp(-sigma_max)).
        With SEDD's (1e-4, 20) the rescaling moves alpha by at most 1e-4.
    * `AntitheticTimeSampler` uses one shared uniform shift, t_i = (u + i/B) mod 1 (VDM/MD4 style). MDLM draws an
        independent jitter per stratum; both put exactly one sample in each of the B strata.

From a config: `config.diffusion.schedule` is a section holding `name` (a key of `SCHEDULES`) and the fields of that
class (`schedule_from_config`; the default is `DEFAULT_SCHEDULE_SECTION`), so
`--config.diffusion.schedule.name=polynomial --config.diffusion.schedule.power=3` trains with
`PolynomialSchedule(power=3)`. The section's keys are read off the dataclass fields of the classes in `SCHEDULES`
(`schedule_arguments`): a new schedule is a subclass here and its entry in `SCHEDULES`, and its fields are config
keys with nothing else to edit.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import typing
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

DEFAULT_EPS = 1e-4


def _as_float(t: ArrayLike) -> Float[Array, "*shape"]:
    return jnp.asarray(t, dtype=jnp.result_type(float))


@dataclasses.dataclass(frozen=True)
class Schedule(abc.ABC):
    """Base class: alpha(t) = eps + (1 - 2 eps) a(t); subclasses define the unclipped a(t) and its derivative."""

    eps: float = dataclasses.field(default=DEFAULT_EPS, kw_only=True)

    def __post_init__(self):
        if not 0.0 <= self.eps < 0.5:
            raise ValueError(
                f"{type(self).__name__}: eps must lie in [0, 0.5), got {self.eps}; the default is {DEFAULT_EPS}."
            )

    @abc.abstractmethod
    def _a(self, t: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        """Unclipped keep-probability, a(0) = 1, a(1) = 0."""

    @abc.abstractmethod
    def _a_prime(self, t: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        """Exact derivative of a(t)."""

    def alpha(self, t: ArrayLike) -> Float[Array, "*shape"]:
        """Keep-probability at time t (any shape); 1 - eps at t = 0, eps at t = 1."""
        return self.eps + (1.0 - 2.0 * self.eps) * self._a(_as_float(t))

    def alpha_prime(self, t: ArrayLike) -> Float[Array, "*shape"]:
        """Exact d alpha / dt (negative)."""
        return (1.0 - 2.0 * self.eps) * self._a_prime(_as_float(t))

    def total_noise(self, t: ArrayLike) -> Float[Array, "*shape"]:
        """sigma_bar(t) = -log alpha(t), the SEDD/MDLM total-noise view of the same schedule."""
        return -jnp.log(self.alpha(t))

    def noise_rate(self, t: ArrayLike) -> Float[Array, "*shape"]:
        """d sigma_bar / dt = -alpha'(t) / alpha(t), the forward jump rate."""
        return -self.alpha_prime(t) / self.alpha(t)

    def __call__(self, t: ArrayLike) -> Float[Array, "*shape"]:
        return self.alpha(t)


@dataclasses.dataclass(frozen=True)
class LinearSchedule(Schedule):
    """a(t) = 1 - t (MD4 default, LLaDA, DiffusionGemma)."""

    def _a(self, t):
        return 1.0 - t

    def _a_prime(self, t):
        return -jnp.ones_like(t)


@dataclasses.dataclass(frozen=True)
class MD4CosineSchedule(Schedule):
    """a(t) = 1 - cos(pi/2 (1 - t)) (MD4 "cosine"): noise is added fast early on."""

    def _a(self, t):
        return 1.0 - jnp.cos(0.5 * jnp.pi * (1.0 - t))

    def _a_prime(self, t):
        return -0.5 * jnp.pi * jnp.sin(0.5 * jnp.pi * (1.0 - t))


@dataclasses.dataclass(frozen=True)
class CosineSchedule(Schedule):
    """a(t) = cos(pi t / 2) (google/hackable_diffusion, MaskGIT-like): noise is added slowly early on."""

    def _a(self, t):
        return jnp.cos(0.5 * jnp.pi * t)

    def _a_prime(self, t):
        return -0.5 * jnp.pi * jnp.sin(0.5 * jnp.pi * t)


@dataclasses.dataclass(frozen=True)
class PolynomialSchedule(Schedule):
    """a(t) = 1 - t^power (MD4 "polyK")."""

    power: float = 2.0

    def __post_init__(self):
        super().__post_init__()
        if not self.power > 0:
            raise ValueError(f"PolynomialSchedule: power must be > 0, got {self.power}.")

    def _a(self, t):
        return 1.0 - t**self.power

    def _a_prime(self, t):
        return -self.power * t ** (self.power - 1.0)


@dataclasses.dataclass(frozen=True)
class GeometricSchedule(Schedule):
    """SEDD geometric: sigma_bar(t) = sigma_min^(1-t) sigma_max^t, a(t) = exp(-sigma_bar) rescaled to a(0)=1, a(1)=0."""

    sigma_min: float = 1e-4
    sigma_max: float = 20.0

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 < self.sigma_min < self.sigma_max:
            raise ValueError(
                f"GeometricSchedule: need 0 < sigma_min < sigma_max, got sigma_min={self.sigma_min}, "
                f"sigma_max={self.sigma_max} (SEDD uses 1e-4 and 20)."
            )

    def _sigma_bar(self, t):
        return self.sigma_min * (self.sigma_max / self.sigma_min) ** t

    def _normaliser(self) -> float:
        return math.exp(-self.sigma_min) - math.exp(-self.sigma_max)

    def _a(self, t):
        return (jnp.exp(-self._sigma_bar(t)) - math.exp(-self.sigma_max)) / self._normaliser()

    def _a_prime(self, t):
        sigma_bar = self._sigma_bar(t)
        log_ratio = math.log(self.sigma_max / self.sigma_min)
        return -sigma_bar * log_ratio * jnp.exp(-sigma_bar) / self._normaliser()


@dataclasses.dataclass(frozen=True)
class LogLinearSchedule(Schedule):
    """MDLM log-linear: sigma(t) = -log alpha(t) with alpha linear in t; eps defaults to MDLM's 1e-3."""

    eps: float = dataclasses.field(default=1e-3, kw_only=True)

    def _a(self, t):
        return 1.0 - t

    def _a_prime(self, t):
        return -jnp.ones_like(t)


SCHEDULES: dict[str, type[Schedule]] = {
    "linear": LinearSchedule,
    "md4_cosine": MD4CosineSchedule,
    "cosine": CosineSchedule,
    "polynomial": PolynomialSchedule,
    "geometric": GeometricSchedule,
    "loglinear": LogLinearSchedule,
}


# config.diffusion.schedule of every recipe: a section holds `name` (a key of SCHEDULES) and that class's fields.
DEFAULT_SCHEDULE_SECTION: dict[str, Any] = {"name": "linear", "eps": DEFAULT_EPS}


def schedule_fields(schedule_class: type[Schedule]) -> dict[str, type]:
    """The fields of a schedule class with their types, e.g. {"eps": float, "power": float} for PolynomialSchedule."""
    hints = typing.get_type_hints(schedule_class)
    return {field.name: hints[field.name] for field in dataclasses.fields(schedule_class) if field.init}


def schedule_arguments() -> dict[str, type]:
    """Every field a schedule of SCHEDULES takes, with its type: the keys of a config section besides `name`
    (`recipes.schedule_section` gives each a typed placeholder, so `--config.diffusion.schedule.power=3` parses)."""
    arguments: dict[str, type] = {}
    for schedule_class in SCHEDULES.values():
        arguments.update(schedule_fields(schedule_class))
    return dict(sorted(arguments.items()))


def schedule_from_config(section: Mapping[str, Any]) -> Schedule:
    """The schedule a config section describes: `name` and the fields of that class, None meaning the class default;
    `{"name": "polynomial", "power": 3.0, "eps": 1e-4}` builds `PolynomialSchedule(power=3.0, eps=1e-4)`. A field the
    named class does not take (set, or a key no schedule has) is refused on one line naming the class's fields."""
    fields = dict(section.items())
    name = fields.pop("name", None)
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {sorted(SCHEDULES)}.")
    schedule_class = SCHEDULES[name]
    allowed, known = schedule_fields(schedule_class), schedule_arguments()
    # an unset placeholder of another class's field is fine; a set one, or a key no schedule has, is not
    refused = sorted(k for k, v in fields.items() if k not in allowed and (v is not None or k not in known))
    if refused:
        takers = {key: sorted(n for n, c in SCHEDULES.items() if key in schedule_fields(c)) for key in refused}
        hint = "; ".join(f"{key}: {', '.join(names)}" for key, names in takers.items() if names)
        raise ValueError(
            f"schedule {name!r} ({schedule_class.__name__}) does not take {refused}"
            + (f" (schedules that do: {hint})" if hint else "")
            + f"; its fields are {sorted(allowed)}."
        )
    return schedule_class(**{key: value for key, value in fields.items() if value is not None})


def make_schedule(name: str, **kwargs) -> Schedule:
    """Builds a schedule by name, e.g. `make_schedule("polynomial", power=3, eps=1e-4)` (`schedule_from_config`)."""
    return schedule_from_config({"name": name, **kwargs})


# ---------------------------------------------------------------------------------------------------------------------
# Time samplers: t for each example of a training batch.
# ---------------------------------------------------------------------------------------------------------------------


def _check_interval(owner: str, low: float, high: float, low_name: str, high_name: str):
    if not 0.0 <= low < high <= 1.0:
        raise ValueError(f"{owner}: need 0 <= {low_name} < {high_name} <= 1, got {low_name}={low}, {high_name}={high}.")


@dataclasses.dataclass(frozen=True)
class UniformTimeSampler:
    """t ~ U[t_min, t_max] independently per example (DiffusionGemma: t_min = 1e-4, t_max = 1 - 1e-4)."""

    t_min: float = 0.0
    t_max: float = 1.0

    def __post_init__(self):
        _check_interval("UniformTimeSampler", self.t_min, self.t_max, "t_min", "t_max")

    def __call__(self, key: jax.Array, batch_size: int) -> Float[Array, "b"]:
        return jax.random.uniform(key, (batch_size,), minval=self.t_min, maxval=self.t_max)


@dataclasses.dataclass(frozen=True)
class AntitheticTimeSampler:
    """Stratified t: t_i = t_min + (t_max - t_min) ((u + i/B) mod 1), one shared u ~ U[0, 1).

    Exactly one sample falls in each of the B equal strata of [t_min, t_max], which lowers the variance of the batch
    mean of the ELBO (VDM, MD4, MDLM). Samples are in stratum order, so shuffle them if order matters.
    """

    t_min: float = 0.0
    t_max: float = 1.0

    def __post_init__(self):
        _check_interval("AntitheticTimeSampler", self.t_min, self.t_max, "t_min", "t_max")

    def __call__(self, key: jax.Array, batch_size: int) -> Float[Array, "b"]:
        u = jax.random.uniform(key, ())
        unit = jnp.mod(u + jnp.arange(batch_size) / batch_size, 1.0)
        return self.t_min + (self.t_max - self.t_min) * unit


@dataclasses.dataclass(frozen=True)
class ClippedUniformTimeSampler:
    """BD3-LM clipped schedule: t ~ U[beta, omega]; with the linear schedule t is the mask rate 1 - alpha(t)."""

    beta: float = 0.3
    omega: float = 0.8

    def __post_init__(self):
        _check_interval("ClippedUniformTimeSampler", self.beta, self.omega, "beta", "omega")

    def __call__(self, key: jax.Array, batch_size: int) -> Float[Array, "b"]:
        return jax.random.uniform(key, (batch_size,), minval=self.beta, maxval=self.omega)


TIME_SAMPLERS: dict[str, type] = {
    "uniform": UniformTimeSampler,
    "antithetic": AntitheticTimeSampler,
    "clipped_uniform": ClippedUniformTimeSampler,
}


def make_time_sampler(name: str, **kwargs):
    """Builds a time sampler by name, e.g. `make_time_sampler("clipped_uniform", beta=0.45, omega=0.95)`."""
    if name not in TIME_SAMPLERS:
        raise ValueError(f"unknown time sampler '{name}'; choose one of {sorted(TIME_SAMPLERS)}.")
    return TIME_SAMPLERS[name](**kwargs)
