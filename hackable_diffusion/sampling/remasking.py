"""Remasking rules: ReMDM (Wang et al. 2025), which sends decided tokens back to MASK while it unmasks others.

A decided token is re-masked with probability sigma_t and a masked one is unmasked with probability
(alpha_s - (1 - sigma) alpha_t) / (1 - alpha_t), with sigma <= sigma_max = min(1, (1 - alpha_s) / alpha_t);
`ReMDMCap`: sigma = min(eta, sigma_max) (eta 0.008), `ReMDMRescale`: sigma = eta sigma_max (eta 0.015). The 'conf'
and 'loop' variants are not implemented. Masking process only. Both are named in `selection.SELECTION_RULES`
("remdm_cap", "remdm_rescale").
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import jax.numpy as jnp
from jaxtyping import Array, Float

from hackable_diffusion.sampling.selection_base import SelectionRule, row_uniform


@dataclasses.dataclass(frozen=True)
class _ReMDM(SelectionRule):
    """ReMDM posterior with remasking rate sigma (see the module docstring); subclasses choose sigma."""

    remasks: ClassVar[bool] = True
    eta: float = 0.0

    def __post_init__(self):
        if not self.eta >= 0:
            raise ValueError(f"{type(self).__name__}: eta must be >= 0, got {self.eta}.")

    def chunkable(self) -> bool:
        return True

    @abc.abstractmethod
    def sigma(self, sigma_max: Float[Array, ""]) -> Float[Array, ""]:
        """The remasking rate sigma_t given its upper bound sigma_max."""

    def __call__(self, keys, logits, candidates, undecided, info):
        del logits, candidates
        if not info.persistent:
            raise ValueError(f"{type(self).__name__} re-masks tokens and needs a masking process.")
        alpha_s, alpha_t = info.alpha_s, info.alpha_t
        sigma_max = jnp.minimum(1.0, (1.0 - alpha_s) / alpha_t)
        sigma = jnp.where(info.is_last, 0.0, self.sigma(sigma_max))
        unmask_prob = jnp.where(info.is_last, 1.0, (alpha_s - (1.0 - sigma) * alpha_t) / (1.0 - alpha_t))
        u = row_uniform(keys, undecided.shape[1:])
        accept = undecided & (u < unmask_prob)
        remask = info.free & ~undecided & (u < sigma)
        return accept, remask


@dataclasses.dataclass(frozen=True)
class ReMDMCap(_ReMDM):
    """ReMDM 'cap': sigma_t = min(eta, sigma_max), eta = 0.008."""

    eta: float = 0.008

    def sigma(self, sigma_max):
        return jnp.minimum(self.eta, sigma_max)


@dataclasses.dataclass(frozen=True)
class ReMDMRescale(_ReMDM):
    """ReMDM 'rescale': sigma_t = eta * sigma_max, eta = 0.015."""

    eta: float = 0.015

    def __post_init__(self):
        super().__post_init__()
        if self.eta > 1:
            raise ValueError(f"ReMDMRescale: eta must lie in [0, 1], got {self.eta}.")

    def sigma(self, sigma_max):
        return self.eta * sigma_max
