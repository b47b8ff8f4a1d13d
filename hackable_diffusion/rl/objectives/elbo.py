"""The policy gradient with the masking ELBO standing in for log pi (bound-based, in the spirit of VRPO and SPG).

REINFORCE with the group baseline: A x ELBO, the toolbox's `elbo_per_example` averaged over `draws` noise draws per
completion (completion corrupted, prompt held), on-policy (no ratio; with several inner updates the later ones are
off-policy and uncorrected). The loss is the mean over valid rows of A x (negative ELBO per completion token). Needs a
run trained in place with the masking ELBO objective; the mean-field scorer gives the entropy and the KL's log-probs.

Differs from VRPO (LLaDA 1.5) and SPG, whose spirit it follows and not their exact losses: no variance-reduction
schedule of VRPO, no ratio, no upper bound for negative samples as in SPG; the KL term is a per-row mean over valid
rows (`base.reference_kl`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from hackable_diffusion.diffusion import objectives as obj_lib
from hackable_diffusion.rl.objectives import base
from hackable_diffusion.rl.objectives.base import Metrics, register
from hackable_diffusion.rl.scorers import MeanFieldScorer


@register
@dataclasses.dataclass(frozen=True)
class ElboPolicyGradient(base.NoiseDrawsInPlace):
    """REINFORCE with the group baseline and the masking ELBO (mean of `draws` noise draws) in place of log pi: the
    mean over valid rows of A x (negative ELBO per completion token). Differs from VRPO and SPG (whose spirit it
    follows): no variance-reduced sampling schedule, no ratio, no separate bound for negative samples."""

    objective: obj_lib.DiffusionPretrainObjective
    scorer: MeanFieldScorer  # entropy and the KL to the reference
    draws: int = 4  # noise draws per completion
    kl_beta: float = 0.0

    name = "elbo"
    run_kinds = ("diffusion",)

    @classmethod
    def build(cls, section, run):
        if not hasattr(run.objective, "elbo_per_example"):
            raise ValueError("config.rl.objective='elbo' needs a run trained in place with the masking ELBO objective.")
        return super().build(section, run)

    def negative_elbo(self, params, batch: dict[str, Array], rng: jax.Array) -> Float[Array, " b"]:
        """The completion's negative ELBO in nats per completion token, averaged over `draws` noise draws."""

        def per_token(rows, key):
            nats, counted = self.objective.elbo_per_example(params, rows, key)
            return nats / jnp.maximum(counted, 1)

        return base.mean_over_noise_draws(per_token, batch, rng, self.draws)

    def __call__(self, params, batch: dict[str, Array], rng: jax.Array) -> tuple[Float[Array, ""], Metrics]:
        completion, valid = batch["completion"], batch["valid"]
        nelbo = self.negative_elbo(params, batch, rng)
        policy = base.valid_mean(batch["advantages"] * nelbo, valid)
        log_probs, entropy, aux = base.score(self.scorer, params, batch)
        if not self.kl_beta:  # the pass is only measured: no backward through its log-probs
            log_probs = jax.lax.stop_gradient(log_probs)
        kl = base.reference_kl(log_probs, batch)
        loss = policy + self.kl_beta * kl + obj_lib.aux_loss(aux)
        metrics = {
            "loss": loss,
            "policy_loss": policy,
            "kl": kl,
            "elbo_nats_per_token": base.valid_mean(-nelbo, valid),
            "entropy": jax.lax.stop_gradient(base.valid_mean(base.row_means(entropy, completion), valid)),
            **base.rollout_metrics(batch),
        }
        return loss, metrics
