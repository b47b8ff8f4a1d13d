"""The scorers' small contracts: the AR scorer against per-prefix causal passes, the trajectory scorer's argument
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
