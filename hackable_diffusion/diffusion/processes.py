"""Discrete noise processes: masking (absorbing) and uniform ("multinomial") corruption behind one interface.

Both processes are the same family of per-token Markov chains (D3PM, Austin et al. 2021): from clean token x0, the
token at time t is distributed as

    q(x_t = j | x0) = alpha(t) [j == x0] + (1 - alpha(t)) pi_j,

where pi is the process's noise distribution: a point mass on the mask token (masking: MD4, Shi et al. 2024; MDLM,
Sahoo et al. 2024; LLaDA) or the uniform distribution over the N allowed tokens (uniform: D3PM-uniform, UDLM
Schiff et al. 2024, SEDD-uniform Lou et al. 2024, and DiffusionGemma). The transition from s < t to t has the same form
with alpha_{t|s} = alpha(t) / alpha(s), which is what makes the posterior below exact.

Posterior (`posterior_probs`). For one-hot x0 it is Bayes' rule,

    q(x_s = k | x_t = i, x0) = q(x_t = i | x_s = k) q(x_s = k | x0) / q(x_t = i | x0).

For a distribution P over x0 (a model's prediction), we return the mixture of these exact posteriors,
sum_{x0} P(x0) q(x_s | x_t, x0), restricted to the x0 that could have produced x_t (q(x_t | x0) > 0) and renormalised.
So P is read as the model's estimate of p(x0 | x_t) -- what a network trained with cross-entropy on (x_t, x0) pairs
(DiffusionGemma's canvas CE, MDLM/MD4) learns. One V-sized pass suffices, with w(x0) = P(x0) / q(x_t = i | x0):
the mixture is q(x_t = i | x_s = k) sum_{x0} w(x0) q(x_s = k | x0). D3PM and UDLM instead plug P into the one-hot
formula before normalising (sum_x0 P(x0) q(x_s, x_t | x0) / sum_x0 P(x0) q(x_t | x0)), which reads P as a prediction
of x0 that has not yet been reweighted by the likelihood of the observed x_t. For masking the two agree
(q(x_t = mask | x0) does not depend on x0); for uniform noise they differ, and only the mixture is the exact reverse
step when P is the true p(x0 | x_t).

Masking uses the SUBS parameterisation (MDLM): the mask token can never be clean data, so the mask column of P is
zeroed before the posterior, and a position that is not masked in x_t is copied (its posterior is one-hot).

DiffusionGemma reference: `CategoricalProcess.uniform_process(V, LinearDiscreteSchedule())` draws the replacement from
the whole vocabulary with `randint(0, V)`, special tokens included; `UniformProcess(..., excluded_ids=())` reproduces
that. With `excluded_ids` the replacement is uniform over the other N = V - len(excluded_ids) tokens, and every formula
here uses that N (a clean excluded token, e.g. EOS, can still be corrupted into an allowed one). Unlike the reference,
`corrupt` takes a `fixed` mask (prompt, a puzzle's givens, infill context) whose positions are never corrupted.
"""

from __future__ import annotations

import abc
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from hackable_diffusion.diffusion.schedules import Schedule


def _check_tokens_and_times(x0: Array, t: Array, fixed: Array | None):
    if x0.ndim != 2:
        raise ValueError(f"x0 must have shape (batch, length), got {x0.shape}.")
    if t.shape != (x0.shape[0],):
        raise ValueError(f"t must have shape (batch,) = ({x0.shape[0]},), got {t.shape}; give one time per example.")
    if fixed is not None and fixed.shape != x0.shape:
        raise ValueError(f"fixed must have the shape of x0 {x0.shape}, got {fixed.shape}.")


def transition_posterior(
    xt: Int[Array, "b l"],
    x0_probs: Float[Array, "b l V"],
    alpha_s: Float[Array, "b"],
    alpha_t: Float[Array, "b"],
    noise_distribution: Float[Array, "V"],
) -> Float[Array, "b l V"]:
    """sum_{x0} P(x0) q(x_s | x_t, x0) for q(x_t = j | x0) = alpha [j == x0] + (1 - alpha) pi_j, alpha_s >= alpha_t.

    With w(y) = P(y) / q(x_t = i | y) over the x0 values y consistent with x_t = i, the unnormalised posterior is
    q(x_t = i | x_s = k) * (alpha_s w(k) + (1 - alpha_s) pi_k sum_y w(y)). `alpha_s = 1` gives the (consistent,
    renormalised) x0 distribution itself.
    """
    vocab_size = x0_probs.shape[-1]
    dtype = jnp.result_type(x0_probs.dtype, jnp.float32)  # at least float32; float64 when enabled and given
    x0_probs = x0_probs.astype(dtype)
    pi = noise_distribution.astype(dtype)
    a_s = jnp.asarray(alpha_s, dtype)[:, None, None]
    a_t = jnp.asarray(alpha_t, dtype)[:, None, None]
    a_ts = a_t / a_s
    onehot_xt = jax.nn.one_hot(xt, vocab_size, dtype=dtype)
    pi_at_xt = pi[xt][..., None]

    likelihood_of_xt = a_t * onehot_xt + (1.0 - a_t) * pi_at_xt  # q(x_t = i | x0 = y), over y
    consistent = likelihood_of_xt > 0
    w = jnp.where(consistent, x0_probs / jnp.where(consistent, likelihood_of_xt, 1.0), 0.0)
    w_total = jnp.sum(w, axis=-1, keepdims=True)
    mixed_qs = a_s * w + (1.0 - a_s) * pi * w_total  # sum_y w(y) q(x_s = k | y)
    step_likelihood = a_ts * onehot_xt + (1.0 - a_ts) * pi_at_xt  # q(x_t = i | x_s = k), over k
    unnormalised = step_likelihood * mixed_qs
    total = jnp.sum(unnormalised, axis=-1, keepdims=True)
    return jnp.where(total > 0, unnormalised / jnp.where(total > 0, total, 1.0), onehot_xt)


@dataclasses.dataclass(frozen=True)
class NoiseProcess(abc.ABC):
    """Per-token corruption q(x_t | x0) = alpha(t) [x_t == x0] + (1 - alpha(t)) pi(x_t)."""

    vocab_size: int
    schedule: Schedule

    def __post_init__(self):
        if not isinstance(self.vocab_size, (int, np.integer)) or self.vocab_size < 2:
            raise ValueError(f"{type(self).__name__}: vocab_size must be an int >= 2, got {self.vocab_size!r}.")
        if not isinstance(self.schedule, Schedule):
            raise ValueError(
                f"{type(self).__name__}: schedule must be a Schedule (e.g. LinearSchedule()), got {self.schedule!r}."
            )

    @abc.abstractmethod
    def noise_distribution(self) -> Float[Array, "V"]:
        """pi: where a corrupted token goes."""

    @abc.abstractmethod
    def prior_sample(self, key: jax.Array, shape: tuple[int, ...]) -> Int[Array, "*shape"]:
        """A sample of x_1 (every token replaced by a draw from pi)."""

    def corrupt(
        self,
        key: jax.Array,
        x0: Int[Array, "b l"],
        t: Float[Array, "b"],
        fixed: Bool[Array, "b l"] | None = None,
    ) -> tuple[Int[Array, "b l"], Bool[Array, "b l"]]:
        """Samples x_t ~ q(x_t | x0, t); returns (xt, corrupted) where `corrupted` marks the resampled positions.

        Each position not marked `fixed` is independently kept with probability alpha(t) and otherwise replaced by
        a draw from pi. For the uniform process a replaced token can land on its own value, so `corrupted` may be
        True where xt == x0.
        """
        x0 = jnp.asarray(x0)
        t = jnp.asarray(t)
        _check_tokens_and_times(x0, t, fixed)
        keep_key, noise_key = jax.random.split(key)
        keep_prob = self.schedule.alpha(t)[:, None]
        corrupted = jax.random.uniform(keep_key, x0.shape) >= keep_prob
        if fixed is not None:
            corrupted = corrupted & ~jnp.asarray(fixed, bool)
        noise = self.prior_sample(noise_key, x0.shape).astype(x0.dtype)
        return jnp.where(corrupted, noise, x0), corrupted

    def marginal_probs(self, x0: Int[Array, "b l"], t: Float[Array, "b"]) -> Float[Array, "b l V"]:
        """q(x_t | x0) as a distribution over the vocabulary at every position."""
        alpha = self.schedule.alpha(t)[:, None, None]
        onehot = jax.nn.one_hot(x0, self.vocab_size, dtype=alpha.dtype)
        return alpha * onehot + (1.0 - alpha) * self.noise_distribution().astype(alpha.dtype)

    def restrict_to_data(self, x0_probs: Float[Array, "b l V"]) -> Float[Array, "b l V"]:
        """Zeroes the probability of tokens that can never be clean data (the mask token, for masking)."""
        return x0_probs

    def _check_x0_probs(self, xt: Array, x0_probs: Array):
        if x0_probs.shape[-1] != self.vocab_size:
            raise ValueError(f"x0_probs must have {self.vocab_size} classes (vocab_size), got {x0_probs.shape[-1]}.")
        if x0_probs.shape[:-1] != xt.shape:
            raise ValueError(f"x0_probs {x0_probs.shape} must be xt's shape {xt.shape} plus a vocabulary axis.")

    def denoised_probs(
        self,
        xt: Int[Array, "b l"],
        x0_probs: Float[Array, "b l V"],
        t: Float[Array, "b"],
    ) -> Float[Array, "b l V"]:
        """x0_probs restricted to clean-data tokens that could have produced x_t at time t, renormalised.

        This is the posterior with alpha_s = 1 (a final "decode" step); for masking it copies unmasked tokens.
        """
        self._check_x0_probs(xt, x0_probs)
        alpha_t = self.schedule.alpha(t)
        return transition_posterior(
            xt, self.restrict_to_data(x0_probs), jnp.ones_like(alpha_t), alpha_t, self.noise_distribution()
        )

    def posterior_probs(
        self,
        xt: Int[Array, "b l"],
        x0_probs: Float[Array, "b l V"],
        s: Float[Array, "b"],
        t: Float[Array, "b"],
    ) -> Float[Array, "b l V"]:
        """q(x_s | x_t, x0) mixed over x0 ~ x0_probs, for s < t (see the module docstring)."""
        self._check_x0_probs(xt, x0_probs)
        return transition_posterior(
            xt,
            self.restrict_to_data(x0_probs),
            self.schedule.alpha(s),
            self.schedule.alpha(t),
            self.noise_distribution(),
        )


@dataclasses.dataclass(frozen=True)
class MaskingProcess(NoiseProcess):
    """Absorbing-state diffusion: a corrupted token becomes `mask_id` (a token of the vocabulary)."""

    mask_id: int

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.mask_id < self.vocab_size:
            raise ValueError(
                f"MaskingProcess: mask_id must be a token of the vocabulary, 0 <= mask_id < vocab_size="
                f"{self.vocab_size}, got {self.mask_id}; reserve a vocabulary slot for the mask."
            )

    def noise_distribution(self) -> Float[Array, "V"]:
        return jax.nn.one_hot(self.mask_id, self.vocab_size, dtype=jnp.result_type(float))

    def prior_sample(self, key: jax.Array, shape: tuple[int, ...]) -> Int[Array, "*shape"]:
        del key  # the prior is deterministic: everything masked.
        return jnp.full(shape, self.mask_id, dtype=jnp.int32)

    def restrict_to_data(self, x0_probs):
        # SUBS: clean data is never the mask token.
        return x0_probs * (jnp.arange(self.vocab_size) != self.mask_id).astype(x0_probs.dtype)


@dataclasses.dataclass(frozen=True)
class UniformProcess(NoiseProcess):
    """Uniform ("multinomial") diffusion: a corrupted token becomes a uniform draw over the non-excluded tokens."""

    excluded_ids: tuple[int, ...] = ()

    def __post_init__(self):
        super().__post_init__()
        excluded = tuple(int(i) for i in self.excluded_ids)
        object.__setattr__(self, "excluded_ids", excluded)
        bad = [i for i in excluded if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"UniformProcess: excluded_ids {bad} are outside the vocabulary [0, {self.vocab_size}).")
        if len(set(excluded)) != len(excluded):
            raise ValueError(f"UniformProcess: excluded_ids {excluded} contain duplicates.")
        if self.num_allowed < 2:
            raise ValueError(
                f"UniformProcess: at least 2 tokens must stay allowed, got {self.num_allowed} "
                f"(vocab_size={self.vocab_size}, {len(excluded)} excluded)."
            )

    @property
    def num_allowed(self) -> int:
        """N: the number of tokens a corrupted position can become."""
        return self.vocab_size - len(self.excluded_ids)

    def allowed_vocab(self) -> Bool[Array, "V"]:
        """True for the tokens a corrupted position can become."""
        allowed = np.ones(self.vocab_size, dtype=bool)
        allowed[list(self.excluded_ids)] = False
        return jnp.asarray(allowed)

    def noise_distribution(self) -> Float[Array, "V"]:
        return self.allowed_vocab().astype(jnp.result_type(float)) / self.num_allowed

    def prior_sample(self, key: jax.Array, shape: tuple[int, ...]) -> Int[Array, "*shape"]:
        # Draw a rank in [0, N) and map it to the rank-th allowed id: walking the excluded ids in increasing order,
        # every excluded id at or below the running value pushes it up by one. No V-sized table is needed.
        tokens = jax.random.randint(key, shape, 0, self.num_allowed, dtype=jnp.int32)
        for excluded in sorted(self.excluded_ids):
            tokens = tokens + (tokens >= excluded).astype(jnp.int32)
        return tokens
