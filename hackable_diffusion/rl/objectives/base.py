"""What every RL objective shares: the registry, the batch reductions, the KL estimate, the noise-draw mean.

An objective is a frozen dataclass `(params, batch, rng) -> (loss, metrics)` in its own file of this package,
registered with `@register`: its class declares the runs it fits (`run_kinds`, `grouped`, `has_kl`,
`normalization_kind`, `trajectory_scorer`), and its dataclass fields that the run does not supply (`RUN_ARGUMENTS`)
are its config section `config.rl.<name>`, whose defaults are the fields' defaults (`settings`). `build` makes it
from that section and the run's pieces (`RunPieces`): `cls(**run arguments it takes, **section)`.

The batch is one rollout (`rollouts.RolloutStream`): G completions of each of K prompts, group-major (row k * G + g),
with their group-relative advantages (`advantages.group_advantages`; rows of tied groups have advantage 0 and
`valid` = 0), the positions the policy generated (`completion`), and for the ratio objectives the old policy's
per-token log-probs, precomputed at rollout time with the same prompt mask (`prompt_masked`) the update uses.
How token terms become the batch loss is each paper's by default (`normalization="paper"`, `rl.loss_normalization`,
`NORMALIZATIONS`); `"row_mean"` is GRPO's equation as Shao et al. 2024 write it (their Eq. 3, the length
normalisation Dr. GRPO argues against): each row's token mean, then the mean over ALL rows (a tied group's rows
count, with A = 0), the KL term on every row as well.

The optional KL to the reference (`kl_beta` > 0) is the k3 estimator exp(r - l) - (r - l) - 1 per completion token
(Schulman's), with l the current and r the reference log-prob under the same scorer and mask; the reference is the
starting weights (a LoRA run's base: no second copy is held). With `kl_beta` = 0 no reference pass is run: the `kl`
metric then compares with the rollout-time policy (the ratio objectives) or is not measured (0).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

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


def rollout_metrics(batch: dict[str, Array]) -> Metrics:
    rewards = batch["rewards"]
    return {
        "reward_mean": jnp.mean(rewards),
        "reward_std": jnp.std(rewards),
        "solve_rate": jnp.mean(batch["solved"]),
        "groups_used": jnp.mean(batch["valid"]),
        "rollout_seconds": jnp.mean(batch["rollout_seconds"]),
        "update_seconds": jnp.mean(batch["update_seconds"]),
    }


def mean_over_noise_draws(per_example, batch: dict[str, Array], rng: jax.Array, draws: int) -> Float[Array, " b"]:
    """The mean over `draws` noise draws of `per_example(rows, key)` (one value per row), the rows being the batch's
    completions to corrupt with the prompt held (`fixed`); with `rl.stop_at_eos`, every position the sampler wrote
    (`masked`) is corrupted, as the run's own loss corrupts the whole canvas."""
    rows = {"tokens": batch["tokens"], "fixed": ~batch.get("masked", batch["completion"])}
    return jnp.mean(jax.vmap(lambda key: per_example(rows, key))(jax.random.split(rng, draws)), axis=0)


def check_in_place(objective) -> None:
    if objective is not None and objective.canvas_len is not None:
        raise ValueError(
            "this objective scores a completion in place (one canvas): it needs an in-place run "
            "(config.diffusion.canvas_len=0)."
        )




RUN_ARGUMENTS = ("scorer", "group_size", "kl_beta", "normalization", "objective")  # the run supplies them: no section
RUN_KINDS = ("diffusion", "autoregressive")


@dataclasses.dataclass(frozen=True)
class RunPieces:
    """What an RL run hands an objective besides its own section: the scorer of its completions, the group size,
    `rl.kl_beta`, `rl.loss_normalization`, and the run's own training objective (`exp.objective`)."""

    scorer: Any
    group_size: int
    kl_beta: float = 0.0
    normalization: str = "paper"
    objective: Any = None


class PolicyObjective:
    """The registry's contract (a mixin of the objectives' frozen dataclasses): what the objective needs from a run,
    declared, so the `rl` command checks a config against it without naming any objective."""

    name: ClassVar[str]  # config.rl.objective
    run_kinds: ClassVar[tuple[str, ...]] = RUN_KINDS  # the runs it trains: "diffusion", "autoregressive"
    grouped: ClassVar[bool] = True  # learns from group-relative advantages (rl.group_size >= 2); False: from the
    # verifier's accepted rows (`solved`), one completion per prompt enough
    has_kl: ClassVar[bool] = True  # takes rl.kl_beta (False: refuses kl_beta > 0)
    normalization_kind: ClassVar[str | None] = None  # its NORMALIZATIONS entry; None: one normalisation ('paper')
    trajectory_scorer: ClassVar[bool] = False  # also scores with scorers.TrajectoryScorer (rl.scorer='trajectory')
    needs_old_log_probs: ClassVar[bool] = False  # the rollout precomputes the old policy's log-probs (a ratio)

    @classmethod
    def settings(cls) -> dict[str, Any]:
        """Its config section `config.rl.<name>`: each dataclass field the run does not supply, at its default."""
        return {f.name: f.default for f in dataclasses.fields(cls) if f.name not in RUN_ARGUMENTS}

    @classmethod
    def check_settings(cls, section: Mapping[str, Any]) -> None:
        """ValueError naming the key for a section value out of range (before any weight is read)."""

    @classmethod
    def build(cls, section: Mapping[str, Any], run: RunPieces):
        """`cls(**the run's arguments it takes, **section)`."""
        fields = {f.name for f in dataclasses.fields(cls)}
        given = {name: getattr(run, name) for name in RUN_ARGUMENTS if name in fields}
        return cls(**given, **section)


OBJECTIVES: dict[str, type[PolicyObjective]] = {}


def register(cls: type[PolicyObjective]) -> type[PolicyObjective]:
    """Class decorator: names `cls` in `OBJECTIVES` (config.rl.objective = cls.name)."""
    if cls.name in OBJECTIVES and OBJECTIVES[cls.name] is not cls:
        raise ValueError(f"two RL objectives are named {cls.name!r}: {OBJECTIVES[cls.name]} and {cls}.")
    unknown = set(cls.run_kinds) - set(RUN_KINDS)
    if unknown or not cls.run_kinds:
        raise ValueError(f"{cls.__name__}.run_kinds={cls.run_kinds} must be a non-empty subset of {RUN_KINDS}.")
    OBJECTIVES[cls.name] = cls
    return cls


def objective_class(name: str) -> type[PolicyObjective]:
    """The registered objective `config.rl.objective` names; ValueError listing them."""
    if name not in OBJECTIVES:
        raise ValueError(f"config.rl.objective={name!r} must be one of {tuple(OBJECTIVES)}.")
    return OBJECTIVES[name]


class NoiseDrawsInPlace(PolicyObjective):
    """A mixin for objectives that average the run's own in-place loss over `draws` noise draws per completion: the
    draw count is checked (config and construction) and the run objective, when given, must be in place."""

    def __post_init__(self):
        self.check_settings({"draws": self.draws})
        check_in_place(self.objective)

    @classmethod
    def check_settings(cls, section: Mapping[str, Any]) -> None:
        draws = section["draws"]
        if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
            raise ValueError(
                f"config.rl.{cls.name}.draws={draws!r} must be an integer >= 1 (noise draws per completion)."
            )


