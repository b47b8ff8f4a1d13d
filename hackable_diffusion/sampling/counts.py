"""How many positions a top-k rule accepts at a step: the count schedules.

`ScheduleCount` (k = #masked (alpha_s - alpha_t)/(1 - alpha_t), the vanilla expectation, Kim et al. 2025 / Dream),
`CosineCount` (MaskGIT's cosine number of tokens still masked, Chang et al. 2022), `EvenCount` (LLaDA's
`get_num_transfer_tokens`) and `PowerCount` (a power of the step's progress). `make_count` builds one by name.

Counts are rounded to the nearest integer, clipped to at least one position while any is undecided (so every step
makes progress: with more steps than positions a masking canvas finishes early), and equal to every remaining
position at the last step (so nothing is left masked). Dream floors the count and may accept none at a step.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, Int

from hackable_diffusion.sampling.selection_base import StepInfo


def _finalise_count(k: Array, num_undecided: Int[Array, "b"], info: StepInfo) -> Int[Array, "b"]:
    k = jnp.where(info.is_last, num_undecided, k.astype(jnp.int32))
    return jnp.clip(k, jnp.minimum(1, num_undecided), num_undecided)


# ---------------------------------------------------------------------------------------------------------------------
# How many positions a top-k rule accepts.
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ScheduleCount:
    """The vanilla expectation under the process schedule: #masked (alpha_s - alpha_t) / (1 - alpha_t); with the
    uniform process, #free alpha_s (the expected number of clean tokens at level s)."""

    def __call__(self, num_undecided: Int[Array, "b"], info: StepInfo) -> Int[Array, "b"]:
        n = num_undecided.astype(jnp.float32)
        if info.persistent:
            expected = n * (info.alpha_s - info.alpha_t) / (1.0 - info.alpha_t)
        else:
            expected = n * info.alpha_s
        return _finalise_count(jnp.round(expected), num_undecided, info)


@dataclasses.dataclass(frozen=True)
class CosineCount:
    """MaskGIT: after step i, floor(#free cos(pi/2 (i+1)/S)) positions are still masked."""

    def __call__(self, num_undecided: Int[Array, "b"], info: StepInfo) -> Int[Array, "b"]:
        progress = (info.step + 1).astype(jnp.float32) / info.num_steps
        still_masked = jnp.floor(info.num_free * jnp.cos(0.5 * math.pi * progress)).astype(jnp.int32)
        decided_target = info.num_free - still_masked
        decided_now = info.num_free - num_undecided if info.persistent else 0
        return _finalise_count(decided_target - decided_now, num_undecided, info)


@dataclasses.dataclass(frozen=True)
class EvenCount:
    """LLaDA: #free // S positions per step, the remainder one each to the first steps."""

    def __call__(self, num_undecided: Int[Array, "b"], info: StepInfo) -> Int[Array, "b"]:
        done_steps = info.step + 1
        base, remainder = info.num_free // info.num_steps, info.num_free % info.num_steps
        decided_target = done_steps * base + jnp.minimum(done_steps, remainder)
        decided_now = info.num_free - num_undecided if info.persistent else 0
        return _finalise_count(decided_target - decided_now, num_undecided, info)


@dataclasses.dataclass(frozen=True)
class PowerCount:
    """round(#free ((i+1)/S)^exponent) positions decided after step i: exponent 1 is LLaDA's even split (rounded),
    exponent > 1 decides few positions early, while most are still masked, and many late, when the context has
    pinned them down (in a puzzle: cells become forced as the grid fills)."""

    exponent: float = 2.0

    def __post_init__(self):
        if not self.exponent > 0:
            raise ValueError(f"PowerCount exponent must be > 0, got {self.exponent}.")

    def __call__(self, num_undecided: Int[Array, "b"], info: StepInfo) -> Int[Array, "b"]:
        progress = (info.step + 1).astype(jnp.float32) / info.num_steps
        decided_target = jnp.round(info.num_free.astype(jnp.float32) * progress**self.exponent).astype(jnp.int32)
        decided_now = info.num_free - num_undecided if info.persistent else 0
        return _finalise_count(decided_target - decided_now, num_undecided, info)


COUNT_RULES: dict[str, Any] = {"schedule": ScheduleCount, "cosine": CosineCount, "even": EvenCount, "power": PowerCount}


def make_count(name: str, exponent: float | None = None) -> Any:
    """A count rule by name: "schedule", "cosine", "even", or "power" with its `exponent` (`PowerCount`)."""
    if name not in COUNT_RULES:
        raise ValueError(f"unknown count rule {name!r}; choose one of {sorted(COUNT_RULES)}.")
    if name == "power":
        return PowerCount() if exponent is None else PowerCount(float(exponent))
    if exponent is not None:
        raise ValueError(f"count rule {name!r} takes no exponent (only 'power' does), got {exponent}.")
    return COUNT_RULES[name]()
