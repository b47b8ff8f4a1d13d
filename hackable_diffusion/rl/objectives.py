"""Policy objectives for RL from verifiable rewards, as frozen dataclasses `(params, batch, rng) -> (loss, metrics)`.

Every objective reads one rollout batch (`rollouts.RolloutStream`): G completions of each of K prompts, group-major
(row k * G + g), with their group-relative advantages (`advantages.group_advantages`; rows of tied groups have
advantage 0 and `valid` = 0), the positions the policy generated (`completion`), and for the ratio
objectives the old policy's per-token log-probs, precomputed at rollout time with the same prompt mask
(`prompt_masked`) the update uses. How token terms become the batch loss is each paper's by default
(`normalization="paper"`, `rl.loss_normalization`): d1 (and the AR GRPO baseline, d1's loss with exact log-probs) sum
the per-token terms over the batch's completion tokens and divide by their count; wd1 weights each completion's SUM of
log-probs. `"row_mean"` is GRPO's equation as Shao et al. 2024 write it (their Eq. 3, the length normalisation Dr.
GRPO argues against): each row's token mean, then the mean over ALL rows (a tied group's rows count, with A = 0),
the KL term on every row as well.

* `DiffuGRPO` — d1 (Zhao et al. 2025): GRPO's clipped surrogate with the mean-field one-pass log-probs
  (`scorers.MeanFieldScorer`), the prompt randomly masked with a fresh mask for each of the mu inner updates.
  The loss, as d1's code computes it: sum over the batch's completion tokens of -min(r A, clip(r) A) + beta k3,
  divided by their count (tied groups are in the batch with A = 0, their tokens counted). Differs from d1: the
  normalising count is the whole batch's (d1: each device's micro-batch, the results then averaged; RL refuses
  `train.grad_accum_steps` > 1, whose strided micro-batches would split it), and the reference's log-probs are
  precomputed once per rollout and inner update (same mask). With `rl.stop_at_eos` (Countdown in place) the scored
  completion ends at its first EOS, included, as d1 cuts LLaDA's; every position the sampler wrote stays masked in the
  scoring pass (`masked`, d1's forward_process masks the whole completion), so the cut leaks no length; without it an
  in-place run scores every position it sampled. An AR run's rows always end at the EOS (`Task.policy_rows`).
* `ArGRPO` — d1's loss above with the exact token log-probs of a causal run on the same backbone
  (`scorers.AutoregressiveScorer`): the baseline the diffusion objectives are measured against. The completion ends at
  its first EOS (included), as in d1 and TRL. Differs from GRPO's paper (Shao et al. 2024): its token normalisation
  is d1's/TRL's (the paper's per-row mean and std-scaled advantages are `rl.loss_normalization="row_mean"` and
  `rl.advantage_scale="std"`).
* `WD1` — wd1 (Tang et al. 2025): no importance ratio and no old-policy log-probs; the log-likelihood of each
  completion is weighted by the group softmax of its advantage (positive samples) minus `negative_weight` times the
  group softmax of the negated advantage (negative-sample unlearning). Log-likelihood: the mean-field estimator,
  summed over the completion's tokens. As wd1's code: loss = sum over a group of -(w+ - lambda w-) x sum_t log pi,
  averaged over the K groups, advantages r - mean. A tied group is in it as wd1's code has it: its advantages are 0,
  so both softmaxes are uniform and each of its rows weighs (1 - lambda) / G (0 at lambda = 1);
  `zero_tied_groups=True` (`rl.wd1_zero_tied_groups`) gives tied rows weight 0 whatever lambda instead. Differs from
  wd1's code: the temperature `psi` (1 there) and `negative_weight` (lambda, 1 there) are settings, and the optional
  KL term is d1's (wd1's main objective has none).
* `ElboPolicyGradient` — the policy gradient with the masking ELBO (the toolbox's `elbo_per_example`, `draws`
  noise draws per completion, completion corrupted, prompt held) standing in for log pi: A x ELBO, on-policy
  REINFORCE with the group baseline (no ratio; with several inner updates the later ones are off-policy and
  uncorrected). A bound-based estimator in the spirit of VRPO (LLaDA 1.5) and SPG, not their exact losses: the loss
  is the mean over valid rows of A x (negative ELBO per completion token). Differs from both: no variance-reduction
  schedule of VRPO, no upper bound for negative samples as in SPG.

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
  are not the policy's samples, so the k3 estimate would not estimate the KL (`rl.kl_beta` must be 0). The loss is the
  mean over accepted rows of the per-token NLL (ReST-EM's per-example likelihood, length-normalised).

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


NORMALIZATIONS = {  # rl.loss_normalization: "paper" is the first of the objective's own names
    "clipped": ("batch_tokens", "row_mean"),  # d1 / TRL GRPO; GRPO's paper
    "wd1": ("sequence_sum", "row_mean"),  # wd1's code; per-row token means
}


def resolve_normalization(kind: str, name: str) -> str:
    """`name` ("paper" or one of NORMALIZATIONS[kind]) as the concrete choice; ValueError naming the choices."""
    choices = NORMALIZATIONS[kind]
    if name == "paper":
        return choices[0]
    if name not in choices:
        raise ValueError(
            f"config.rl.loss_normalization={name!r} must be 'paper' or one of {choices} for this objective."
        )
    return name


def batch_token_mean(per_token: Float[Array, "b l"], where: Array) -> Float[Array, ""]:
    """d1's reduction: the sum of `per_token` over every row's `where` positions divided by their count."""
    where = where.astype(jnp.float32)
    return jnp.sum(per_token * where) / jnp.maximum(jnp.sum(where), 1.0)


def k3_kl(log_probs: Float[Array, "b l"], ref_log_probs: Float[Array, "b l"]) -> Float[Array, "b l"]:
    """The k3 estimate of KL(current || reference) per token from samples of the current policy (>= 0)."""
    delta = ref_log_probs - log_probs
    return jnp.exp(delta) - delta - 1.0


def score(scorer, params, batch: dict[str, Array]) -> tuple[Float[Array, "b l"], Float[Array, "b l"], dict]:
    """The scorer's (log-probs, entropies, aux) of the batch's completions (with its commit passes when it has them,
    and the positions the sampler wrote, `masked`, when the scored completion stops short of them: `rl.stop_at_eos`)."""
    order = (batch["commit_pass"],) if "commit_pass" in batch else ()
    masked = {"masked": batch["masked"]} if "masked" in batch else {}
    return scorer(params, batch["tokens"], batch["completion"], batch["prompt_masked"], *order, **masked)


def reference_k3(log_probs: Float[Array, "b l"], batch: dict[str, Array]) -> Float[Array, "b l"]:
    """k3 per token against the batch's reference; exactly 0 (value and gradient) in rows without one, whose
    `ref_log_probs` are placeholders: the reference is replaced by the row's own (stopped) log-probs there, so a
    very unlikely token cannot overflow exp(ref - l) into inf x 0 = NaN."""
    has = batch["has_reference"][:, None] > 0
    ref = jnp.where(has, batch["ref_log_probs"], jax.lax.stop_gradient(log_probs))
    return k3_kl(log_probs, ref)


def reference_kl(log_probs: Float[Array, "b l"], batch: dict[str, Array]) -> Float[Array, ""]:
    """Mean k3 KL per completion token over valid rows (a per-row mean, then the mean over valid rows, unlike the
    clipped objectives' token normalisation); 0 for rows without reference log-probs."""
    per_row = row_means(reference_k3(log_probs, batch), batch["completion"]) * batch["has_reference"]
    return valid_mean(per_row, batch["valid"])


def all_rows_kl(log_probs: Float[Array, "b l"], batch: dict[str, Array]) -> Float[Array, ""]:
    """GRPO's paper's KL term: each row's mean k3 KL per completion token, then the mean over ALL rows (tied groups
    included; 0 for rows without reference log-probs)."""
    per_row = row_means(reference_k3(log_probs, batch), batch["completion"]) * batch["has_reference"]
    return jnp.mean(per_row)


def token_kl(log_probs: Float[Array, "b l"], batch: dict[str, Array]) -> Float[Array, ""]:
    """d1's KL term: the k3 KL summed over every row's completion tokens, divided by their count (0 for rows without
    reference log-probs)."""
    per_token = reference_k3(log_probs, batch) * batch["has_reference"][:, None]
    return batch_token_mean(per_token, batch["completion"])


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
    clip_eps: float = 0.5  # d1's (TRL's and GRPO's paper: 0.2)
    kl_beta: float = 0.0
    normalization: str = "paper"  # "paper" (d1: "batch_tokens") | "row_mean"

    needs_old_log_probs = True

    def __post_init__(self):
        resolve_normalization("clipped", self.normalization)

    def __call__(self, params, batch: dict[str, Array], rng: jax.Array) -> tuple[Float[Array, ""], Metrics]:
        del rng  # the prompt mask of this inner update comes with the batch (the old log-probs used the same)
        completion, adv, valid = batch["completion"], batch["advantages"], batch["valid"]
        log_probs, entropy, aux = score(self.scorer, params, batch)
        ratio = jnp.exp(log_probs - batch["old_log_probs"])
        clipped = jnp.clip(ratio, 1.0 - self.clip_eps, 1.0 + self.clip_eps)
        surrogate = jnp.minimum(ratio * adv[:, None], clipped * adv[:, None])
        if resolve_normalization("clipped", self.normalization) == "batch_tokens":
            policy = -batch_token_mean(surrogate, completion)
            kl = token_kl(log_probs, batch)
        else:
            policy = -jnp.mean(row_means(surrogate, completion))  # 1/G sum_i 1/|o_i| sum_t, over every row
            kl = all_rows_kl(log_probs, batch)
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
    the trajectory scorer's per-pass log-probs); d1's token normalisation by default. Differs from d1: normalised over
    the whole batch, not per device micro-batch; an in-place run without `rl.stop_at_eos` scores its PAD tail (module
    docstring)."""

    scorer: MeanFieldScorer | TrajectoryScorer


@dataclasses.dataclass(frozen=True)
class ArGRPO(_ClippedSurrogate):
    """d1's loss with exact causal log-probs (the autoregressive baseline on the same backbone), the completion ending
    at its first EOS. Differs from GRPO's paper: d1's token normalisation and r - mean advantages by default
    (`normalization="row_mean"` and `rl.advantage_scale="std"` are the paper's)."""

    scorer: AutoregressiveScorer


@dataclasses.dataclass(frozen=True)
class WD1:
    """wd1: ratio-free weighted log-likelihood of each completion (the sum of its token log-probs), positive and
    negative samples weighted by group softmaxes, averaged over groups (a tied group's rows weigh (1 - lambda) / G, as
    in wd1's code; `zero_tied_groups`: 0). Differs from wd1's code: psi and lambda are settings (1 there); the optional
    KL term is d1's."""

    scorer: Any
    group_size: int
    psi: float = 1.0
    negative_weight: float = 1.0
    kl_beta: float = 0.0
    normalization: str = "paper"  # "paper" (wd1: "sequence_sum") | "row_mean"
    zero_tied_groups: bool = False  # True: a tied group's rows weigh 0 (wd1's code: (1 - lambda) / G each)

    needs_old_log_probs = False

    def __post_init__(self):
        resolve_normalization("wd1", self.normalization)

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
        log_probs, entropy, aux = score(self.scorer, params, batch)
        weights = self.weights(batch["advantages"], valid)
        if resolve_normalization("wd1", self.normalization) == "sequence_sum":
            sequence = jnp.sum(log_probs * completion.astype(jnp.float32), axis=-1)
            policy = -jnp.sum(weights * sequence) / (completion.shape[0] / self.group_size)  # mean over the K groups
            kl = token_kl(log_probs, batch)
        else:
            groups = completion.shape[0] / self.group_size  # every group, tied ones included
            policy = -jnp.sum(weights * row_means(log_probs, completion)) / groups
            kl = all_rows_kl(log_probs, batch)
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
    completions to corrupt with the prompt held (`fixed`); with `rl.stop_at_eos`, every position the sampler wrote
    (`masked`) is corrupted, as the run's own loss corrupts the whole canvas."""
    rows = {"tokens": batch["tokens"], "fixed": ~batch.get("masked", batch["completion"])}
    return jnp.mean(jax.vmap(lambda key: per_example(rows, key))(jax.random.split(rng, draws)), axis=0)


def _check_in_place(objective) -> None:
    if objective is not None and objective.canvas_len is not None:
        raise ValueError(
            "this objective scores a completion in place (one canvas): it needs an in-place run "
            "(config.diffusion.canvas_len=0)."
        )


@dataclasses.dataclass(frozen=True)
class ElboPolicyGradient:
    """REINFORCE with the group baseline and the masking ELBO (mean of `draws` noise draws) in place of log pi: the
    mean over valid rows of A x (negative ELBO per completion token). Differs from VRPO and SPG (whose spirit it
    follows): no variance-reduced sampling schedule, no ratio, no separate bound for negative samples."""

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
    negative log-likelihood per completion token from the scorer. Differs from ExIt / ReST-EM: no separate apprentice,
    one batch of expert completions reused for `rl.inner_updates` steps instead of a growing dataset."""

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
