"""Policy objectives for RL from verifiable rewards, as frozen dataclasses `(params, batch, rng) -> (loss, metrics)`.

Every objective reads one rollout batch (`rollouts.RolloutStream`): G completions of each of K prompts, group-major
(row k * G + g), with their group-relative advantages (`advantages.group_advantages`; rows of tied groups have
`valid` = 0 and are left out of every mean), the positions the policy generated (`completion`), and for the ratio
objectives the old policy's per-token log-probs, precomputed at rollout time with the same prompt mask
(`prompt_masked`) the update uses. Per-row terms are means over the row's completion tokens (GRPO's length
normalisation); the loss is their mean over valid rows.

* `DiffuGRPO` — d1 (Zhao et al. 2025): GRPO's clipped surrogate with the mean-field one-pass log-probs
  (`scorers.MeanFieldScorer`), the prompt randomly masked with a fresh mask for each of the mu inner updates.
  Differs from d1: the clip and the KL act per token as in d1, but tied groups are skipped rather than kept with
  zero advantage, and the reference's log-probs are precomputed once per rollout and inner update (same mask).
* `ArGRPO` — GRPO (Shao et al. 2024) with the exact token log-probs of a causal run on the same backbone
  (`scorers.AutoregressiveScorer`): the baseline the diffusion objectives are measured against.
* `WD1` — wd1 (Tang et al. 2025): no importance ratio and no old-policy log-probs; the log-likelihood of each
  completion is weighted by the group softmax of its advantage (positive samples) minus `negative_weight` times the
  group softmax of the negated advantage (negative-sample unlearning). Log-likelihood: the mean-field estimator.
  Differs: one temperature `psi` for both softmaxes, advantages (not raw rewards) inside them.
* `ElboPolicyGradient` — the policy gradient with the masking ELBO (the toolbox's `elbo_per_example`, `draws`
  noise draws per completion, completion corrupted, prompt held) standing in for log pi: A x ELBO, on-policy
  REINFORCE with the group baseline (no ratio; with several inner updates the later ones are off-policy and
  uncorrected). A bound-based estimator in the spirit of VRPO (LLaDA 1.5) and SPG, not their exact losses.

* `ExpertIteration` — expert iteration (Anthony et al. 2017, "Thinking Fast and Slow with Deep Learning and Tree
  Search"; ReST-EM, Singh et al. 2024): the rollouts come from an improvement operator stronger than the policy
  (Sudoku: the model-steered search over symmetric copies, `config.solver.search`), and the policy maximises the
  likelihood of the completions the verifier accepts (reward >= 1; every other row has weight 0). An in-place
  diffusion run is trained with its own pretraining loss on the accepted completions, prompt held (`draws` noise
  draws; the masking ELBO, or Sudoku's unweighted masked CE); otherwise the loss is the negative log-likelihood from
  the scorer (an AR run: exact; a canvas run: the mean-field estimate).
  No advantages, groups or ratio: a group of one completion per prompt is enough. Differs from ExIt: no separate
  apprentice network (the searched model is the policy), and one batch of expert completions per rollout, reused
  for `rl.inner_updates` steps with fresh noise, instead of a growing dataset. No KL term: the accepted completions
  are not the policy's samples, so the k3 estimate would not estimate the KL (`rl.kl_beta` must be 0).

`DiffuGRPO` and `WD1` also take `scorers.TrajectoryScorer` (TraceRL's per-pass log-probs, `config.rl.scorer`) in
place of the mean-field estimate.

The optional KL to the reference (`kl_beta` > 0) is the k3 estimator exp(r - l) - (r - l) - 1 per completion token
(Schulman's), with l the current and r the reference log-prob under the same scorer and mask; the reference is the
starting weights (a LoRA run's base: no second copy is held). With `kl_beta` = 0 no reference pass is run: the `kl`
metric then compares with the rollout-time policy (the ratio objectives) or is not measured (0). Metrics: the loss, the
reward mean and spread, the solve rate, the share of groups used, the KL, the policy's mean per-token entropy and (ratio
objectives) the fraction of tokens whose ratio was clipped; expert iteration: the share of rows accepted.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from hackable_diffusion.diffusion import objectives as obj_lib
from hackable_diffusion.rl.scorers import AutoregressiveScorer, MeanFieldScorer, TrajectoryScorer

Metrics = dict[str, Array]


def row_means(x: Float[Array, "b l"], where: Array) -> Float[Array, " b"]:
    """Mean of each row over `where` (0 for a row with no such position)."""
    where = where.astype(jnp.float32)
    return jnp.sum(x * where, axis=-1) / jnp.maximum(jnp.sum(where, axis=-1), 1.0)


def valid_mean(per_row: Float[Array, " b"], valid: Float[Array, " b"]) -> Float[Array, ""]:
    return jnp.sum(per_row * valid) / jnp.maximum(jnp.sum(valid), 1.0)


def k3_kl(log_probs: Float[Array, "b l"], ref_log_probs: Float[Array, "b l"]) -> Float[Array, "b l"]:
    """The k3 estimate of KL(current || reference) per token from samples of the current policy (>= 0)."""
    delta = ref_log_probs - log_probs
    return jnp.exp(delta) - delta - 1.0


def score(scorer, params, batch: dict[str, Array]) -> tuple[Float[Array, "b l"], Float[Array, "b l"], dict]:
    """The scorer's (log-probs, entropies, aux) of the batch's completions (with its commit passes when it has them)."""
    order = (batch["commit_pass"],) if "commit_pass" in batch else ()
    return scorer(params, batch["tokens"], batch["completion"], batch["prompt_masked"], *order)


def reference_kl(log_probs: Float[Array, "b l"], batch: dict[str, Array]) -> Float[Array, ""]:
    """Mean k3 KL per completion token over valid rows; 0 for rows without reference log-probs."""
    per_row = row_means(k3_kl(log_probs, batch["ref_log_probs"]), batch["completion"]) * batch["has_reference"]
    return valid_mean(per_row, batch["valid"])


def _rollout_metrics(batch: dict[str, Array]) -> Metrics:
    rewards = batch["rewards"]
    return {
        "reward_mean": jnp.mean(rewards),
        "reward_std": jnp.std(rewards),
        "solve_rate": jnp.mean(batch["solved"]),
        "groups_used": jnp.mean(batch["valid"]),
        "rollout_seconds": jnp.mean(batch["rollout_seconds"]),
        "update_seconds": jnp.mean(batch["update_seconds"]),
    }


@dataclasses.dataclass(frozen=True)
class _ClippedSurrogate:
    scorer: Any
    clip_eps: float = 0.2
    kl_beta: float = 0.0

    needs_old_log_probs = True

    def __call__(self, params, batch: dict[str, Array], rng: jax.Array) -> tuple[Float[Array, ""], Metrics]:
        del rng  # the prompt mask of this inner update comes with the batch (the old log-probs used the same)
        completion, adv, valid = batch["completion"], batch["advantages"], batch["valid"]
        log_probs, entropy, aux = score(self.scorer, params, batch)
        ratio = jnp.exp(log_probs - batch["old_log_probs"])
        clipped = jnp.clip(ratio, 1.0 - self.clip_eps, 1.0 + self.clip_eps)
        surrogate = jnp.minimum(ratio * adv[:, None], clipped * adv[:, None])
        policy = -valid_mean(row_means(surrogate, completion), valid)
        kl = reference_kl(log_probs, batch)
        loss = policy + self.kl_beta * kl + obj_lib.aux_loss(aux)
        was_clipped = (jnp.abs(ratio - 1.0) > self.clip_eps).astype(jnp.float32)
        metrics = {
            "loss": loss,
            "policy_loss": policy,
            "kl": kl,
            "entropy": valid_mean(row_means(entropy, completion), valid),
            "clip_fraction": valid_mean(row_means(was_clipped, completion), valid),
            **_rollout_metrics(batch),
        }
        return loss, metrics


@dataclasses.dataclass(frozen=True)
class DiffuGRPO(_ClippedSurrogate):
    """d1's diffu-GRPO: clipped ratio of mean-field one-pass log-probs, prompt masked afresh per inner update (or of
    the trajectory scorer's per-pass log-probs)."""

    scorer: MeanFieldScorer | TrajectoryScorer


@dataclasses.dataclass(frozen=True)
class ArGRPO(_ClippedSurrogate):
    """GRPO with exact causal log-probs (the autoregressive baseline on the same backbone)."""

    scorer: AutoregressiveScorer


@dataclasses.dataclass(frozen=True)
class WD1:
    """wd1: ratio-free weighted log-likelihood, positive and negative samples weighted by group softmaxes."""

    scorer: Any
    group_size: int
    psi: float = 1.0
    negative_weight: float = 1.0
    kl_beta: float = 0.0

    needs_old_log_probs = False

    def weights(self, advantages: Float[Array, " b"], valid: Float[Array, " b"]) -> Float[Array, " b"]:
        """w+ - negative_weight * w- per row (each softmax sums to 1 over a group; 0 for invalid groups)."""
        a = advantages.reshape(-1, self.group_size) * self.psi
        positive = jax.nn.softmax(a, axis=-1)
        negative = jax.nn.softmax(-a, axis=-1)
        return (positive - self.negative_weight * negative).reshape(-1) * valid

    def __call__(self, params, batch: dict[str, Array], rng: jax.Array) -> tuple[Float[Array, ""], Metrics]:
        del rng
        completion, valid = batch["completion"], batch["valid"]
        log_probs, entropy, aux = score(self.scorer, params, batch)
        groups = jnp.maximum(jnp.sum(valid) / self.group_size, 1.0)
        weighted = self.weights(batch["advantages"], valid) * row_means(log_probs, completion)
        policy = -jnp.sum(weighted) / groups
        kl = reference_kl(log_probs, batch)
        loss = policy + self.kl_beta * kl + obj_lib.aux_loss(aux)
        metrics = {
            "loss": loss,
            "policy_loss": policy,
            "kl": kl,
            "entropy": valid_mean(row_means(entropy, completion), valid),
            **_rollout_metrics(batch),
        }
        return loss, metrics


def mean_over_noise_draws(per_example, batch: dict[str, Array], rng: jax.Array, draws: int) -> Float[Array, " b"]:
    """The mean over `draws` noise draws of `per_example(rows, key)` (one value per row), the rows being the batch's
    completions to corrupt with the prompt held (`fixed`)."""
    rows = {"tokens": batch["tokens"], "fixed": ~batch["completion"]}
    return jnp.mean(jax.vmap(lambda key: per_example(rows, key))(jax.random.split(rng, draws)), axis=0)


def _check_in_place(objective) -> None:
    if objective is not None and objective.canvas_len is not None:
        raise ValueError(
            "this objective scores a completion in place (one canvas): it needs an in-place run "
            "(config.diffusion.canvas_len=0)."
        )


@dataclasses.dataclass(frozen=True)
class ElboPolicyGradient:
    """REINFORCE with the group baseline and the masking ELBO (mean of `draws` noise draws) in place of log pi."""

    objective: obj_lib.DiffusionPretrainObjective
    scorer: MeanFieldScorer  # entropy and the KL to the reference
    draws: int = 4
    kl_beta: float = 0.0

    needs_old_log_probs = False

    def __post_init__(self):
        if self.draws < 1:
            raise ValueError(f"config.rl.elbo_draws={self.draws} must be >= 1.")
        _check_in_place(self.objective)

    def negative_elbo(self, params, batch: dict[str, Array], rng: jax.Array) -> Float[Array, " b"]:
        """The completion's negative ELBO in nats per completion token, averaged over `draws` noise draws."""

        def per_token(rows, key):
            nats, counted = self.objective.elbo_per_example(params, rows, key)
            return nats / jnp.maximum(counted, 1)

        return mean_over_noise_draws(per_token, batch, rng, self.draws)

    def __call__(self, params, batch: dict[str, Array], rng: jax.Array) -> tuple[Float[Array, ""], Metrics]:
        completion, valid = batch["completion"], batch["valid"]
        nelbo = self.negative_elbo(params, batch, rng)
        policy = valid_mean(batch["advantages"] * nelbo, valid)
        log_probs, entropy, aux = score(self.scorer, params, batch)
        if not self.kl_beta:  # the pass is only measured: no backward through its log-probs
            log_probs = jax.lax.stop_gradient(log_probs)
        kl = reference_kl(log_probs, batch)
        loss = policy + self.kl_beta * kl + obj_lib.aux_loss(aux)
        metrics = {
            "loss": loss,
            "policy_loss": policy,
            "kl": kl,
            "elbo_nats_per_token": valid_mean(-nelbo, valid),
            "entropy": jax.lax.stop_gradient(valid_mean(row_means(entropy, completion), valid)),
            **_rollout_metrics(batch),
        }
        return loss, metrics


@dataclasses.dataclass(frozen=True)
class ExpertIteration:
    """Maximum likelihood of the verified completions of a stronger rollout procedure (see the module docstring):
    the loss is the mean over accepted rows (`solved`) of `objective`'s training loss when it is given, else of the
    negative log-likelihood per completion token from the scorer."""

    scorer: Any  # the policy's entropy; without `objective`, the likelihood too
    objective: obj_lib.DiffusionPretrainObjective | None = None
    draws: int = 1

    needs_old_log_probs = False

    def __post_init__(self):
        if self.draws < 1:
            raise ValueError(f"config.rl.elbo_draws={self.draws} must be >= 1.")
        _check_in_place(self.objective)

    def __call__(self, params, batch: dict[str, Array], rng: jax.Array) -> tuple[Float[Array, ""], Metrics]:
        completion, accepted = batch["completion"], batch["solved"]
        log_probs, entropy, aux = score(self.scorer, params, batch)
        if self.objective is not None:
            train_loss = functools.partial(self.objective.train_loss_per_example, params)
            nll = mean_over_noise_draws(train_loss, batch, rng, self.draws)
        else:
            nll = -row_means(log_probs, completion)
        imitation = valid_mean(nll, accepted)
        loss = imitation + obj_lib.aux_loss(aux)
        metrics = {
            "loss": loss,
            "policy_loss": imitation,
            "entropy": jax.lax.stop_gradient(valid_mean(row_means(entropy, completion), accepted)),
            **_rollout_metrics(batch),
            "accepted_rows": jnp.mean(accepted),
        }
        return loss, metrics
