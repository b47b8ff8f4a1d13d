"""Schedules for adapting an autoregressive (AR) run into block diffusion, each a function of the training step.

A diffusion run started from an AR run's weights (`config.init`, docs/training.md) can ease the change of objective
with three schedules, each a small frozen dataclass whose `__call__(step)` takes the step as a traced jnp scalar (one
compiled training step serves every step) and `step=None` meaning "after the schedule" (evaluation, ELBO and sampling
see the target model). They are gathered in `Adaptation` and applied by `objectives.DiffusionPretrainObjective`.

* `CanvasCurriculum` — LLaDA 2.0's warm-up / stable / decay schedule of the block size (arXiv 2512.15745): piecewise
  constant canvas sizes over step ranges, e.g. small blocks growing to the whole sequence (MDLM) and back down to the
  target canvas. Differs from LLaDA 2.0 in how it is laid out: the training sequence keeps its fixed length and each
  size is one branch of a `lax.switch` (the canvas layout of `DiffusionPretrainObjective` at that size: noising, the
  encoder's cache and the decoder's block-causal attention per canvas), so all sizes compile into one program and
  only the branch of the current step runs. The last size is the target (`diffusion.canvas_len`, what the sampler
  uses); at that size the loss is the plain objective's.
* `MaskAnnealing` — attention-mask annealing from causal to the diffusion mask (DiffuLLaMA, Gong et al. 2024,
  "Scaling diffusion language models via adaptation from autoregressive models", arXiv 2410.17891): inside the
  decoder's attention every entry the diffusion mask allows beyond the causal one (a key after the query, in its own
  canvas) is enabled with probability p(step), rising linearly from 0 at `begin` to 1 at `end`, drawn independently
  per example and entry. At p=0 the decoder's mask is causal, at p=1 it is exactly the diffusion mask. DiffuLLaMA
  anneals together with a token shift (its predictions read the previous position's logits): with
  `diffusion.token_shift` (token_shift.py) the decoder at p=0 is the AR model run on the noisy tokens; without it,
  position i predicts its own token from the noisy tokens up to i.
* `ArLossDecay` — the weight of the encoder's next-token (AR) loss added to the diffusion loss, moving linearly from
  `start` to `end` over `[begin, end_step]`; it replaces `diffusion.encoder_ar_weight` (DiffusionGemma's recipe keeps
  a constant weight of 1: `ArLossDecay(2.0, 1.0, ...)` decays into it, `ArLossDecay(1.0, 0.0, ...)` into plain
  block diffusion). It reuses the encoder pass of block diffusion, so it costs no extra forward pass.

Fast-dLLM v2's token shift (position i predicted from the logits at i - 1, arXiv 2509.26328) is not a schedule but a
change of what the output head means, shared by training and sampling: `diffusion.token_shift`, token_shift.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

Step = Int[Array, ""] | int | None


def linear_ramp(step: Int[Array, ""] | int, begin: int, end: int) -> Float[Array, ""]:
    """0 before `begin`, 1 from `end` on, linear in between (a step function at `begin` when begin == end)."""
    step = jnp.asarray(step, jnp.float32)
    if end == begin:
        return (step >= begin).astype(jnp.float32)
    return jnp.clip((step - begin) / (end - begin), 0.0, 1.0)


def _check_range(name: str, begin: int, end: int) -> None:
    if not 0 <= begin <= end:
        raise ValueError(f"{name} needs 0 <= begin <= end, got begin={begin}, end={end}.")


@dataclasses.dataclass(frozen=True)
class CanvasCurriculum:
    """Canvas size `sizes[k]` from step `boundaries[k - 1]` on (LLaDA 2.0's warm-up / stable / decay of the block
    size); `sizes[-1]` is the target canvas."""

    sizes: tuple[int, ...]
    boundaries: tuple[int, ...]

    def __post_init__(self):
        sizes, boundaries = tuple(int(s) for s in self.sizes), tuple(int(b) for b in self.boundaries)
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "boundaries", boundaries)
        if not sizes or min(sizes) < 1:
            raise ValueError(f"CanvasCurriculum needs at least one canvas size, all >= 1; got sizes={sizes}.")
        if len(boundaries) != len(sizes) - 1:
            raise ValueError(
                f"CanvasCurriculum needs one boundary step between consecutive sizes: {len(sizes)} sizes take "
                f"{len(sizes) - 1} boundaries, got {boundaries}."
            )
        if any(b < 0 for b in boundaries) or list(boundaries) != sorted(boundaries):
            raise ValueError(f"CanvasCurriculum boundaries must be increasing steps >= 0, got {boundaries}.")

    @property
    def target(self) -> int:
        return self.sizes[-1]

    @property
    def distinct_sizes(self) -> tuple[int, ...]:
        """The sizes in order of first use, each once: the branches of the training step."""
        return tuple(dict.fromkeys(self.sizes))

    def stage(self, step: Step) -> Int[Array, ""]:
        """Index into `sizes` of the stage `step` is in (the last stage for step=None)."""
        if step is None or not self.boundaries:
            return jnp.asarray(len(self.sizes) - 1, jnp.int32)
        return jnp.sum(jnp.asarray(step) >= jnp.asarray(self.boundaries)).astype(jnp.int32)

    def branch(self, step: Step) -> Int[Array, ""]:
        """Index into `distinct_sizes` of the canvas size at `step`."""
        table = jnp.asarray([self.distinct_sizes.index(s) for s in self.sizes], jnp.int32)
        return table[self.stage(step)]

    def __call__(self, step: Step) -> Int[Array, ""]:
        """The canvas size at `step`."""
        return jnp.asarray(self.sizes, jnp.int32)[self.stage(step)]


@dataclasses.dataclass(frozen=True)
class MaskAnnealing:
    """DiffuLLaMA's attention-mask annealing: the fraction of non-causal diffusion-mask entries enabled rises
    linearly from 0 at step `begin` to 1 at step `end`."""

    begin: int
    end: int

    def __post_init__(self):
        _check_range("MaskAnnealing", self.begin, self.end)

    def __call__(self, step: Step) -> Float[Array, ""]:
        """The probability that a non-causal entry of the diffusion mask is enabled at `step`."""
        return jnp.asarray(1.0, jnp.float32) if step is None else linear_ramp(step, self.begin, self.end)

    @staticmethod
    def mask(diffusion_mask: Bool[Array, "b q k"], fraction: Float[Array, ""], key: jax.Array) -> Bool[Array, "b q k"]:
        """`diffusion_mask` with each entry whose key comes after its query kept with probability `fraction`
        (exactly the causal part at 0, exactly `diffusion_mask` at 1). Query i and key j are positions of the same
        block, so the causal part is j <= i."""
        _, q, k = diffusion_mask.shape
        causal = jnp.tril(jnp.ones((q, k), bool))[None]
        drawn = jax.random.uniform(key, diffusion_mask.shape) < fraction
        return diffusion_mask & (causal | drawn)


@dataclasses.dataclass(frozen=True)
class ArLossDecay:
    """The encoder's AR-loss weight: `start` until step `begin`, `end` from step `end_step`, linear in between."""

    start: float
    end: float
    begin: int
    end_step: int

    def __post_init__(self):
        if self.start < 0 or self.end < 0:
            raise ValueError(f"ArLossDecay weights must be >= 0, got start={self.start}, end={self.end}.")
        _check_range("ArLossDecay", self.begin, self.end_step)

    def __call__(self, step: Step) -> Float[Array, ""]:
        if step is None:
            return jnp.asarray(self.end, jnp.float32)
        ramp = linear_ramp(step, self.begin, self.end_step)
        return jnp.asarray(self.start, jnp.float32) + (self.end - self.start) * ramp


@dataclasses.dataclass(frozen=True)
class Adaptation:
    """The schedules a run adapting an AR model uses (None: off)."""

    canvas: CanvasCurriculum | None = None
    mask: MaskAnnealing | None = None
    ar_loss: ArLossDecay | None = None

    @property
    def active(self) -> bool:
        return any(s is not None for s in (self.canvas, self.mask, self.ar_loss))

    def values(self, step: Step) -> dict[str, Array]:
        """The schedule values at `step`, as logged in the training metrics (`adapt_*`)."""
        out = {}
        if self.canvas is not None:
            out["adapt_canvas_len"] = self.canvas(step).astype(jnp.float32)
        if self.mask is not None:
            out["adapt_mask_fraction"] = self.mask(step)
        if self.ar_loss is not None:
            out["adapt_ar_weight"] = self.ar_loss(step)
        return out


ADAPTATION_KEYS = {  # config.adaptation: every key, its meaning; () = that schedule is off
    "canvas_sizes": "CanvasCurriculum sizes, the last = diffusion.canvas_len",
    "canvas_boundaries": "CanvasCurriculum: the step each next size starts at",
    "mask_anneal_steps": "MaskAnnealing (begin, end) steps",
    "ar_loss_weights": "ArLossDecay (start, end) weights",
    "ar_loss_steps": "ArLossDecay (begin, end) steps",
}


def from_section(section: dict[str, Any]) -> Adaptation:
    """The schedules of a config's `adaptation` section (`recipes.adaptation_section`)."""
    unknown = sorted(set(section) - set(ADAPTATION_KEYS))
    if unknown:
        raise ValueError(f"unknown config.adaptation keys {unknown}; valid: {sorted(ADAPTATION_KEYS)}.")

    def pair(key: str, kind=int) -> tuple | None:
        value = tuple(section.get(key) or ())
        if not value:
            return None
        if len(value) != 2:
            raise ValueError(f"config.adaptation.{key} must be a pair ({ADAPTATION_KEYS[key]}) or (), got {value}.")
        return tuple(kind(v) for v in value)

    canvas = None
    if section.get("canvas_sizes"):
        canvas = CanvasCurriculum(tuple(section["canvas_sizes"]), tuple(section.get("canvas_boundaries") or ()))
    elif section.get("canvas_boundaries"):
        raise ValueError("config.adaptation.canvas_boundaries is set but canvas_sizes is empty.")
    mask = MaskAnnealing(*steps) if (steps := pair("mask_anneal_steps")) else None
    weights, weight_steps = pair("ar_loss_weights", float), pair("ar_loss_steps")
    if (weights is None) != (weight_steps is None):
        raise ValueError("config.adaptation.ar_loss_weights and ar_loss_steps go together: set both or neither.")
    ar_loss = ArLossDecay(*weights, *weight_steps) if weights else None
    return Adaptation(canvas=canvas, mask=mask, ar_loss=ar_loss)
