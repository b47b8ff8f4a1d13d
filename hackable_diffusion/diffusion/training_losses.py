"""What an objective minimises: small frozen loss objects instead of a loss name dispatched by if-chains.

A diffusion loss turns one denoising pass into a per-example training loss, given the process, the logits, the clean
and noisy tokens and the positions in the loss; every objective also reports the ELBO of the same pass, so a model
trained with a cross-entropy still gets a likelihood bound.

* `Elbo` — the continuous-time NELBO integrand of the process (masking: MD4/MDLM, Shi et al. 2024 / Sahoo et al. 2024;
  uniform: `losses.uniform_elbo`), per loss position.
* `MaskedCE(alpha, gamma)` — masking only: the unweighted CE over the masked positions pooled over the batch
  (MaskGIT-style, no 1/t weight); alpha (1 - p)^gamma reweights each position (Ye et al. 2024's MGDM; (1, 0) = none).
* `CanvasCE` — DiffusionGemma's unweighted CE over every position of the canvas (EOS fill included).
* `ArCE` — next-token CE of a causal pass: the autoregressive baseline's loss, which is also its exact NLL.

`likelihood_metric` names the metric that carries the run's likelihood figure (ELBO or exact NLL), so evaluation needs
no test of which kind of model it holds.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from hackable_diffusion.diffusion import elbos
from hackable_diffusion.diffusion.processes import MaskingProcess, NoiseProcess

ELBO_METRIC = "elbo_bits_per_token"
NLL_METRIC = "nll_bits_per_token"


@dataclasses.dataclass(frozen=True)
class DiffusionLoss(abc.ABC):
    """`loss(process, logits, x0, xt, loss_mask, elbo) -> (b,)` training loss per example; `elbo` is the process's
    NELBO per example of the same pass (nats), computed once by the objective."""

    likelihood_metric: ClassVar[str] = ELBO_METRIC

    def check(self, process: NoiseProcess) -> None:
        """Raises ValueError when the loss does not fit the process."""

    @abc.abstractmethod
    def __call__(
        self,
        process: NoiseProcess,
        logits: Float[Array, "b l v"],
        x0: Int[Array, "b l"],
        xt: Int[Array, "b l"],
        loss_mask: Bool[Array, "b l"],
        elbo: Float[Array, "b"],
    ) -> Float[Array, "b"]:
        """The per-example training loss."""


@dataclasses.dataclass(frozen=True)
class Elbo(DiffusionLoss):
    """The process's NELBO, per loss position of each example."""

    def __call__(self, process, logits, x0, xt, loss_mask, elbo):
        return elbo / jnp.maximum(jnp.sum(loss_mask, axis=-1), 1)


@dataclasses.dataclass(frozen=True)
class MaskedCE(DiffusionLoss):
    """Unweighted CE over the masked positions, pooled over the batch; alpha (1 - p)^gamma per position (MGDM)."""

    alpha: float = 1.0
    gamma: float = 0.0

    def __post_init__(self):
        if self.alpha <= 0 or self.gamma < 0:
            raise ValueError(f"MaskedCE needs alpha > 0 and gamma >= 0, got alpha={self.alpha}, gamma={self.gamma}.")

    @property
    def token_reweight(self) -> tuple[float, float] | None:
        return None if (self.alpha, self.gamma) == (1.0, 0.0) else (self.alpha, self.gamma)

    def check(self, process):
        if not isinstance(process, MaskingProcess):
            raise ValueError(f"the masked_ce loss needs the masking process, not {type(process).__name__}.")

    def __call__(self, process, logits, x0, xt, loss_mask, elbo):
        return elbos.masked_token_cross_entropy(logits, x0, xt, process.mask_id, loss_mask, self.token_reweight)


@dataclasses.dataclass(frozen=True)
class CanvasCE(DiffusionLoss):
    """DiffusionGemma's CE over every loss position of the canvas, no time weighting."""

    def __call__(self, process, logits, x0, xt, loss_mask, elbo):
        return elbos.canvas_cross_entropy(logits, x0, loss_mask)


@dataclasses.dataclass(frozen=True)
class ArCE:
    """Next-token CE of a causal pass: (per-example mean, per-example count) over the target tokens."""

    likelihood_metric: ClassVar[str] = NLL_METRIC

    def __call__(
        self, logits: Float[Array, "b l v"], tokens: Int[Array, "b l"], targets: Bool[Array, "b l"] | None = None
    ) -> tuple[Float[Array, "b"], Int[Array, "b"]]:
        return elbos.autoregressive_cross_entropy(logits, tokens, targets)


DIFFUSION_LOSSES: dict[str, type[DiffusionLoss]] = {"elbo": Elbo, "masked_ce": MaskedCE, "canvas_ce": CanvasCE}


def make_diffusion_loss(name: str, **kwargs) -> DiffusionLoss:
    """The diffusion loss a config names (`config.diffusion.loss`), e.g. `make_diffusion_loss("masked_ce", gamma=1)`."""
    if name not in DIFFUSION_LOSSES:
        raise ValueError(f"unknown diffusion loss {name!r}; choose one of {sorted(DIFFUSION_LOSSES)}.")
    return DIFFUSION_LOSSES[name](**kwargs)
