"""On-policy few-step distillation by the reverse KL: the k-step student samples, the teacher's likelihood judges.

Follows the idea of DiDi-Instruct (Zheng et al. 2025; "Ultra-fast language generation via discrete diffusion
divergence instruct") and Di[M]O (Zhu et al. 2025): train the few-step sampler itself, on its own samples, towards
the teacher's distribution by a policy gradient on KL(student || teacher), which seeks the teacher's modes instead of
averaging its per-position marginals (a factorised student fed the teacher's marginals at 8 positions per step writes
incoherent combinations of individually likely tokens; see the trajectory method).

For a prompt the student draws G canvases with its own sampler at k steps (jitted, the weights stop-gradiented).
Each canvas x comes with its path: the positions the selection rule committed at each step. Then

* log q(x) = sum over steps s and the positions committed at s of log softmax((logits_s + bias) / T_s)[x_j]: the
  exact log-probability of the sampled path under the student's own draw (its temperature T_s at step s, the
  sampler's logit bias), from one batched pass of the student over its k states, with gradient;
* log p(x) is bounded below by the teacher's masking ELBO of x given the same prompt, estimated from `elbo_draws`
  forward passes at stratified noise levels (an unbiased estimate of the bound);
* `target_temperature` tau shapes the teacher locally, as its own sampler does: the ELBO reads its logits divided
  by tau (0: by the sampler's temperature at each draw's noise level t). The masking ELBO is the average over
  decoding orders of a product of per-position conditionals, so this is the teacher decoded one position at a
  time at that temperature, each conditional normalised; raising the whole likelihood to a power (beta below)
  instead favours the repetitive strings a language model scores highest;
* `exact_entropy` (Rao-Blackwellisation): each -log q_s term of a cost to go is replaced by its conditional
  expectation given the step's state, the entropy H_s of that step's draw (exact from the same pass), and the own
  step's term E[log q_s grad log q_s] by its exact value -grad H_s; the same expected gradient, without the noise of
  which tokens the student happened to draw;
* `shared_noise`: the G canvases of a prompt share the noise levels and masks of their ELBO draws (common random
  numbers), so the part of the estimation noise they share cancels against the leave-one-out baseline;
* the cost c = log q(x) - beta log p(x) (beta = `target_sharpness`: beta > 1 aims at the teacher sharpened
  globally, p^beta) has expectation KL(q || p^beta / Z) - log Z, and its
  gradient is E_q[(c - b) grad log q(x)] with the leave-one-out mean of the group's other G - 1 costs as the
  baseline b (RLOO), per canvas token so the scale does not depend on the canvas length. By causality the tokens
  drawn at step s answer only for the cost to go (the log q of steps s .. k - 1 and the teacher's term), each step
  with its own leave-one-out baseline: the same expected gradient with less variance.

Deliberate differences from DiDi-Instruct: no discriminator estimates the density ratio (the teacher's ELBO and the
student's exact path log-probability give it directly, affordable for canvases of tens of tokens), the KL is taken
on the final canvas rather than integrated over noise levels, and the policy gradient is plain on-policy REINFORCE
with a leave-one-out baseline (one update per rollout; no importance ratio). The path probability treats the
selection rule's choice of positions as given: exact for rules that choose from the logits alone (EntropyBound,
confidence, margin), an approximation for rules that look at the drawn candidates. Masking runs only (a uniform
sampler re-noises positions, so a path's probability is not a product over committed tokens), without
self-conditioning in the student's sampler; the teacher's weights are constants of the compiled step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from hackable_diffusion.diffusion import elbos
from hackable_diffusion.diffusion.objectives import aux_loss, moe_metrics
from hackable_diffusion.distill.student_loss import prefix_cache
from hackable_diffusion.models import transformer as T
from hackable_diffusion.sampling import canvas as canvas_lib
from hackable_diffusion.sampling.keys import row_keys
from hackable_diffusion.sampling.sampler import DiffusionSampler
from hackable_diffusion.sampling.selection_base import StepInfo


def commit_steps(start: Int[Array, "b c"], trajectory: Int[Array, "k b c"], mask_id: int) -> Bool[Array, "k b c"]:
    """Which positions each step committed: masked before step s, unmasked after it (masking runs)."""
    before = jnp.concatenate([start[None], trajectory[:-1]], axis=0)
    return (before == mask_id) & (trajectory != mask_id)


def path_log_probs(
    logits: Float[Array, "k b c v"],
    tokens: Int[Array, "b c"],
    committed: Bool[Array, "k b c"],
    temperatures: Float[Array, "k"],
    bias: Float[Array, "v"],
) -> Float[Array, "k b"]:
    """log q of a sampled path, per step: the log-probabilities of the tokens committed at step s under that step's
    shaped logits, summed over positions (sum over steps: the path's log q)."""
    return _committed_log_q(_shaped_log_probs(logits, temperatures, bias), tokens, committed)


def path_entropies(
    logits: Float[Array, "k b c v"],
    committed: Bool[Array, "k b c"],
    temperatures: Float[Array, "k"],
    bias: Float[Array, "v"],
) -> Float[Array, "k b"]:
    """H_s: the entropy of step s's draw given its state (the committed positions' shaped distributions, summed), the
    conditional expectation of -log q_s."""
    return _committed_entropy(_shaped_log_probs(logits, temperatures, bias), committed)


def _shaped_log_probs(logits, temperatures, bias):
    return jax.nn.log_softmax((logits.astype(jnp.float32) + bias) / temperatures[:, None, None, None], axis=-1)


def _committed_log_q(log_probs, tokens, committed):
    """Per step, the summed shaped log-probabilities of the tokens committed at that step."""
    index = jnp.broadcast_to(tokens[None, ..., None], log_probs.shape[:-1] + (1,))
    return jnp.sum(jnp.where(committed, jnp.take_along_axis(log_probs, index, -1)[..., 0], 0.0), axis=2)


def _committed_entropy(log_probs, committed):
    """Per step, the summed entropies of the committed positions' shaped distributions."""
    entropy = -jnp.sum(jnp.exp(log_probs) * jnp.where(jnp.isfinite(log_probs), log_probs, 0.0), axis=-1)
    return jnp.sum(jnp.where(committed, entropy, 0.0), axis=2)


def leave_one_out(costs: Float[Array, "g b"]) -> Float[Array, "g b"]:
    """cost minus the mean of the other G - 1 costs of the same prompt (RLOO); zero when the group's costs tie."""
    g = costs.shape[0]
    return costs - (jnp.sum(costs, axis=0, keepdims=True) - costs) / (g - 1)


def _prefix_cache(model, params, batch: dict[str, Array], copies: int):
    return prefix_cache(model, params, batch["prefix"], batch["prefix_mask"], batch["fixed"].shape[0], copies)


@dataclasses.dataclass(frozen=True)
class ReverseKLLoss:
    """(params, batch, rng) -> (loss, metrics); batch: prefix / prefix_mask (b, p), canvas_tokens / fixed (b, c)."""

    model: T.Transformer
    teacher_params: Any
    sampler: DiffusionSampler  # the student's, at k steps, early stopping off
    group_size: int = 4
    elbo_draws: int = 4
    target_sharpness: float = 1.0
    target_temperature: float = 1.0  # 0: the sampler's own temperature at each draw's noise level
    shared_noise: bool = False  # the G samples of a prompt share the ELBO draws' noise levels and masks
    exact_entropy: bool = False  # the log q terms by their exact conditional expectations (Rao-Blackwell)

    def __post_init__(self):
        if not self.sampler.persistent:
            raise ValueError(
                "config.distill.method='reverse_kl' needs a masking run (a path's probability is a product over "
                "committed tokens); a uniform run re-noises positions: use method='consistency'."
            )
        if self.sampler.uses_self_conditioning(self.model) or self.sampler.token_shift or self.sampler.views:
            raise ValueError(
                "config.distill.method='reverse_kl' scores the student's path with plain passes over its states: "
                "sample it with --config.sampler.self_conditioning=False, no token shift and no views."
            )
        if self.group_size < 2 or self.elbo_draws < 1:
            raise ValueError(
                f"config.distill.group_size={self.group_size} must be >= 2 (the leave-one-out baseline) and "
                f"elbo_draws={self.elbo_draws} >= 1."
            )

    def rollout(self, params, batch: dict[str, Array], key: jax.Array) -> tuple[Array, Array, Array]:
        """G canvases per prompt from the student (no gradient): (start, trajectory (k, G b, c), fixed (G b, c))."""
        g, fixed = self.group_size, batch["fixed"]
        b = fixed.shape[0]
        params = jax.lax.stop_gradient(params)
        rows_fixed = jnp.tile(fixed, (g, 1))
        keys = row_keys(key, g * b)
        start = self.sampler.initial_canvas(
            keys, g * b, fixed=rows_fixed, fixed_tokens=jnp.tile(batch["canvas_tokens"], (g, 1))
        )
        cache = _prefix_cache(self.model, params, batch, g)
        result = canvas_lib.denoise_canvas(
            self.model, params, cache, start, keys, sampler=self.sampler, fixed=rows_fixed, return_trajectory=True
        )
        return start, result.trajectory, rows_fixed

    def student_path_log_probs(
        self, params, batch, start, trajectory
    ) -> tuple[Float[Array, "k gb"], Float[Array, "k gb"] | None, dict]:
        """(log q of each step's draw, the entropy of each step's draw given its state (with `exact_entropy`, else
        None: a pass over the vocabulary saved), the MoE aux outputs)."""
        k, gb, c = trajectory.shape
        states = jnp.concatenate([start[None], trajectory[:-1]], axis=0).reshape(k * gb, c)
        cache = _prefix_cache(self.model, params, batch, k * self.group_size)
        sc = None
        if self.model.cfg.self_conditioning:
            sc = T.model_method(self.model, params, "null_sc_signal", (k * gb, c), kind=self.sampler.null_signal)
        logits, aux = T.decode_block(self.model, params, states, cache, sc_signal=sc)
        temperatures = jnp.stack(
            [self.sampler.temperature(StepInfo.at(s, k, self.sampler.process.schedule, True, True).t) for s in range(k)]
        ).astype(jnp.float32)
        committed = commit_steps(start, trajectory, self.sampler.process.mask_id)
        log_probs = _shaped_log_probs(logits.reshape(k, gb, c, -1), temperatures, self.sampler.logit_bias())
        entropy = _committed_entropy(log_probs, committed) if self.exact_entropy else None
        return _committed_log_q(log_probs, trajectory[-1], committed), entropy, aux

    def teacher_elbo(self, batch, tokens: Int[Array, "gb c"], fixed: Bool[Array, "gb c"], key) -> Float[Array, "gb"]:
        """The teacher's masking ELBO of each canvas given its prompt (nats), mean of `elbo_draws` stratified draws;
        its logits divided by `target_temperature` first (0: by the sampler's temperature at the draw's t). Rows are
        G groups of b prompts; with `shared_noise` the G canvases of a prompt see the same noise levels and the same
        uniforms deciding which positions are masked (common random numbers), so the estimation noise they share
        cancels in the leave-one-out differences; each canvas's estimate stays unbiased."""
        n, gb = self.elbo_draws, tokens.shape[0]
        rows = batch["fixed"].shape[0] if self.shared_noise else gb
        copies = gb // rows
        process = self.sampler.process
        u_key, mask_key = jax.random.split(key)
        t = (jax.random.uniform(u_key, (1, rows)) + jnp.arange(n)[:, None]) / n  # stratified over [0, 1)
        t = jnp.clip(jnp.tile(t, (1, copies)), 1e-3, 1.0).reshape(n * gb)
        x0 = jnp.tile(tokens, (n, 1))
        free = ~jnp.tile(fixed, (n, 1))
        uniforms = jnp.tile(jax.random.uniform(mask_key, (n, rows, tokens.shape[1])), (1, copies, 1))
        masked = free & (uniforms.reshape(x0.shape) >= process.schedule.alpha(t)[:, None])
        xt = jnp.where(masked, process.mask_id, x0)
        cache = _prefix_cache(self.model, self.teacher_params, batch, n * self.group_size)
        sc = None
        if self.model.cfg.self_conditioning:
            sc = T.model_method(self.model, self.teacher_params, "null_sc_signal", x0.shape, kind="zeros")
        logits, _ = T.decode_block(self.model, self.teacher_params, xt, cache, sc_signal=sc)
        if self.target_temperature > 0:
            temperature = jnp.full((n * gb,), self.target_temperature, jnp.float32)
        else:
            temperature = self.sampler.temperature(t)
        logits = logits.astype(jnp.float32) / temperature[:, None, None]
        nelbo = elbos.masking_elbo(logits, x0, xt, t, process.schedule, process.mask_id, loss_mask=free)
        return -jnp.mean(nelbo.reshape(n, gb), axis=0)

    def __call__(self, params, batch: dict[str, Array], rng: jax.Array) -> tuple[Float[Array, ""], dict]:
        rollout_key, elbo_key = jax.random.split(rng)
        start, trajectory, fixed = self.rollout(params, batch, rollout_key)
        tokens = trajectory[-1]
        step_log_q, step_entropy, aux = self.student_path_log_probs(params, batch, start, trajectory)  # (k, G b)
        log_q = jnp.sum(step_log_q, axis=0)
        log_p = jax.lax.stop_gradient(self.teacher_elbo(batch, tokens, fixed, elbo_key))
        free_tokens = jnp.maximum(jnp.sum(~fixed, axis=-1).astype(jnp.float32), 1.0)
        cost = jax.lax.stop_gradient(log_q - self.target_sharpness * log_p) / free_tokens
        # the draws of step s cannot change the log q of earlier steps: each step's tokens answer for the cost to go
        own = jax.lax.stop_gradient(-step_entropy if self.exact_entropy else step_log_q)
        to_go = jnp.cumsum(own[::-1], axis=0)[::-1] - self.target_sharpness * log_p
        if self.exact_entropy:  # E[log q_s grad log q_s | state] = -grad H_s: the own step's term by its exact value
            to_go = to_go - own
        k, g = step_log_q.shape[0], self.group_size
        centred = jax.vmap(leave_one_out)((to_go / free_tokens).reshape(k, g, -1)).reshape(k, -1)
        surrogate = jnp.sum(jnp.mean(centred * step_log_q, axis=1))
        if self.exact_entropy:
            surrogate = surrogate - jnp.sum(jnp.mean(step_entropy / free_tokens, axis=1))
        loss = surrogate + aux_loss(aux)
        metrics = {
            "loss": loss,
            "cost_per_token": jnp.mean(cost),  # log q - beta log p per token: falls as the student nears p^beta
            "student_nll_per_token": -jnp.mean(jax.lax.stop_gradient(log_q) / free_tokens),
            "teacher_elbo_per_token": jnp.mean(log_p / free_tokens),
            "cost_std_in_group": jnp.mean(jnp.std(cost.reshape(g, -1), axis=0)),
            **moe_metrics(aux),
        }
        return loss, metrics
