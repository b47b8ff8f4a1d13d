"""The interface every selection rule implements (`SelectionRule`) and what it is given: where the denoising step
sits (`StepInfo`) and per-row float32 random draws.

All randomness is float32 (LLaDA notes that low-precision Gumbel noise hurts; it uses float64) and drawn per batch
row from that row's own key, so a row's choices do not depend on the other rows of the batch. The rules themselves
are in `selection.py` (which positions accept their candidate), `counts.py` (how many a top-k rule takes) and
`remasking.py` (ReMDM, which also sends decided tokens back to noise).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from hackable_diffusion.diffusion.schedules import Schedule
from hackable_diffusion.sampling.scores import LogitSummary

# ---------------------------------------------------------------------------------------------------------------------
# Per-step information and shared helpers.
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """Where a denoising step sits: step i of `num_steps` goes from noise level t = 1 - i/S to s = 1 - (i+1)/S.

    free: positions the sampler may change (not fixed). persistent: True when decided tokens stay (a masking process,
    or a uniform one with `DiffusionSampler.commit`), False for the reference uniform sampler (everything free is
    re-decided each step).
    """

    step: Int[Array, ""]
    num_steps: int
    t: Float[Array, ""]
    s: Float[Array, ""]
    alpha_t: Float[Array, ""]
    alpha_s: Float[Array, ""]
    free: Bool[Array, "b c"]
    persistent: bool

    @classmethod
    def at(
        cls, step: int | Int[Array, ""], num_steps: int, schedule: Schedule, free: Bool[Array, "b c"], persistent: bool
    ) -> StepInfo:
        step = jnp.asarray(step, jnp.int32)
        t = 1.0 - step.astype(jnp.float32) / num_steps
        s = 1.0 - (step + 1).astype(jnp.float32) / num_steps
        return cls(
            step=step,
            num_steps=num_steps,
            t=t,
            s=s,
            alpha_t=jnp.asarray(schedule.alpha(t), jnp.float32),
            alpha_s=jnp.asarray(schedule.alpha(s), jnp.float32),
            free=jnp.asarray(free, bool),
            persistent=persistent,
        )

    @property
    def is_last(self) -> Bool[Array, ""]:
        return self.step >= self.num_steps - 1

    @property
    def num_free(self) -> Int[Array, "b"]:
        return jnp.sum(self.free, axis=-1).astype(jnp.int32)


def row_uniform(keys: Array, shape: tuple[int, ...]) -> Float[Array, "b ..."]:
    """float32 U[0, 1) of `shape` per row, each row from its own key."""
    return jax.vmap(lambda k: jax.random.uniform(k, shape, jnp.float32))(keys)


def row_gumbel(keys: Array, shape: tuple[int, ...]) -> Float[Array, "b ..."]:
    """float32 standard Gumbel noise of `shape` per row, each row from its own key."""
    return jax.vmap(lambda k: jax.random.gumbel(k, shape, jnp.float32))(keys)


@dataclasses.dataclass(frozen=True)
class SelectionRule(abc.ABC):
    """Base class: `rule(keys, logits, candidates, undecided, info) -> (accept, remask)`.

    keys: one PRNG key per batch row; logits: the scored logits, float32 (the sampling logits unless the sampler sets
    score_temperature), or their `LogitSummary` when the sampler scans the vocabulary in chunks (`chunkable`);
    candidates: the tokens sampled from the sampling logits.
    """

    remasks: ClassVar[bool] = False  # True when the rule may send decided tokens back to MASK

    def chunkable(self) -> bool:
        """True when the rule reads the logits only through `entropy` and the scores of `scores.py`, so it also takes a
        `LogitSummary` (the sampler's `vocab_chunk`); False for a rule that may read the whole distribution."""
        return False

    @abc.abstractmethod
    def __call__(
        self,
        keys: Array,
        logits: Float[Array, "b c v"] | LogitSummary,
        candidates: Int[Array, "b c"],
        undecided: Bool[Array, "b c"],
        info: StepInfo,
    ) -> tuple[Bool[Array, "b c"], Bool[Array, "b c"]]:
        """Returns (accept, remask) masks over the canvas."""
