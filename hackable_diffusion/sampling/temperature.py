"""Temperature shapers: the temperature T(t) by which a denoising step divides the logits at noise level t.

Reference: DiffusionGemma's `AnnealingTemperatureShaper` (docs/reference.md §2.5),
T(t) = min + (max - min) (1 - (1 - t)^exponent) with min 0.4, max 0.8, exponent 1, evaluated at the step's *current*
noise level t_i = 1 - i/S. With S = 48 steps the temperature goes from 0.8 at step 0 to 0.4083 at step 47 (0.4 itself
is never reached). The shaped logits feed three things (docs/reference.md §2.5): the candidate sample, the selection
rule's scores and the self-conditioning signal.

Differences: the reference keeps shaped logits in the logits dtype (bf16); the canvas loop here shapes them in float32.
A temperature must be > 0; a small value (e.g. 1e-3) is numerically greedy, since sampling is a float32 Gumbel-max.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float


@dataclasses.dataclass(frozen=True)
class Temperature(abc.ABC):
    """`temperature(t) -> T` for a noise level t in [0, 1] (1 = pure noise)."""

    @abc.abstractmethod
    def __call__(self, t: ArrayLike) -> Float[Array, "*shape"]:
        """The temperature at noise level t."""


@dataclasses.dataclass(frozen=True)
class ConstantTemperature(Temperature):
    """T(t) = value."""

    value: float = 1.0

    def __post_init__(self):
        if not self.value > 0:
            raise ValueError(f"ConstantTemperature: value must be > 0, got {self.value}; use e.g. 1e-3 for greedy.")

    def __call__(self, t: ArrayLike) -> Float[Array, "*shape"]:
        return jnp.full(jnp.shape(t), self.value, jnp.float32)


@dataclasses.dataclass(frozen=True)
class AnnealedTemperature(Temperature):
    """DiffusionGemma: T(t) = min + (max - min) (1 - (1 - t)^exponent); max at t = 1, min at t = 0."""

    min_temperature: float = 0.4
    max_temperature: float = 0.8
    exponent: float = 1.0

    def __post_init__(self):
        if not 0 < self.min_temperature <= self.max_temperature:
            raise ValueError(
                f"AnnealedTemperature: need 0 < min_temperature <= max_temperature, got "
                f"{self.min_temperature}, {self.max_temperature} (DiffusionGemma: 0.4, 0.8)."
            )
        if not self.exponent > 0:
            raise ValueError(f"AnnealedTemperature: exponent must be > 0, got {self.exponent}.")

    def __call__(self, t: ArrayLike) -> Float[Array, "*shape"]:
        t = jnp.clip(jnp.asarray(t, jnp.float32), 0.0, 1.0)
        span = self.max_temperature - self.min_temperature
        return self.min_temperature + span * (1.0 - (1.0 - t) ** self.exponent)


def parse_annealed(spec: str) -> tuple[float, float, float | None]:
    """Parses "MAX/MIN" or "MAX/MIN^EXPONENT" (e.g. "1.6/0.2^0.25") into (max, min, exponent or None): the temperature
    at full noise, at none, and the annealing exponent (below 1 the temperature falls fast after the first step)."""
    pair, hat, exponent = spec.partition("^")
    high, sep, low = pair.partition("/")
    try:
        schedule = (float(high), float(low), float(exponent) if hat else None)
    except ValueError:
        schedule = None
    if not sep or schedule is None or not 0 < schedule[1] <= schedule[0] or (hat and not schedule[2] > 0):
        raise ValueError(
            f"temperature schedule {spec!r} must be MAX/MIN or MAX/MIN^EXPONENT with 0 < MIN <= MAX and EXPONENT > 0, "
            "e.g. 0.8/0.4 or 1.6/0.2^0.25."
        )
    return schedule


TEMPERATURES: dict[str, Any] = {"constant": ConstantTemperature, "annealed": AnnealedTemperature}


def make_temperature(name: str, **kwargs) -> Temperature:
    """Builds a temperature shaper by name, e.g. `make_temperature("annealed", min_temperature=0.3)`."""
    if name not in TEMPERATURES:
        raise ValueError(f"unknown temperature {name!r}; choose one of {sorted(TEMPERATURES)}.")
    try:
        return TEMPERATURES[name](**kwargs)
    except TypeError as error:
        raise ValueError(f"temperature {name!r} does not take {sorted(kwargs)}: {error}") from None
