"""The ELBO on a distribution small enough to enumerate: with exact models both processes' bounds equal the NLL.

p(x) is a fixed, non-factorised distribution over all 3^4 = 81 sequences of length 4 over the vocabulary {0, 1, 2}:
softmax of seeded Gaussian scores plus a pairwise coupling term (x_1 == x_2, x_3 == x_4), so its total correlation
(sum of marginal entropies minus joint entropy) is far from 0 and is reported. The "models" are exact and computed by
enumeration:

* masking (MaskingProcess, vocabulary {0, 1, 2, mask=3}): at each masked position, p(x_i | unmasked tokens of x_t);
* uniform (UniformProcess, N = 3): p(x0_i | x_t) under the data distribution and the corruption at time t.

With exact models the continuous-time ELBO (elbos.py) of both processes equals the NLL up to O(eps) endpoint terms:
masking diffusion is an any-order autoregressive model, and for uniform noise the per-position posterior gives the
exact reverse jump rates. Monte Carlo over x0 ~ p, t ~ U[0, 1] (i.i.d., so the standard error is the plain one),
x_t ~ q(x_t | x0, t); each sample's bound = diffusion integrand at t + reconstruction at t = 0 + prior KL. All numbers
are bits per SEQUENCE (4 tokens); divide by 4 for bits per token.

`experiments/likelihood/elbo_toy.py` prints `run()`'s figures as one JSON line.
"""

from __future__ import annotations

import itertools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from hackable_diffusion.diffusion import elbos
from hackable_diffusion.diffusion.processes import MaskingProcess, UniformProcess
from hackable_diffusion.diffusion.schedules import UniformTimeSampler, make_schedule

VOCAB = 3


LENGTH = 4


MASK_ID = VOCAB


ALL_SEQUENCES = np.array(list(itertools.product(range(VOCAB), repeat=LENGTH)), dtype=np.int32)  # (81, 4)


def make_distribution(seed: int = 1234) -> np.ndarray:
    """A fixed non-factorised p over the 81 sequences (float64, sums to 1)."""
    rng = np.random.default_rng(seed)
    scores = 1.5 * rng.standard_normal(len(ALL_SEQUENCES))
    coupling = 1.5 * (ALL_SEQUENCES[:, 0] == ALL_SEQUENCES[:, 1]) + 1.5 * (ALL_SEQUENCES[:, 2] == ALL_SEQUENCES[:, 3])
    logits = scores + coupling
    p = np.exp(logits - logits.max())
    return p / p.sum()


def entropy_bits(p: np.ndarray) -> float:
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


def total_correlation_bits(p: np.ndarray) -> float:
    marginals = [np.bincount(ALL_SEQUENCES[:, i], weights=p, minlength=VOCAB) for i in range(LENGTH)]
    return sum(entropy_bits(m) for m in marginals) - entropy_bits(p)


def masking_model_table(p: np.ndarray) -> np.ndarray:
    """Logits (4^4, LENGTH, VOCAB + 1): for every partially masked x_t, p(x_i | unmasked tokens of x_t) at each i."""
    all_xt = np.array(list(itertools.product(range(VOCAB + 1), repeat=LENGTH)), dtype=np.int32)  # (256, 4)
    consistent = np.all((all_xt[:, None, :] == MASK_ID) | (all_xt[:, None, :] == ALL_SEQUENCES[None]), axis=-1)
    posterior = p[None] * consistent
    posterior /= posterior.sum(axis=1, keepdims=True)
    onehot = np.eye(VOCAB + 1)[ALL_SEQUENCES]  # (81, 4, V + 1)
    conditionals = np.einsum("sx,xlv->slv", posterior, onehot)
    return np.log(np.maximum(conditionals, 1e-30)).astype(np.float32)


def _xt_index(xt: jax.Array) -> jax.Array:
    powers = (VOCAB + 1) ** jnp.arange(LENGTH - 1, -1, -1)
    return jnp.sum(xt * powers, axis=-1)


def uniform_model_logits(p: jax.Array, xt: jax.Array, alpha: jax.Array) -> jax.Array:
    """Logits (b, LENGTH, VOCAB): p(x0_i | x_t) by enumeration over the 81 x0.

    q(x_t | x0) = prod_j (alpha [x_t,j == x0_j] + (1 - alpha) / N).
    """
    sequences = jnp.asarray(ALL_SEQUENCES)
    same = xt[:, None, :] == sequences[None]  # (b, 81, 4)
    a = alpha[:, None, None]
    log_lik = jnp.sum(jnp.log(jnp.where(same, a + (1 - a) / VOCAB, (1 - a) / VOCAB)), axis=-1)
    log_post = jnp.log(p)[None] + log_lik
    posterior = jax.nn.softmax(log_post, axis=-1)  # (b, 81)
    marginals = jnp.einsum("bx,xlv->blv", posterior, jax.nn.one_hot(sequences, VOCAB))
    return jnp.log(jnp.maximum(marginals, 1e-30))


def _bits_per_sample(key, p, table, masking, uniform, batch):
    """Per-sample NELBO in bits for both processes (diffusion term at t + reconstruction + prior)."""
    k_x0, k_t, k_mt, k_m0, k_ut, k_u0 = jax.random.split(key, 6)
    x0 = jnp.asarray(ALL_SEQUENCES)[jax.random.choice(k_x0, len(ALL_SEQUENCES), (batch,), p=p)]
    t = UniformTimeSampler()(k_t, batch)
    t0 = jnp.zeros_like(t)

    xt, _ = masking.corrupt(k_mt, x0, t)
    x_clean, _ = masking.corrupt(k_m0, x0, t0)
    masking_nats = (
        elbos.masking_elbo(table[_xt_index(xt)], x0, xt, t, masking.schedule, MASK_ID)
        + elbos.reconstruction_nll(table[_xt_index(x_clean)], x0, x_clean, masking)
        + elbos.prior_kl(x0, masking)
    )

    xt, _ = uniform.corrupt(k_ut, x0, t)
    x_clean, _ = uniform.corrupt(k_u0, x0, t0)
    alpha = uniform.schedule.alpha(t)
    uniform_nats = (
        elbos.uniform_elbo(uniform_model_logits(p, xt, alpha), x0, xt, t, uniform.schedule, uniform.allowed_vocab())
        + elbos.reconstruction_nll(uniform_model_logits(p, x_clean, uniform.schedule.alpha(t0)), x0, x_clean, uniform)
        + elbos.prior_kl(x0, uniform)
    )
    return elbos.nats_to_bits(masking_nats), elbos.nats_to_bits(uniform_nats)


def _gauss_legendre_nodes(points_per_panel: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights on [0, 1], with geometrically shrinking panels towards both ends (log-type singularities)."""
    near_zero = [0.0] + [10.0**-k for k in range(9, 0, -1)]
    edges = np.array(near_zero + [0.5] + [1.0 - e for e in reversed(near_zero)])
    x, w = np.polynomial.legendre.leggauss(points_per_panel)
    nodes, weights = [], []
    for low, high in zip(edges[:-1], edges[1:]):
        nodes.append(low + (high - low) * (x + 1) / 2)
        weights.append((high - low) / 2 * w)
    return np.concatenate(nodes), np.concatenate(weights)


def exact_elbo_bits(p_np: np.ndarray, table: jax.Array, masking: MaskingProcess, uniform: UniformProcess) -> dict:
    """The same bounds without Monte Carlo: sum over every (x0, x_t) pair, quadrature over t (bits per sequence)."""
    p = jnp.asarray(p_np, jnp.float32)
    nodes, weights = _gauss_legendre_nodes()

    def pairs(num_states):
        xt = np.array(list(itertools.product(range(num_states), repeat=LENGTH)), dtype=np.int32)
        x0_index = np.repeat(np.arange(len(ALL_SEQUENCES)), len(xt))
        return jnp.asarray(ALL_SEQUENCES[x0_index]), jnp.asarray(np.tile(xt, (len(ALL_SEQUENCES), 1))), x0_index

    distinct_xt = jnp.asarray(ALL_SEQUENCES)  # the uniform model depends on x_t only: evaluate it once per x_t
    distinct_index = jnp.asarray(np.tile(np.arange(len(ALL_SEQUENCES)), len(ALL_SEQUENCES)))

    def uniform_logits(t):
        alpha = uniform.schedule.alpha(t[:1]) * jnp.ones((len(ALL_SEQUENCES),))
        return uniform_model_logits(p, distinct_xt, alpha)[distinct_index]

    def expectation(process, x0, xt, x0_index, t_value, loss_fn):
        t = jnp.full((x0.shape[0],), t_value, jnp.float32)
        marginal = process.marginal_probs(x0, t)  # (rows, LENGTH, V)
        q_xt = jnp.prod(jnp.take_along_axis(marginal, xt[..., None], axis=-1)[..., 0], axis=-1)
        weight = p[x0_index] * q_xt
        return jnp.sum(jnp.where(weight > 0, weight * loss_fn(x0, xt, t), 0.0))

    def masking_loss(x0, xt, t):
        return elbos.masking_elbo(table[_xt_index(xt)], x0, xt, t, masking.schedule, MASK_ID)

    def masking_recon(x0, xt, t):
        return elbos.reconstruction_nll(table[_xt_index(xt)], x0, xt, masking)

    def uniform_loss(x0, xt, t):
        return elbos.uniform_elbo(uniform_logits(t), x0, xt, t, uniform.schedule, uniform.allowed_vocab())

    def uniform_recon(x0, xt, t):
        return elbos.reconstruction_nll(uniform_logits(t), x0, xt, uniform)

    result = {}
    for name, process, loss_fn, recon_fn, num_states in [
        ("masking", masking, masking_loss, masking_recon, VOCAB + 1),
        ("uniform", uniform, uniform_loss, uniform_recon, VOCAB),
    ]:
        x0, xt, x0_index = pairs(num_states)
        at = jax.jit(
            lambda t_values, fn: jax.lax.map(lambda t: expectation(process, x0, xt, x0_index, t, fn), t_values),
            static_argnums=1,
        )
        diffusion = float(np.dot(weights, np.asarray(at(jnp.asarray(nodes, jnp.float32), loss_fn), np.float64)))
        recon = float(at(jnp.zeros((1,), jnp.float32), recon_fn)[0])
        prior = float(jnp.sum(p * elbos.prior_kl(jnp.asarray(ALL_SEQUENCES), process)))
        result[name] = (diffusion + recon + prior) / math.log(2)
    return result


def run(
    num_samples: int = 1_000_000, seed: int = 0, schedule: str = "linear", chunk: int = 50_000, exact: bool = True
) -> dict:
    start = time.perf_counter()
    p_np = make_distribution()
    p = jnp.asarray(p_np, jnp.float32)
    table = jnp.asarray(masking_model_table(p_np))
    noise_schedule = make_schedule(schedule)
    masking = MaskingProcess(VOCAB + 1, noise_schedule, mask_id=MASK_ID)
    uniform = UniformProcess(VOCAB, noise_schedule)

    step = jax.jit(lambda key, batch: _bits_per_sample(key, p, table, masking, uniform, batch), static_argnums=1)
    masking_bits, uniform_bits = [], []
    keys = jax.random.split(jax.random.key(seed), math.ceil(num_samples / chunk))
    for i, key in enumerate(keys):
        m, u = step(key, min(chunk, num_samples - i * chunk))
        masking_bits.append(np.asarray(m, np.float64))
        uniform_bits.append(np.asarray(u, np.float64))
    masking_bits, uniform_bits = np.concatenate(masking_bits), np.concatenate(uniform_bits)

    nll = entropy_bits(p_np)
    masking_mean, masking_se = masking_bits.mean(), masking_bits.std(ddof=1) / math.sqrt(num_samples)
    uniform_mean, uniform_se = uniform_bits.mean(), uniform_bits.std(ddof=1) / math.sqrt(num_samples)
    result = {
        "experiment": "elbo_toy",
        "unit": "bits_per_sequence",
        "sequence_length": LENGTH,
        "vocab": VOCAB,
        "schedule": schedule,
        "num_samples": num_samples,
        "seed": seed,
        "total_correlation_bits": round(total_correlation_bits(p_np), 4),
        "true_nll_bits": round(nll, 5),
        "elbo_masking_bits": round(float(masking_mean), 5),
        "elbo_masking_se": round(float(masking_se), 5),
        "elbo_uniform_bits": round(float(uniform_mean), 5),
        "elbo_uniform_se": round(float(uniform_se), 5),
        "masking_tight": bool(abs(masking_mean - nll) < 3 * masking_se),
        "uniform_bound_ok": bool(uniform_mean >= nll - 3 * uniform_se),
        "uniform_tight": bool(abs(uniform_mean - nll) < 3 * uniform_se),
    }
    if exact:
        exact_bits = exact_elbo_bits(p_np, table, masking, uniform)
        result["elbo_masking_exact_bits"] = round(exact_bits["masking"], 6)
        result["elbo_uniform_exact_bits"] = round(exact_bits["uniform"], 6)
    result["wall_s"] = round(time.perf_counter() - start, 2)
    return result
