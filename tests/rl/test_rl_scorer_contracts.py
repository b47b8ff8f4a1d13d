"""The scorers' small contracts: the AR scorer against per-prefix causal passes, every scorer over the rollouts' support, the trajectory scorer's argument
checks and its declared need for commit passes, and both frozen (a scorer is a static argument of jitted code)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.rl.scorers import AutoregressiveScorer, MeanFieldScorer, TrajectoryScorer

V, MASK = 8, 3


def tiny(seed=0):
    shape = dict(presets.tiny(vocab_size=V, moe=False), sliding_window=8)
    model = T.Transformer(TransformerConfig.from_dict(shape))
    return model, T.init_params(model, jax.random.key(seed))


def prefix_log_prob(model, params, tokens, t):
    """log p(tokens[t] | tokens[:t]) from a causal pass over the prefix alone: no later token can be seen."""
    logits, _ = T.forward(model, params, jnp.asarray(tokens[None, :t]), causal=True)
    last = np.asarray(logits[0, -1], np.float64)
    return last[tokens[t]] - np.log(np.exp(last).sum())


def test_the_ar_scorer_is_the_chain_rule_over_prefixes():
    model, params = tiny(seed=2)
    rng = np.random.default_rng(0)
    tokens = rng.integers(4, V, (2, 6)).astype(np.int32)
    completion = np.array([[True, True, True, False, True, False], [False, False, True, True, True, True]])
    got, entropy, _ = AutoregressiveScorer(model)(params, jnp.asarray(tokens), jnp.asarray(completion), None)
    got = np.asarray(got)
    expected = np.zeros(tokens.shape)
    for i, t in zip(*np.nonzero(completion)):
        if t > 0:  # position 0 has no prefix: never scored
            expected[i, t] = prefix_log_prob(model, params, tokens[i], t)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    scored = completion & (np.arange(6) > 0)
    assert np.all(np.asarray(entropy)[scored] > 0) and np.all(np.asarray(entropy)[~scored] == 0)


def restricted_log_prob(logits, token, removed):
    """log p(token) when the ids `removed` are out of the support: the softmax over the other ids alone."""
    logits = np.asarray(logits, np.float64)
    kept = np.setdiff1d(np.arange(len(logits)), removed)
    return logits[token] - np.log(np.exp(logits[kept]).sum())


def restricted_entropy(logits, removed):
    logits = np.asarray(logits, np.float64)
    kept = np.setdiff1d(np.arange(len(logits)), removed)
    p = np.exp(logits[kept] - logits[kept].max())
    p /= p.sum()
    return float(-(p * np.log(p)).sum())


def test_every_scorer_scores_over_the_support_the_rollouts_drew_from():
    """With `forbidden_tokens`, a scored log-prob is the token's probability among the ids the sampler could draw
    (an independent softmax over the kept ids), the entropy is over them too, and the gradient stays finite where a
    forbidden id stands in an unscored position."""
    model, params = tiny(seed=3)
    forbidden = (4, 5)
    tokens = np.array([[2, 4, 6, 7, 6, 7], [2, 5, 7, 6, 6, 7]], np.int32)  # forbidden ids only in the prompt
    completion = np.zeros(tokens.shape, bool)
    completion[:, 2:] = True
    got, entropy, _ = AutoregressiveScorer(model, forbidden_tokens=forbidden)(
        params, jnp.asarray(tokens), jnp.asarray(completion), None
    )
    for i, t in zip(*np.nonzero(completion)):
        logits, _ = T.forward(model, params, jnp.asarray(tokens[None, i, :t]), causal=True)
        expected = restricted_log_prob(logits[0, -1], tokens[i, t], forbidden)
        np.testing.assert_allclose(np.asarray(got)[i, t], expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(entropy)[i, t], restricted_entropy(logits[0, -1], forbidden), rtol=1e-5)
    plain, _, _ = AutoregressiveScorer(model)(params, jnp.asarray(tokens), jnp.asarray(completion), None)
    assert np.all(np.asarray(got)[completion] > np.asarray(plain)[completion])  # less mass shared: higher log-probs

    masked_input = np.where(completion, MASK, tokens)
    logits, _ = T.forward(model, params, jnp.asarray(masked_input), causal=False)
    for scorer in (
        MeanFieldScorer(model, MASK, forbidden_tokens=forbidden),
        TrajectoryScorer(model, MASK, num_passes=1, forbidden_tokens=forbidden),  # one pass: the same masked canvas
    ):
        commit = np.where(completion, 0, -1).astype(np.int32)
        got, _, _ = scorer(params, jnp.asarray(tokens), jnp.asarray(completion), jnp.zeros_like(completion), commit)
        for i, t in zip(*np.nonzero(completion)):
            expected = restricted_log_prob(logits[i, t], tokens[i, t], (MASK, *forbidden))
            np.testing.assert_allclose(np.asarray(got)[i, t], expected, rtol=1e-5, atol=1e-5)

    def total(p):
        scored, _, _ = AutoregressiveScorer(model, forbidden_tokens=forbidden)(
            p, jnp.asarray(tokens), jnp.asarray(completion), None
        )
        return scored.sum()

    grads = jax.grad(total)(params)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(grads))

    def total_entropy(p):  # an entropy bonus differentiates this: the removed ids' -inf must not reach the backward
        _, spread, _ = MeanFieldScorer(model, MASK, forbidden_tokens=forbidden)(
            p, jnp.asarray(tokens), jnp.asarray(completion), jnp.zeros_like(completion)
        )
        return spread.sum()

    grads = jax.grad(total_entropy)(params)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(grads))


def test_the_mean_field_scorer_masks_the_prompt_positions_it_is_given():
    """d1's random prompt masking: the one pass sees the completion AND the marked prompt positions masked; only the
    completion is scored."""
    model, params = tiny(seed=4)
    tokens = np.array([[2, 6, 7, 6, 4, 5], [2, 7, 7, 6, 5, 4]], np.int32)
    completion = np.zeros(tokens.shape, bool)
    completion[:, 4:] = True
    prompt_masked = np.zeros(tokens.shape, bool)
    prompt_masked[0, 1], prompt_masked[1, 2] = True, True
    got, _, _ = MeanFieldScorer(model, MASK)(params, jnp.asarray(tokens), jnp.asarray(completion), prompt_masked)
    logits, _ = T.forward(model, params, jnp.asarray(np.where(completion | prompt_masked, MASK, tokens)), causal=False)
    for i, t in zip(*np.nonzero(completion)):
        expected = restricted_log_prob(logits[i, t], tokens[i, t], (MASK,))
        np.testing.assert_allclose(np.asarray(got)[i, t], expected, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(got)[~completion] == 0)


def test_the_trajectory_scorer_checks_its_pass_counts():
    model, _ = tiny()
    TrajectoryScorer(model, MASK, num_passes=1)  # one pass is a valid sampler
    for num_passes, per_forward in [(0, 1), (1, 0), (-1, 1)]:
        with pytest.raises(ValueError, match="trajectory scorer needs num_passes"):
            TrajectoryScorer(model, MASK, num_passes=num_passes, passes_per_forward=per_forward)
    assert TrajectoryScorer(model, MASK, num_passes=5, passes_per_forward=2).num_forwards == 3


def test_only_the_trajectory_scorer_asks_rollouts_for_commit_passes():
    model, _ = tiny()
    assert TrajectoryScorer(model, MASK, num_passes=2).needs_commit_pass is True
    assert not getattr(MeanFieldScorer(model, MASK), "needs_commit_pass", False)
    assert not getattr(AutoregressiveScorer(model), "needs_commit_pass", False)


@pytest.mark.parametrize("make", [
    lambda m: MeanFieldScorer(m, MASK), lambda m: TrajectoryScorer(m, MASK, num_passes=2), AutoregressiveScorer,
])  # fmt: skip
def test_scorers_are_frozen_and_hashable(make):
    model, _ = tiny()
    scorer = make(model)
    hash(scorer)
    with pytest.raises(dataclasses.FrozenInstanceError):
        scorer.model = None
