"""Per-token log-probabilities of sampled completions under a policy: what every RL objective differentiates.

* `MeanFieldScorer` (diffusion runs; d1, Zhao et al. 2025): ONE bidirectional forward pass with every completion
  position masked (and, when `prompt_masked` marks some, those prompt positions too) gives a factorised
  distribution over the completion; a completion's sequence log-probability is the sum of its tokens' log-probs
  under it. Not the sampler's probability (the sampler commits tokens over several passes), but one network pass,
  as d1 uses it; the masking ELBO (`objectives.ElboPolicyGradient`) is the bound-based alternative. The mask token's
  logit is dropped (it is never a clean token), as in the ELBO.
* `AutoregressiveScorer` (AR runs): the exact log-probs of a causal pass, token t read from position t - 1.

Both return (log-probs, entropies), each (b, l) with zeros outside `completion`, plus the MoE auxiliary outputs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from hackable_diffusion.models import transformer as T


def _scores(logits: Float[Array, "b l v"], targets: Int[Array, "b l"], where: Bool[Array, "b l"]):
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    at = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    probs = jnp.exp(log_probs)
    entropy = -jnp.sum(jnp.where(probs > 0, probs * log_probs, 0.0), axis=-1)
    return jnp.where(where, at, 0.0), jnp.where(where, entropy, 0.0)


@dataclasses.dataclass(frozen=True)
class MeanFieldScorer:
    """d1's one-step estimator: the completion (and `prompt_masked`) masked, one bidirectional pass."""

    model: T.Transformer
    mask_id: int
    null_signal: str = "zeros"  # a self-conditioned model's input at its first pass (`diffusion.null_signal`)

    def __call__(
        self,
        params,
        tokens: Int[Array, "b l"],
        completion: Bool[Array, "b l"],
        prompt_masked: Bool[Array, "b l"],
    ) -> tuple[Float[Array, "b l"], Float[Array, "b l"], dict]:
        noisy = jnp.where(completion | prompt_masked, self.mask_id, tokens)
        signal = None
        if self.model.cfg.self_conditioning:  # no first pass to condition on: the null signal, as at a first step
            signal = T.model_method(self.model, params, "null_sc_signal", tokens.shape, kind=self.null_signal)
        logits, aux = T.forward(self.model, params, noisy, causal=False, sc_signal=signal)
        logits = logits.at[..., self.mask_id].set(-jnp.inf)
        log_probs, entropy = _scores(logits, tokens, completion)
        return log_probs, entropy, aux


@dataclasses.dataclass(frozen=True)
class AutoregressiveScorer:
    """Exact token log-probs of a causal pass over [prompt; completion]; `prompt_masked` is ignored."""

    model: T.Transformer

    def __call__(
        self,
        params,
        tokens: Int[Array, "b l"],
        completion: Bool[Array, "b l"],
        prompt_masked: Bool[Array, "b l"],
    ) -> tuple[Float[Array, "b l"], Float[Array, "b l"], dict]:
        del prompt_masked
        logits, aux = T.forward(self.model, params, tokens, causal=True)
        shifted = jnp.concatenate([jnp.zeros_like(logits[:, :1]), logits[:, :-1]], axis=1)  # position t reads t - 1
        scored = completion & (jnp.arange(tokens.shape[1]) > 0)[None, :]
        log_probs, entropy = _scores(shifted, tokens, scored)
        return log_probs, entropy, aux
