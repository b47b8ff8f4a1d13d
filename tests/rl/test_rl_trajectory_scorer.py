"""RL's trajectory scorer (TraceRL): each completion token scored from the canvas at the sampler pass that wrote it;
checked against forward passes made by hand, against the mean-field estimate it generalises, and against the
frequencies of the toolbox's own sampler on an enumerable toy (a fixed token and two free ones over 8 tokens)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hackable_diffusion.diffusion.processes import MaskingProcess
from hackable_diffusion.diffusion.schedules import LinearSchedule
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.rl.scorers import MeanFieldScorer, TrajectoryScorer
from hackable_diffusion.sampling.canvas import commit_passes, denoise_canvas
from hackable_diffusion.sampling.early_stopping import NoEarlyStop
from hackable_diffusion.sampling.sampler import DiffusionSampler
from hackable_diffusion.sampling.scores import Margin
from hackable_diffusion.sampling.selection import TopK
from hackable_diffusion.sampling.temperature import ConstantTemperature

V, MASK, PROMPT = 8, 3, 4


def tiny(seed=0):
    shape = dict(presets.tiny(vocab_size=V, moe=False), sliding_window=8)
    model = T.Transformer(TransformerConfig.from_dict(shape))
    return model, T.init_params(model, jax.random.key(seed))


def direct_log_probs(model, params, tokens, completion, commit_pass, passes_per_forward=1):
    """Each completion token's log-prob from a separate bidirectional pass over the canvas before its pass group."""
    out = np.zeros(tokens.shape)
    keep = np.arange(V) != MASK
    group = np.where(completion, commit_pass // passes_per_forward, -1)
    for i, j in zip(*np.nonzero(completion)):
        canvas = np.where(completion[i] & (group[i] >= group[i, j]), MASK, tokens[i])
        logits, _ = T.forward(model, params, jnp.asarray(canvas[None]), causal=False)
        logits = np.asarray(logits[0, j], np.float64)[keep]
        out[i, j] = logits[list(np.nonzero(keep)[0]).index(tokens[i, j])] - np.log(np.exp(logits).sum())
    return out


@pytest.mark.parametrize("passes_per_forward", [1, 2])
def test_each_token_is_scored_from_the_canvas_at_its_pass(passes_per_forward):
    model, params = tiny(seed=1)
    rng = np.random.default_rng(0)
    tokens = rng.integers(4, V, (3, 6)).astype(np.int32)
    completion = np.zeros((3, 6), bool)
    completion[:, 2:] = True
    commit_pass = np.stack([rng.permutation(4) for _ in range(3)]).astype(np.int32)  # one token per pass
    commit_pass = np.concatenate([np.full((3, 2), -1, np.int32), commit_pass], axis=1)
    scorer = TrajectoryScorer(model, MASK, num_passes=4, passes_per_forward=passes_per_forward)
    got, entropy, _ = scorer(
        params, jnp.asarray(tokens), jnp.asarray(completion), jnp.zeros((3, 6), bool), jnp.asarray(commit_pass)
    )
    expected = direct_log_probs(model, params, tokens, completion, commit_pass, passes_per_forward)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(entropy)[completion] > 0) and np.all(np.asarray(entropy)[~completion] == 0)


def test_one_forward_for_all_passes_is_the_mean_field_estimate():
    model, params = tiny(seed=2)
    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(4, V, (4, 6)).astype(np.int32))
    completion = jnp.asarray(rng.random((4, 6)) < 0.6)
    commit_pass = jnp.asarray(rng.integers(0, 3, (4, 6)).astype(np.int32))
    masked = jnp.asarray(rng.random((4, 6)) < 0.2) & ~completion
    one = TrajectoryScorer(model, MASK, num_passes=3, passes_per_forward=3)(
        params, tokens, completion, masked, commit_pass
    )
    mean_field = MeanFieldScorer(model, MASK)(params, tokens, completion, jnp.zeros_like(masked))  # prompt never masked
    for a, b in zip(one[:2], mean_field[:2]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
    several = TrajectoryScorer(model, MASK, num_passes=3)(params, tokens, completion, masked, commit_pass)
    assert not np.allclose(np.asarray(several[0]), np.asarray(one[0]))  # later passes see earlier tokens


def test_the_scores_are_the_samplers_probabilities():
    """A margin rule writes one token per pass at temperature 1: its order is a function of the canvas, so the
    probability of a completion is the product of its tokens' log-probs at their passes. 16,384 draws of the toolbox's
    sampler against those probabilities (and against the mean-field estimate, which is not the sampler's)."""
    model, params = tiny(seed=4)
    params = jax.tree.map(lambda x: 3.0 * x, params)  # sharper conditionals, so the two estimates differ
    sampler = DiffusionSampler(
        MaskingProcess(V, LinearSchedule(), MASK),
        selection=TopK(score=Margin()),
        temperature=ConstantTemperature(1.0),
        early_stopping=NoEarlyStop(),
        num_steps=2,
        canvas_length=3,
        self_conditioning=False,
    )
    n = 16_384
    fixed = jnp.asarray(np.tile([True, False, False], (n, 1)))
    start = jnp.asarray(np.tile([PROMPT, MASK, MASK], (n, 1)).astype(np.int32))
    result = denoise_canvas(
        model, params, init_cache(model.cfg, n, 1), start, 0, sampler=sampler, fixed=fixed, return_trajectory=True
    )
    canvas = np.asarray(result.canvas)
    order = commit_passes(np.asarray(result.trajectory), np.asarray(fixed), MASK)
    assert np.all(np.sort(order[:, 1:], axis=1) == [0, 1])  # one token per pass, the fixed one never written
    completion = jnp.asarray(~np.asarray(fixed))
    scorer = jax.jit(lambda *rows: TrajectoryScorer(model, MASK, num_passes=2)(params, *rows)[0])
    log_p = np.asarray(scorer(jnp.asarray(canvas), completion, jnp.zeros((n, 3), bool), jnp.asarray(order)))
    mean_field = MeanFieldScorer(model, MASK)(params, jnp.asarray(canvas), completion, jnp.zeros((n, 3), bool))[0]

    keys = canvas[:, 1] * V + canvas[:, 2]
    counts = np.bincount(keys, minlength=V * V) / n
    predicted, predicted_mean_field = np.zeros(V * V), np.zeros(V * V)
    predicted[keys] = np.exp(log_p.sum(-1))
    predicted_mean_field[keys] = np.exp(np.asarray(mean_field).sum(-1))
    assert set(np.nonzero(counts)[0]) <= {
        a * V + b for a, b in itertools.product(range(V), repeat=2) if MASK not in (a, b)
    }
    seen = counts > 0
    noise = np.sqrt(predicted[seen] * (1 - predicted[seen]) / n)
    z = (counts[seen] - predicted[seen]) / noise
    assert np.mean(z**2) < 2.0, np.mean(z**2)  # ~1 when the counts are draws of the predicted probabilities
    assert predicted.sum() > 0.99  # the draws cover nearly all of the predicted mass
    z_mean_field = (counts[seen] - predicted_mean_field[seen]) / noise
    assert np.mean(z_mean_field**2) > 2.0 * np.mean(z**2), (np.mean(z_mean_field**2), np.mean(z**2))
