"""Expert iteration (Anthony et al. 2017, "Thinking Fast and Slow with Deep Learning and Tree Search"; ReST-EM, Singh
et al. 2024): maximum likelihood of the completions a stronger procedure found and the verifier accepted.

The rollouts come from an improvement operator stronger than the policy (Sudoku: the model-steered search over
symmetric copies, `config.solver.search`), and the policy maximises the likelihood of the completions the verifier
accepts (reward >= 1, `solved`; every other row has weight 0). An in-place diffusion run is trained with its own
pretraining loss on the accepted completions, prompt held (`draws` noise draws; the masking ELBO, or Sudoku's
unweighted masked CE); otherwise the loss is the negative log-likelihood from the scorer (an AR run: exact; a canvas
run: the mean-field estimate). No advantages, groups or ratio: a group of one completion per prompt is enough. No KL
term: the accepted completions are not the policy's samples, so the k3 estimate would not estimate the KL
(`rl.kl_beta` must be 0). The loss is the mean over accepted rows of the per-token NLL (ReST-EM's per-example
likelihood, length-normalised).

Differs from ExIt: no separate apprentice network (the searched model is the policy), and one batch of expert
completions per rollout, reused for `rl.inner_updates` steps with fresh noise, instead of a growing dataset.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from hackable_diffusion.diffusion import objectives as obj_lib
from hackable_diffusion.rl.objectives import base
from hackable_diffusion.rl.objectives.base import Metrics, register


@register
@dataclasses.dataclass(frozen=True)
class ExpertIteration(base.NoiseDrawsInPlace):
    """Maximum likelihood of the verified completions of a stronger rollout procedure (see the module docstring):
    the loss is the mean over accepted rows (`solved`) of `objective`'s training loss when it is given, else of the
    negative log-likelihood per completion token from the scorer. Differs from ExIt / ReST-EM: no separate apprentice,
    one batch of expert completions reused for `rl.inner_updates` steps instead of a growing dataset."""

    scorer: Any  # the policy's entropy; without `objective`, the likelihood too
    objective: obj_lib.DiffusionPretrainObjective | None = None
    draws: int = 1  # noise draws per accepted completion (in place): one fresh draw per step, as pretraining

    name = "expert_iteration"
    grouped = False
    has_kl = False

    @classmethod
    def build(cls, section, run):
        """In place (a run whose loss is per example, one canvas): the run's own loss; else the scorer's."""
        own = run.objective
        in_place = hasattr(own, "train_loss_per_example") and getattr(own, "canvas_len", 0) is None
        return cls(run.scorer, objective=own if in_place else None, **section)

    def __call__(self, params, batch: dict[str, Array], rng: jax.Array) -> tuple[Float[Array, ""], Metrics]:
        completion, accepted = batch["completion"], batch["solved"]
        log_probs, entropy, aux = base.score(self.scorer, params, batch)
        if self.objective is not None:
            train_loss = functools.partial(self.objective.train_loss_per_example, params)
            nll = base.mean_over_noise_draws(train_loss, batch, rng, self.draws)
        else:
            nll = -base.row_means(log_probs, completion)
        imitation = base.valid_mean(nll, accepted)
        loss = imitation + obj_lib.aux_loss(aux)
        metrics = {
            "loss": loss,
            "policy_loss": imitation,
            "entropy": jax.lax.stop_gradient(base.valid_mean(base.row_means(entropy, completion), accepted)),
            **base.rollout_metrics(batch),
            "accepted_rows": jnp.mean(accepted),
        }
        return loss, metrics
