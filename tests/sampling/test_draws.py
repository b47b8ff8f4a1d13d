"""Candidate draws (`sampling/draws.py`): the blocked inverse CDF is the categorical distribution (frequencies against
the probabilities, forbidden and zero-mass ids never drawn, vocabularies the block does not divide), it equals a flat
inverse CDF given the same uniforms, and a sampler using it decodes like the Gumbel-max one in distribution."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion.diffusion.processes import UniformProcess
from hackable_diffusion.diffusion.schedules import LinearSchedule
from hackable_diffusion.sampling import draws as D
from hackable_diffusion.sampling.sampler import DiffusionSampler
from hackable_diffusion.sampling.scores import NEG_LOGIT


def frequencies(draw, logits, draws_per_row=4000):
    """Empirical frequencies of `draw` over many rows that share the (1, c, v) logits, one key per row."""
    rows = jnp.broadcast_to(logits, (draws_per_row, *logits.shape[1:]))
    keys = jax.random.split(jax.random.key(11), draws_per_row)
    ids = np.asarray(jax.jit(draw)(keys, rows))
    v = logits.shape[-1]
    return np.stack([np.bincount(ids[:, j], minlength=v) / draws_per_row for j in range(logits.shape[1])])


@pytest.mark.parametrize("block", [1, 3, 4, 128])
def test_blocked_inverse_cdf_draws_the_categorical(block):
    """Frequencies within 4.5 standard errors of softmax(logits) at every id; ids of -1e30 logits never appear; 10
    ids with a block of 3 or 4 leaves a padded last block; a block larger than the vocabulary is one block."""
    probs = np.array(
        [[0.3, 0.0, 0.2, 0.05, 0.05, 0.1, 0.0, 0.15, 0.1, 0.05], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.2, 0.8]]
    )
    logits = jnp.asarray(np.where(probs > 0, np.log(np.maximum(probs, 1e-30)), NEG_LOGIT)[None], jnp.float32)
    seen = frequencies(D.BlockedInverseCdf(block), logits)
    n = 4000
    se = np.sqrt(probs * (1 - probs) / n) + 1e-12
    assert np.all(np.abs(seen - probs) <= 4.5 * se + 1e-9), (seen, probs)
    assert np.all(seen[probs == 0] == 0)
    reference = frequencies(D.GumbelMax(), logits)  # the reference's draw: the same distribution
    assert np.all(np.abs(seen - reference) <= 6.5 * se + 1e-9)


def flat_inverse_cdf(logits, u):
    """The slow reference: one cumulative sum over the whole vocabulary, first id whose CDF exceeds u x total."""
    w = np.exp(logits - logits.max(-1, keepdims=True))
    cdf = np.cumsum(w, -1)
    return np.minimum((cdf <= u[..., None] * cdf[..., -1:]).sum(-1), w.shape[-1] - 1)


def test_blocked_inverse_cdf_equals_a_flat_inverse_cdf_given_the_same_uniforms():
    """Dyadic probabilities (exact in float32 sums) make the two-level draw and the flat one the same function of the
    uniforms: the block's draw uses u0, the id inside it u1, which is u = (F(block start) + u1 mass) / total."""
    rng = np.random.default_rng(0)
    v, g = 64, 8
    weights = rng.integers(0, 5, size=(3, 5, v)).astype(np.float64)  # small integers: sums are exact
    weights[..., 7] = 1.0  # no all-zero row
    logits = np.where(weights > 0, np.log(np.maximum(weights, 1e-300)), NEG_LOGIT).astype(np.float32)
    keys = jax.random.split(jax.random.key(5), 3)
    drawn = np.asarray(D.BlockedInverseCdf(g)(keys, jnp.asarray(logits)))
    u = np.asarray(jax.vmap(lambda k: jax.random.uniform(k, (5, 2)))(keys), np.float64)
    w = np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True)).reshape(3, 5, v // g, g)
    mass = w.sum(-1)
    block_cdf = np.cumsum(mass, -1)
    start = np.take_along_axis(
        np.concatenate([np.zeros_like(mass[..., :1]), block_cdf[..., :-1]], -1), drawn[..., None] // g, -1
    )[..., 0]
    chosen_mass = np.take_along_axis(mass, drawn[..., None] // g, -1)[..., 0]
    combined = (start + u[..., 1] * chosen_mass) / block_cdf[..., -1]
    np.testing.assert_array_equal(drawn, flat_inverse_cdf(logits.astype(np.float64), combined))
    assert np.all(weights.reshape(-1, v)[np.arange(15), drawn.reshape(-1)] > 0)


def test_blocked_inverse_cdf_is_per_row_deterministic_and_checks_its_block():
    logits = jax.random.normal(jax.random.key(0), (3, 6, 50))
    keys = jax.random.split(jax.random.key(1), 3)
    draw = D.BlockedInverseCdf(16)
    both = np.asarray(draw(keys, logits))
    np.testing.assert_array_equal(both, np.asarray(draw(keys, logits)))
    np.testing.assert_array_equal(both[1:2], np.asarray(draw(keys[1:2], logits[1:2])))  # a row alone = in a batch
    with pytest.raises(ValueError, match="block must be an int >= 1"):
        D.BlockedInverseCdf(0)
    with pytest.raises(ValueError, match="unknown sampler draw 'gumbel'.*blocked_inverse_cdf"):
        D.make_draw("gumbel")
    with pytest.raises(ValueError, match="DiffusionSampler.draw must be"):
        DiffusionSampler(process=UniformProcess(50, LinearSchedule()), draw="blocked_inverse_cdf")


def test_gumbel_max_is_the_reference_categorical():
    """The default draw is exactly `jax.random.categorical` with the row's key, so seeded outputs are unchanged."""
    logits = jax.random.normal(jax.random.key(2), (2, 5, 40))
    keys = jax.random.split(jax.random.key(3), 2)
    expected = np.stack([np.asarray(jax.random.categorical(keys[i], logits[i], axis=-1)) for i in range(2)])
    np.testing.assert_array_equal(np.asarray(D.GumbelMax()(keys, logits)), expected)


@pytest.mark.slow
def test_a_sampler_with_the_blocked_draw_generates_the_same_distribution(model_and_params):
    """One-step canvases (every position takes its candidate) from the same starting canvases: the blocked draw's
    token frequencies at each position match Gumbel-max's within 6 standard errors; a row alone equals it in a batch."""
    from _tiny_sampling import VOCAB

    from hackable_diffusion.data.tokenizers import BOS_ID
    from hackable_diffusion.sampling.generate import generate
    from hackable_diffusion.sampling.keys import row_keys

    model, params = model_and_params
    rows = 1500
    prompts = np.array([[BOS_ID, 5, 6, 7]] * rows, np.int32)
    base = DiffusionSampler.diffusiongemma(VOCAB, num_steps=1, canvas_length=4)
    out = {}
    for name in ("gumbel_max", "blocked_inverse_cdf"):
        sampler = base.replace(draw=D.make_draw(name, **({"block": 16} if name != "gumbel_max" else {})))
        out[name] = generate(model, params, prompts, sampler=sampler, key=3, max_new_tokens=4, stop_tokens=()).tokens
    for j in range(4):
        p = np.bincount(out["gumbel_max"][:, j], minlength=VOCAB) / rows
        q = np.bincount(out["blocked_inverse_cdf"][:, j], minlength=VOCAB) / rows
        se = np.sqrt((p * (1 - p) + q * (1 - q)) / rows) + 1e-12
        assert np.all(np.abs(p - q) <= 6 * se + 1e-9), j
        assert (p > 0.02).sum() >= 3  # a spread distribution, not a point mass the test would trivially pass on
    blocked = base.replace(draw=D.BlockedInverseCdf(16))
    alone = generate(
        model,
        params,
        prompts[5:6],
        sampler=blocked,
        key=row_keys(3, rows)[5:6],
        max_new_tokens=4,
        stop_tokens=(),
    )
    np.testing.assert_array_equal(alone.tokens[0], out["blocked_inverse_cdf"][5])
