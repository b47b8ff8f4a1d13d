"""wd1 (Tang et al. 2025): a ratio-free weighted log-likelihood with negative-sample unlearning.

No importance ratio and no old-policy log-probs: the log-likelihood of each completion (the mean-field estimator, or
exact for an AR run, summed over the completion's tokens) is weighted by the group softmax of its advantage
(positive samples) minus `negative_weight` (lambda) times the group softmax of the negated advantage. As wd1's code:
loss = sum over a group of -(w+ - lambda w-) x sum_t log pi, averaged over the K groups, advantages r - mean. A tied
group is in it as wd1's code has it: its advantages are 0, so both softmaxes are uniform and each of its rows weighs
(1 - lambda) / G (0 at lambda = 1); `zero_tied_groups=True` gives tied rows weight 0 whatever lambda instead.
Also takes `scorers.TrajectoryScorer` (TraceRL's per-pass log-probs, `rl.scorer='trajectory'`).

Differs from wd1's code: the temperature `psi` (1 there) and `negative_weight` (lambda, 1 there) are settings, and the
optional KL term is d1's (wd1's main objective has none).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from hackable_diffusion.diffusion import objectives as obj_lib
from hackable_diffusion.rl.objectives import base
from hackable_diffusion.rl.objectives.base import Metrics, PolicyObjective, register


@register
@dataclasses.dataclass(frozen=True)
class WD1(PolicyObjective):
    """wd1: ratio-free weighted log-likelihood of each completion (the sum of its token log-probs), positive and
    negative samples weighted by group softmaxes, averaged over groups (a tied group's rows weigh (1 - lambda) / G, as
    in wd1's code; `zero_tied_groups`: 0). Differs from wd1's code: psi and lambda are settings (1 there); the optional
    KL term is d1's."""

    scorer: Any
    group_size: int
    psi: float = 1.0  # softmax temperature on the advantages (wd1's code: 1)
    negative_weight: float = 1.0  # lambda, the weight of the negative samples' term (wd1's code: 1)
    kl_beta: float = 0.0
    normalization: str = "paper"  # "paper" (wd1: "sequence_sum") | "row_mean"
    zero_tied_groups: bool = False  # True: a tied group's rows weigh 0 (wd1's code: (1 - lambda) / G each)

    name = "wd1"
    normalization_kind = "wd1"
    trajectory_scorer = True

    def __post_init__(self):
        base.resolve_normalization("wd1", self.normalization)

    @classmethod
    def check_settings(cls, section) -> None:
        if not isinstance(section["zero_tied_groups"], bool):
            raise ValueError(f"config.rl.wd1.zero_tied_groups={section['zero_tied_groups']!r} must be True or False.")

    def weights(self, advantages: Float[Array, " b"], valid: Float[Array, " b"]) -> Float[Array, " b"]:
        """w+ - negative_weight * w- per row (each softmax sums to 1 over a group; a tied group's rows (1 - lambda) / G,
        or 0 with `zero_tied_groups`)."""
        a = advantages.reshape(-1, self.group_size) * self.psi
        positive = jax.nn.softmax(a, axis=-1)
        negative = jax.nn.softmax(-a, axis=-1)
        weights = (positive - self.negative_weight * negative).reshape(-1)
        return weights * valid if self.zero_tied_groups else weights

    def __call__(self, params, batch: dict[str, Array], rng: jax.Array) -> tuple[Float[Array, ""], Metrics]:
        del rng
        completion, valid = batch["completion"], batch["valid"]
        log_probs, entropy, aux = base.score(self.scorer, params, batch)
        weights = self.weights(batch["advantages"], valid)
        if base.resolve_normalization("wd1", self.normalization) == "sequence_sum":
            sequence = jnp.sum(log_probs * completion.astype(jnp.float32), axis=-1)
            policy = -jnp.sum(weights * sequence) / (completion.shape[0] / self.group_size)  # mean over the K groups
            kl = base.token_kl(log_probs, batch)
        else:
            groups = completion.shape[0] / self.group_size  # every group, tied ones included
            policy = -jnp.sum(weights * base.row_means(log_probs, completion)) / groups
            kl = base.all_rows_kl(log_probs, batch)
        loss = policy + self.kl_beta * kl + obj_lib.aux_loss(aux)
        metrics = {
            "loss": loss,
            "policy_loss": policy,
            "kl": kl,
            "entropy": base.valid_mean(base.row_means(entropy, completion), valid),
            **base.rollout_metrics(batch),
        }
        return loss, metrics
