"""GRPO's clipped surrogate, shared by `diffu_grpo.DiffuGRPO` and `ar_grpo.ArGRPO` (it registers nothing itself).

Per completion token: -min(r A, clip(r, 1 - eps, 1 + eps) A) + beta k3, with r = pi / pi_old the ratio of the
scorer's log-probs now and at rollout time (GRPO, Shao et al. 2024; PPO's clip). Reduced as d1's code reduces it by
default (`batch_tokens`: the sum over the batch's completion tokens divided by their count, tied groups in it with
A = 0), or as GRPO's paper writes it (`row_mean`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from hackable_diffusion.diffusion import objectives as obj_lib
from hackable_diffusion.rl.objectives import base
from hackable_diffusion.rl.objectives.base import Metrics, PolicyObjective


@dataclasses.dataclass(frozen=True)
class ClippedSurrogate(PolicyObjective):
    scorer: Any
    clip_eps: float = 0.5  # d1's (TRL's and GRPO's paper: 0.2)
    kl_beta: float = 0.0
    normalization: str = "paper"  # "paper" (d1: "batch_tokens") | "row_mean"

    needs_old_log_probs = True
    normalization_kind = "clipped"

    def __post_init__(self):
        base.resolve_normalization("clipped", self.normalization)

    @classmethod
    def check_settings(cls, section: Mapping[str, Any]) -> None:
        if float(section["clip_eps"]) <= 0:
            raise ValueError(f"config.rl.{cls.name}.clip_eps={section['clip_eps']} must be > 0 (the ratio's clip).")

    def __call__(self, params, batch: dict[str, Array], rng: jax.Array) -> tuple[Float[Array, ""], Metrics]:
        del rng  # the prompt mask of this inner update comes with the batch (the old log-probs used the same)
        completion, adv, valid = batch["completion"], batch["advantages"], batch["valid"]
        log_probs, entropy, aux = base.score(self.scorer, params, batch)
        ratio = jnp.exp(log_probs - batch["old_log_probs"])
        clipped = jnp.clip(ratio, 1.0 - self.clip_eps, 1.0 + self.clip_eps)
        surrogate = jnp.minimum(ratio * adv[:, None], clipped * adv[:, None])
        if base.resolve_normalization("clipped", self.normalization) == "batch_tokens":
            policy = -base.batch_token_mean(surrogate, completion)
            kl = base.token_kl(log_probs, batch)
        else:
            policy = -jnp.mean(base.row_means(surrogate, completion))  # 1/G sum_i 1/|o_i| sum_t, over every row
            kl = base.all_rows_kl(log_probs, batch)
        loss = policy + self.kl_beta * kl + obj_lib.aux_loss(aux)
        was_clipped = (jnp.abs(ratio - 1.0) > self.clip_eps).astype(jnp.float32)
        metrics = {
            "loss": loss,
            "policy_loss": policy,
            "kl": kl,
            "entropy": base.valid_mean(base.row_means(entropy, completion), valid),
            "clip_fraction": base.valid_mean(base.row_means(was_clipped, completion), valid),
            **base.rollout_metrics(batch),
        }
        return loss, metrics
