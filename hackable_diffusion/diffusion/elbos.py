"""Losses: continuous-time ELBOs for masking and uniform noise, DiffusionGemma's canvas CE, autoregressive CE.

All losses are in nats; ELBO terms are per-example sums over loss positions (nats per sequence), cross-entropies are
per-example means. `bits_per_token` turns per-example nat sums and token counts into a dataset-level bits/token.
Log-softmax is always computed in (at least) float32 whatever the logits dtype.

Continuous-time NELBO (derivation; CTMC view of Campbell et al. 2022, SEDD Lou et al. 2024, UDLM Schiff et al. 2024).
Per token, q(x_t = j | x0) = alpha [j == x0] + (1 - alpha) pi_j (see processes.py) is a Markov jump process with
rate beta(t) pi_i of jumping from any k to i, beta = -alpha'/alpha. Given x0 and x_t = i, the reverse process jumps
to k != i at rate r_k = beta pi_i q_t(k | x0) / q_t(i | x0). The model's reverse rate, with P = softmax(logits) read as
p(x0 | x_t) at that position (the mixture posterior of processes.py), is
r^_k = beta pi_i sum_y P(y) q_t(k | y) / q_t(i | y).
The path-space KL gives, over positions and t ~ U[0, 1],

    -log p(x0) <= E_t E_{x_t ~ q_t(.|x0)} sum_pos sum_{k != x_t} f(r_k, r^_k)  +  reconstruction  +  prior,
    f(r, r^) = r log(r / r^) - r + r^ >= 0.

* Masking (pi = mask point mass; MD4 Shi et al. 2024, MDLM Sahoo et al. 2024). At a masked position r_k =
  beta alpha/(1-alpha) [k == x0] and r^_k = beta alpha/(1-alpha) P(k), so the sum is -alpha'/(1-alpha) * (-log P(x0)):
  the familiar weighted cross-entropy over masked positions (weight 1/t for the linear schedule). Unmasked positions
  have no reverse jumps (SUBS copy-over), and the mask logit is dropped before the softmax (SUBS: clean data is never
  the mask, so the model's score for the mask token is irrelevant).
* Uniform (pi = 1/N on the N allowed tokens; UDLM). With rho_k = q_t(k|x0)/q_t(i|x0) and
  rho^_k = sum_y P(y) q_t(k|y)/q_t(i|y) the integrand is

      -alpha'/(N alpha) * sum_{k != i} [ rho_k log(rho_k / rho^_k) - rho_k + rho^_k ].

  In UDLM's notation rho_k = xbar_k / xbar_i with xbar = N alpha x0 + (1 - alpha) 1 (here
  sum_{k != i} rho_k = N / xbar_i - 1), which is their Eq. for the data term. UDLM writes the model term as
  xbar_theta,k / xbar_theta,i with xbar_theta = N alpha x_theta + (1 - alpha) 1; ours is that formula with
  x_theta(y) proportional to P(y) / q_t(i | y) -- the same family of reverse processes, parameterised so that the
  output of a network trained by cross-entropy (DiffusionGemma) is the right input. A perfect data predictor
  (P = onehot(x0)) gives rho^ = rho and a zero integrand, and with P the true p(x0_i | x_t) r^ is the true reverse
  rate (the forward process changes one position at a time, so per-position rates are exact) and the bound is
  tight: experiments/likelihood/elbo_toy.py checks both processes on an enumerable distribution.
* Endpoint terms. Schedules are clipped (alpha(0) = 1 - eps, alpha(1) = eps), so a strict bound adds
  `reconstruction_nll` (-log p(x0 | x_{t=0}) under the model's consistent x0 distribution) and `prior_kl`
  (KL(q(x_1 | x0) || p(x_1)) with p(x_1) = alpha(1)/V + (1 - alpha(1)) pi, the t = 1 marginal of uniform-over-V data,
  i.e. the eps-smoothed version of what `prior_sample` draws). Both are O(eps L log V); MDLM drops them, MD4 keeps them.
* `discrete_time_elbo`: num_steps * KL(q(x_s | x_t, x0) || p(x_s | x_t)) with s = t - 1/num_steps, built from
  `posterior_probs` (D3PM, Austin et al. 2021). Averaged over t uniform on the grid {1/T, ..., 1} it is the T-step
  ELBO's diffusion term; it tends to the continuous integrand as num_steps grows (tested for both processes).

DiffusionGemma reference (HD `training/discrete_loss.py`): `NoWeightDiscreteLoss` is an unweighted CE over every
position of the selected canvas (`canvas_cross_entropy`), normalised per example, and `EncoderARLoss` is a next-token
CE averaged per example (`autoregressive_cross_entropy`). BD3-LM (Arriola et al. 2025) uses the masking ELBO per block.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from hackable_diffusion.diffusion.processes import MaskingProcess, NoiseProcess, UniformProcess
from hackable_diffusion.diffusion.schedules import Schedule

LN2 = math.log(2.0)


# ---------------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------------


def _float_dtype(x: Array):
    return jnp.result_type(x.dtype, jnp.float32)


def _log_probs(logits: Float[Array, "b l V"]) -> Float[Array, "b l V"]:
    return jax.nn.log_softmax(logits.astype(_float_dtype(logits)), axis=-1)


def _positions(loss_mask: Bool[Array, "b l"] | None, shape: tuple[int, ...]) -> Bool[Array, "b l"]:
    if loss_mask is None:
        return jnp.ones(shape, bool)
    if loss_mask.shape != shape:
        raise ValueError(f"loss_mask must have shape {shape} (batch, length), got {loss_mask.shape}.")
    return loss_mask.astype(bool)


def _check_elbo_inputs(logits: Array, x0: Array, xt: Array, t: Array):
    if logits.ndim != 3 or x0.shape != logits.shape[:2] or xt.shape != x0.shape:
        raise ValueError(
            f"need logits (b, l, V) with x0 and xt of shape (b, l); got logits {logits.shape}, "
            f"x0 {x0.shape}, xt {xt.shape}."
        )
    if jnp.shape(t) != (x0.shape[0],):
        raise ValueError(f"t must have shape (batch,) = ({x0.shape[0]},), got {jnp.shape(t)}.")


def _at_tokens(log_probs: Float[Array, "b l V"], tokens: Int[Array, "b l"]) -> Float[Array, "b l"]:
    return jnp.take_along_axis(log_probs, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _generalised_kl(log_r: Array, log_r_hat: Array) -> Array:
    """Elementwise f(r, r^) = r log(r/r^) - r + r^ >= 0 from logs, stable when r ~ r^, inf when r > 0 = r^."""
    r_zero = jnp.isneginf(log_r)
    r_hat_zero = jnp.isneginf(log_r_hat)
    finite = ~r_zero & ~r_hat_zero
    log_r_safe = jnp.where(finite, log_r, 0.0)
    log_r_hat_safe = jnp.where(finite, log_r_hat, 0.0)
    d = log_r_safe - log_r_hat_safe
    r, r_hat = jnp.exp(log_r_safe), jnp.exp(log_r_hat_safe)
    # r log(r/r^) - (r - r^), with r - r^ = r^ expm1(d) computed without cancellation while d is moderate.
    excess = jnp.where(d < 30.0, r_hat * jnp.expm1(jnp.minimum(d, 30.0)), r - r_hat)
    value = r * d - excess
    only_model = jnp.exp(jnp.where(r_zero & ~r_hat_zero, log_r_hat, -jnp.inf))
    return jnp.where(finite, value, jnp.where(r_zero, only_model, jnp.inf))


def nats_to_bits(nats: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
    return nats / LN2


def bits_per_token(nats_per_example: Float[Array, "b"], tokens_per_example: Int[Array, "b"]) -> Float[Array, ""]:
    """Dataset-level bits/token: sum of per-example nats / (ln 2 * total number of loss tokens)."""
    total_tokens = jnp.sum(tokens_per_example)
    return jnp.sum(nats_per_example) / (LN2 * jnp.maximum(total_tokens, 1))


# ---------------------------------------------------------------------------------------------------------------------
# Continuous-time ELBOs
# ---------------------------------------------------------------------------------------------------------------------


def _masked_nll(logits, x0, xt, mask_id: int, loss_mask, token_reweight: tuple[float, float] | None = None):
    """Per example: the NLL of x0 summed over the masked loss positions (mask logit dropped, SUBS), and their count.
    With `token_reweight` each position's NLL is first multiplied by `token_reweight_factor`."""
    positions = _positions(loss_mask, x0.shape) & (xt == mask_id)
    logits = logits.astype(_float_dtype(logits)).at[..., mask_id].set(-jnp.inf)
    nll = -_at_tokens(jax.nn.log_softmax(logits, axis=-1), x0)
    if token_reweight is not None:
        nll = token_reweight_factor(nll, *token_reweight) * nll
    return jnp.sum(jnp.where(positions, nll, 0.0), axis=-1), jnp.sum(positions, axis=-1)


def token_reweight_factor(nll: Float[Array, "..."], alpha: float, gamma: float) -> Float[Array, "..."]:
    """alpha * (1 - exp(-nll)) ** gamma = alpha * (1 - p) ** gamma, p the model's probability of the right token.

    The token-level reweighting of Ye et al. 2024 (MGDM, "Beyond Autoregression", their 9 x 9 puzzle run: alpha 0.25,
    gamma 1), a focal-loss form: positions the model already gets right weigh little, hard subgoals weigh more. The
    factor is not stop-gradiented, as in focal loss. gamma 0 leaves the plain CE scaled by alpha.
    """
    if gamma < 0:
        raise ValueError(f"token reweighting needs gamma >= 0, got {gamma}.")
    if gamma == 0:
        return jnp.full_like(nll, alpha)
    return alpha * (-jnp.expm1(-nll)) ** gamma


def masking_elbo_weight(schedule: Schedule, t: Float[Array, "b"]) -> Float[Array, "b"]:
    """-alpha'(t) / (1 - alpha(t)): 1/t for the unclipped linear schedule."""
    return -schedule.alpha_prime(t) / (1.0 - schedule.alpha(t))


def masking_elbo(
    logits: Float[Array, "b l V"],
    x0: Int[Array, "b l"],
    xt: Int[Array, "b l"],
    t: Float[Array, "b"],
    schedule: Schedule,
    mask_id: int,
    loss_mask: Bool[Array, "b l"] | None = None,
) -> Float[Array, "b"]:
    """Continuous-time masking NELBO integrand at t (nats per example): weight(t) * CE summed over masked positions.

    Positions count when xt == mask_id and loss_mask; the mask token's logit is dropped (SUBS).
    """
    _check_elbo_inputs(logits, x0, xt, t)
    if not 0 <= mask_id < logits.shape[-1]:
        raise ValueError(f"mask_id={mask_id} is not a class of the logits (V={logits.shape[-1]}).")
    summed, _ = _masked_nll(logits, x0, xt, mask_id, loss_mask)
    return masking_elbo_weight(schedule, t) * summed


def uniform_elbo(
    logits: Float[Array, "b l V"],
    x0: Int[Array, "b l"],
    xt: Int[Array, "b l"],
    t: Float[Array, "b"],
    schedule: Schedule,
    allowed: Bool[Array, "V"] | None = None,
    loss_mask: Bool[Array, "b l"] | None = None,
) -> Float[Array, "b"]:
    """Continuous-time uniform-noise NELBO integrand at t (nats per example), see the module docstring.

    `allowed` marks the tokens a corrupted position can become (`UniformProcess.allowed_vocab()`; None = all V).
    Positions count when loss_mask is set and xt is an allowed token (an excluded token in xt is necessarily clean).
    Needs alpha(t) < 1, which the clipped schedules guarantee. loss_mask must exclude positions that were held fixed
    during corruption.
    """
    _check_elbo_inputs(logits, x0, xt, t)
    vocab_size = logits.shape[-1]
    dtype = _float_dtype(logits)
    allowed = jnp.ones(vocab_size, bool) if allowed is None else jnp.asarray(allowed, bool)
    if allowed.shape != (vocab_size,):
        raise ValueError(f"allowed must be a boolean vector over the vocabulary ({vocab_size},), got {allowed.shape}.")
    num_allowed = jnp.sum(allowed).astype(dtype)
    log_pi = jnp.where(allowed, -jnp.log(num_allowed), -jnp.inf)

    positions = _positions(loss_mask, x0.shape) & allowed[xt]
    safe_xt = jnp.where(positions, xt, jnp.argmax(allowed))  # keeps inactive positions finite (and their grads)
    alpha = schedule.alpha(t).astype(dtype)[:, None, None]
    log_alpha, log_one_minus_alpha = jnp.log(alpha), jnp.log1p(-alpha)
    onehot_xt = jax.nn.one_hot(safe_xt, vocab_size, dtype=bool)

    # log q_t(i | y) for every clean value y, at the observed i = x_t.
    log_lik_xt = jnp.where(
        onehot_xt,
        jnp.logaddexp(log_alpha, log_one_minus_alpha + log_pi[safe_xt][..., None]),
        log_one_minus_alpha + log_pi[safe_xt][..., None],
    )
    log_w = _log_probs(logits) - log_lik_xt
    log_w_total = jax.scipy.special.logsumexp(log_w, axis=-1, keepdims=True)
    log_rho_hat = jnp.logaddexp(log_alpha + log_w, log_one_minus_alpha + log_pi + log_w_total)

    # log rho_k = log q_t(k | x0) - log q_t(i | x0).
    onehot_x0 = jax.nn.one_hot(x0, vocab_size, dtype=bool)
    log_qt_x0 = jnp.where(
        onehot_x0, jnp.logaddexp(log_alpha, log_one_minus_alpha + log_pi), log_one_minus_alpha + log_pi
    )
    log_rho = log_qt_x0 - _at_tokens(log_qt_x0, safe_xt)[..., None]

    per_class = jnp.where(onehot_xt, 0.0, _generalised_kl(log_rho, log_rho_hat))
    per_position = jnp.sum(per_class, axis=-1)
    summed = jnp.sum(jnp.where(positions, per_position, 0.0), axis=-1)
    rate = (-schedule.alpha_prime(t) / schedule.alpha(t)).astype(dtype)
    return rate / num_allowed * summed


def process_elbo(
    logits: Float[Array, "b l V"],
    x0: Int[Array, "b l"],
    xt: Int[Array, "b l"],
    t: Float[Array, "b"],
    process: NoiseProcess,
    loss_mask: Bool[Array, "b l"] | None = None,
) -> Float[Array, "b"]:
    """The continuous-time NELBO integrand for either process (dispatches to masking_elbo / uniform_elbo)."""
    if isinstance(process, MaskingProcess):
        return masking_elbo(logits, x0, xt, t, process.schedule, process.mask_id, loss_mask)
    if isinstance(process, UniformProcess):
        return uniform_elbo(logits, x0, xt, t, process.schedule, process.allowed_vocab(), loss_mask)
    raise ValueError(f"no continuous-time ELBO for {type(process).__name__}; use MaskingProcess or UniformProcess.")


def discrete_time_elbo(
    logits: Float[Array, "b l V"],
    x0: Int[Array, "b l"],
    xt: Int[Array, "b l"],
    t: Float[Array, "b"],
    process: NoiseProcess,
    num_steps: int,
    loss_mask: Bool[Array, "b l"] | None = None,
) -> Float[Array, "b"]:
    """num_steps * KL(q(x_s | x_t, x0) || p(x_s | x_t)), s = max(t - 1/num_steps, 0), summed over loss positions.

    p(x_s | x_t) is `process.posterior_probs` with x0 ~ softmax(logits). For the uniform process, loss_mask must
    exclude positions held fixed during corruption.
    """
    _check_elbo_inputs(logits, x0, xt, t)
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}.")
    positions = _positions(loss_mask, x0.shape)
    s = jnp.clip(t - 1.0 / num_steps, 0.0, 1.0)
    probs = jnp.exp(_log_probs(logits))
    model = process.posterior_probs(xt, probs, s, t)
    data = process.posterior_probs(xt, jax.nn.one_hot(x0, process.vocab_size, dtype=probs.dtype), s, t)
    per_position = jnp.sum(_generalised_kl(jnp.log(data), jnp.log(model)), axis=-1)
    return num_steps * jnp.sum(jnp.where(positions, per_position, 0.0), axis=-1)


def reconstruction_nll(
    logits: Float[Array, "b l V"],
    x0: Int[Array, "b l"],
    xt: Int[Array, "b l"],
    process: NoiseProcess,
    loss_mask: Bool[Array, "b l"] | None = None,
) -> Float[Array, "b"]:
    """-log p(x0 | x_{t=0}) (nats per example) with xt drawn at t = 0, where alpha(0) = 1 - eps.

    The decoder is the model's x0 distribution restricted to values consistent with xt (`denoised_probs`), so
    unmasked tokens are copied under masking.
    """
    t0 = jnp.zeros((x0.shape[0],), _float_dtype(logits))
    _check_elbo_inputs(logits, x0, xt, t0)
    positions = _positions(loss_mask, x0.shape)
    decoder = process.denoised_probs(xt, jnp.exp(_log_probs(logits)), t0)
    nll = -jnp.log(_at_tokens(decoder, x0))
    return jnp.sum(jnp.where(positions, nll, 0.0), axis=-1)


def prior_kl(
    x0: Int[Array, "b l"],
    process: NoiseProcess,
    loss_mask: Bool[Array, "b l"] | None = None,
) -> Float[Array, "b"]:
    """KL(q(x_1 | x0) || p(x_1)) summed over loss positions, p(x_1) = alpha(1)/V + (1 - alpha(1)) pi per token."""
    positions = _positions(loss_mask, x0.shape)
    alpha1 = process.schedule.alpha(jnp.ones((x0.shape[0],), jnp.result_type(float)))[:, None, None]
    vocab_size = process.vocab_size
    prior = alpha1 / vocab_size + (1.0 - alpha1) * process.noise_distribution().astype(alpha1.dtype)
    # q - prior = alpha1 (onehot(x0) - 1/V) exactly; sum_k prior_k g(r_k), r = (q - prior)/prior, g(r) =
    # (1 + r) log1p(r) - r >= 0, with a series for small r so that nothing cancels in float32.
    diff = alpha1 * (jax.nn.one_hot(x0, vocab_size, dtype=alpha1.dtype) - 1.0 / vocab_size)
    r = diff / prior
    q_is_zero = r <= -1.0
    r_safe = jnp.where(q_is_zero, 0.0, r)
    series = r_safe**2 / 2 - r_safe**3 / 6 + r_safe**4 / 12
    g = jnp.where(jnp.abs(r_safe) < 1e-2, series, (1.0 + r_safe) * jnp.log1p(r_safe) - r_safe)
    kl = jnp.sum(jnp.where(q_is_zero, prior, prior * g), axis=-1)
    return jnp.sum(jnp.where(positions, kl, 0.0), axis=-1)


# ---------------------------------------------------------------------------------------------------------------------
# Cross-entropies
# ---------------------------------------------------------------------------------------------------------------------


def canvas_cross_entropy(
    logits: Float[Array, "b l V"],
    targets: Int[Array, "b l"],
    loss_mask: Bool[Array, "b l"] | None = None,
) -> Float[Array, "b"]:
    """DiffusionGemma's unweighted CE: mean over each example's loss positions (0 for an example with none)."""
    if logits.ndim != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(f"need logits (b, l, V) and targets (b, l), got {logits.shape} and {targets.shape}.")
    positions = _positions(loss_mask, targets.shape)
    nll = -_at_tokens(_log_probs(logits), targets)
    count = jnp.sum(positions, axis=-1)
    return jnp.sum(jnp.where(positions, nll, 0.0), axis=-1) / jnp.maximum(count, 1)


def masked_token_cross_entropy(
    logits: Float[Array, "b l V"],
    x0: Int[Array, "b l"],
    xt: Int[Array, "b l"],
    mask_id: int,
    loss_mask: Bool[Array, "b l"] | None = None,
    token_reweight: tuple[float, float] | None = None,
) -> Float[Array, "b"]:
    """Unweighted CE over the masked positions, pooled over the batch (MaskGIT-style; no 1/t weight).

    Returns per-example sums scaled so that their mean is the batch's mean CE per masked position: an example counts
    in proportion to how many of its positions are masked, so heavily masked states (the start of decoding) weigh
    more than under the ELBO, whose per-position weight is the same at every t in expectation. `token_reweight`
    (alpha, gamma) weighs each position's CE by `token_reweight_factor` (MGDM).
    """
    summed, count = _masked_nll(logits, x0, xt, mask_id, loss_mask, token_reweight)
    return summed * x0.shape[0] / jnp.maximum(jnp.sum(count), 1)


def autoregressive_cross_entropy(
    logits: Float[Array, "b l V"],
    tokens: Int[Array, "b l"],
    loss_mask: Bool[Array, "b l"] | None = None,
) -> tuple[Float[Array, "b"], Int[Array, "b"]]:
    """Next-token CE: logits[:, i] predicts tokens[:, i + 1]. Returns (per-example mean, per-example token count).

    loss_mask is aligned with `tokens` and marks the tokens to predict (position 0 is never a target). DiffusionGemma's
    `SequenceTargetShift` mask corresponds to loss_mask[:, i + 1] = valid[:, i] & valid[:, i + 1].
    """
    if logits.ndim != 3 or tokens.shape != logits.shape[:2]:
        raise ValueError(f"need logits (b, l, V) and tokens (b, l), got {logits.shape} and {tokens.shape}.")
    positions = _positions(loss_mask, tokens.shape)[:, 1:]
    nll = -_at_tokens(_log_probs(logits[:, :-1]), tokens[:, 1:])
    count = jnp.sum(positions, axis=-1)
    mean = jnp.sum(jnp.where(positions, nll, 0.0), axis=-1) / jnp.maximum(count, 1)
    return mean, count
