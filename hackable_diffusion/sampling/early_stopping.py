"""Early stopping of a canvas, decided per batch row after every denoising step.

Reference: DiffusionGemma `_early_stopping.py` (docs/reference.md §2.7). A rule sees the step's
temperature-*shaped* logits, the step's input canvas, the canvas it produced and the free (not fixed) positions, and
returns one boolean per row. The canvas loop keeps the sample of the step that triggers the stop and never changes a
finished row afterwards.

  * `NoEarlyStop` -- the reference `DiffusionSampler` default: run every step.
  * `TokenStability` -- all(argmax(shaped logits) == canvas). Documented choice: like the reference we compare with
    the step's *input* canvas (`against="input"`), i.e. the model's greedy prediction agrees with the canvas it was
    shown. With the uniform process the input canvas holds the re-randomised positions of the previous step, so this
    only fires once the previous step accepted (almost) everything. `against="output"` compares with the canvas the
    step produced instead. With a masking process the canvas holds MASK until everything is decided, so stability
    can only fire at the end.
  * `EntropyBelow(0.005)` -- mean per-position entropy of the shaped prediction <= threshold. Computed in float32;
    the reference computes it in the logits dtype (bf16). (The hackable_diffusion adapter's default threshold is 0.05.)
  * `Chained(rules)` -- logical AND of the rules (the reference's `ChainedEarlyStop`); an empty chain raises.

Difference: only free positions count (fixed positions such as a puzzle's givens never change, and a model that disagrees
with a given would otherwise block stability forever); a canvas with no free position is stable at once.

The rules read the logits only through their argmax and entropy, so they also accept the `LogitSummary` that the
sampler's `vocab_chunk` computes in chunks of the vocabulary (`vocab_chunks.py`); `EarlyStopping.chunkable()` says
so, and a rule of one's own that reads the whole distribution says False (the sampler then refuses `vocab_chunk`).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from hackable_diffusion.sampling.scores import LogitSummary, entropy, top_index


@dataclasses.dataclass(frozen=True)
class EarlyStopping(abc.ABC):
    """`rule(logits, previous, current, free, previous_argmax=None) -> stop (b,)`; `previous_argmax` is the argmax of
    the previous step's shaped logits (-1 before the first step), which the canvas loop always passes."""

    def chunkable(self) -> bool:
        """True when the rule reads the logits only through `top_index` and `entropy`, so that it also takes a
        `LogitSummary` (the sampler's `vocab_chunk`)."""
        return False

    @abc.abstractmethod
    def __call__(
        self,
        logits: Float[Array, "b c v"] | LogitSummary,
        previous: Int[Array, "b c"],
        current: Int[Array, "b c"],
        free: Bool[Array, "b c"],
        previous_argmax: Int[Array, "b c"] | None = None,
    ) -> Bool[Array, "b"]:
        """True for the rows that may stop after this step."""


@dataclasses.dataclass(frozen=True)
class NoEarlyStop(EarlyStopping):
    """Never stop early."""

    def chunkable(self) -> bool:
        return True

    def __call__(self, logits, previous, current, free, previous_argmax=None):
        return jnp.zeros(previous.shape[:1], bool)


@dataclasses.dataclass(frozen=True)
class TokenStability(EarlyStopping):
    """Stop when argmax(shaped logits) equals the step's input canvas (`against="input"`, the gemma library), its
    output canvas (`"output"`), or the previous step's argmax (`"previous_argmax"`, transformers' DiffusionGemma with
    stability_threshold 1)."""

    against: str = "input"

    def __post_init__(self):
        if self.against not in ("input", "output", "previous_argmax"):
            raise ValueError(
                f"TokenStability: against must be 'input' (the gemma library), 'output' or 'previous_argmax' "
                f"(transformers), got {self.against!r}."
            )

    def chunkable(self) -> bool:
        return True

    def __call__(self, logits, previous, current, free, previous_argmax=None):
        if self.against == "previous_argmax" and previous_argmax is None:
            raise ValueError("TokenStability(against='previous_argmax') needs the previous step's argmax.")
        reference = {"input": previous, "output": current, "previous_argmax": previous_argmax}[self.against]
        agrees = top_index(logits) == reference
        return jnp.all(agrees | ~free, axis=-1)


@dataclasses.dataclass(frozen=True)
class EntropyBelow(EarlyStopping):
    """Stop when the mean entropy (nats, float32) over free positions is <= threshold (< with `strict`, as
    transformers' DiffusionGemma compares)."""

    threshold: float = 0.005
    strict: bool = False

    def __post_init__(self):
        if not self.threshold >= 0:
            raise ValueError(f"EntropyBelow: threshold must be >= 0, got {self.threshold}.")

    def chunkable(self) -> bool:
        return True

    def __call__(self, logits, previous, current, free, previous_argmax=None):
        h = jnp.where(free, entropy(logits), 0.0)
        mean = jnp.sum(h, axis=-1) / jnp.maximum(jnp.sum(free, axis=-1), 1)
        return mean < self.threshold if self.strict else mean <= self.threshold


@dataclasses.dataclass(frozen=True)
class Chained(EarlyStopping):
    """Stop when every rule says stop (AND)."""

    rules: tuple[EarlyStopping, ...]

    def __post_init__(self):
        rules = tuple(self.rules) if isinstance(self.rules, Sequence) else self.rules
        if not isinstance(rules, tuple) or not rules:
            raise ValueError(
                "Chained needs a non-empty sequence of early-stopping rules (it is their AND); "
                "use NoEarlyStop() to never stop early."
            )
        bad = [r for r in rules if not isinstance(r, EarlyStopping)]
        if bad:
            raise ValueError(f"Chained: {bad} are not EarlyStopping rules.")
        object.__setattr__(self, "rules", rules)

    def chunkable(self) -> bool:
        return all(rule.chunkable() for rule in self.rules)

    def __call__(self, logits, previous, current, free, previous_argmax=None):
        stop = jnp.ones(previous.shape[:1], bool)
        for rule in self.rules:
            stop = stop & rule(logits, previous, current, free, previous_argmax)
        return stop


def diffusiongemma_early_stopping(threshold: float = 0.005) -> Chained:
    """The reference default: token stability AND mean entropy <= `threshold` (0.005)."""
    return Chained((TokenStability(), EntropyBelow(threshold)))


def transformers_early_stopping(threshold: float = 0.005) -> Chained:
    """transformers' DiffusionGemma default (`StableAndConfidentStoppingCriteria(1, 0.005)`): the argmax equals the
    previous step's AND mean entropy < `threshold` (0.005)."""
    return Chained((TokenStability(against="previous_argmax"), EntropyBelow(threshold, strict=True)))


EARLY_STOPPING: dict[str, Any] = {
    "none": NoEarlyStop,
    "token_stability": TokenStability,
    "entropy": EntropyBelow,
    "diffusiongemma": diffusiongemma_early_stopping,
    "transformers": transformers_early_stopping,
}


def make_early_stopping(name: str, **kwargs) -> EarlyStopping:
    """Builds an early-stopping rule by name, e.g. `make_early_stopping("entropy", threshold=0.05)`."""
    if name not in EARLY_STOPPING:
        raise ValueError(f"unknown early-stopping rule {name!r}; choose one of {sorted(EARLY_STOPPING)}.")
    try:
        return EARLY_STOPPING[name](**kwargs)
    except TypeError as error:
        raise ValueError(f"early-stopping rule {name!r} does not take {sorted(kwargs)}: {error}") from None
