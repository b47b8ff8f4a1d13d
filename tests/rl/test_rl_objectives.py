"""The RL objectives on an enumerable toy: a prompt token and a 2-token completion over an 8-token vocabulary, a known
reward table, the policy's exact expected reward by enumerating all 64 completions."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hackable_diffusion.diffusion import objectives as O
from hackable_diffusion.diffusion.processes import MaskingProcess
from hackable_diffusion.diffusion.schedules import LinearSchedule
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.rl import objectives as rl
from hackable_diffusion.rl.advantages import group_advantages
from hackable_diffusion.rl.scorers import AutoregressiveScorer, MeanFieldScorer

V, MASK, PROMPT = 8, 3, 4
COMPLETIONS = np.array(list(itertools.product(range(V), repeat=2)), np.int32)  # (64, 2)
ROWS = np.concatenate([np.full((64, 1), PROMPT, np.int32), COMPLETIONS], axis=1)
COMPLETION = np.array([False, True, True])


def reward_table(completions):
    c = np.asarray(completions)
    # The optimum is (5, 5), reward 1. (With relative positions alone, the tiny bidirectional model barely tells its two
    # masked positions apart, so a table that wants different tokens there would test the model, not the objective.)
    return (0.5 * (c[:, 0] == 5) + 0.5 * (c[:, 1] == 5)).astype(np.float32)


def tiny(seed=0):
    shape = dict(presets.tiny(vocab_size=V, moe=False), sliding_window=8)
    model = T.Transformer(TransformerConfig.from_dict(shape))
    return model, T.init_params(model, jax.random.key(seed))


def sequence_log_probs(scorer, params):
    """log pi(x) of all 64 completions (sums over the completion); exact for both scorers."""
    n = len(ROWS)
    logp, _, _ = scorer(params, jnp.asarray(ROWS), jnp.broadcast_to(COMPLETION, (n, 3)), jnp.zeros((n, 3), bool))
    return jnp.sum(logp, axis=-1)


def expected_reward(scorer, params):
    return float(jnp.sum(jnp.exp(sequence_log_probs(scorer, params)) * reward_table(COMPLETIONS)))


def make_batch(scorer, params, key, group_size=16, groups=2):
    probs = jnp.exp(sequence_log_probs(scorer, params))
    picks = np.asarray(jax.random.choice(key, 64, (groups * group_size,), p=probs / probs.sum()))
    tokens = ROWS[picks]
    rewards = reward_table(COMPLETIONS[picks])
    adv, valid = group_advantages(rewards.reshape(groups, group_size))
    n = len(tokens)
    completion = np.broadcast_to(COMPLETION, (n, 3))
    old, _, _ = scorer(params, jnp.asarray(tokens), jnp.asarray(completion), jnp.zeros((n, 3), bool))
    zeros = np.zeros((n,), np.float32)
    return {
        "tokens": jnp.asarray(tokens),
        "completion": jnp.asarray(completion),
        "prompt_masked": jnp.zeros((n, 3), bool),
        "advantages": jnp.asarray(adv.reshape(-1)),
        "valid": jnp.asarray(np.repeat(valid, group_size).astype(np.float32)),
        "old_log_probs": old,
        "ref_log_probs": old,
        "rewards": jnp.asarray(rewards),
        "solved": jnp.asarray((rewards >= 1).astype(np.float32)),
        "rollout_seconds": jnp.asarray(zeros),
        "has_reference": jnp.asarray(np.ones((n,), np.float32)),
        "update_seconds": jnp.asarray(zeros),
    }


def build(name, model):
    mean_field = MeanFieldScorer(model, MASK)
    if name == "diffu_grpo":
        return rl.DiffuGRPO(mean_field)
    if name == "wd1":
        return rl.WD1(mean_field, group_size=16)
    if name == "elbo":
        process = MaskingProcess(vocab_size=V, schedule=LinearSchedule(), mask_id=MASK)
        return rl.ElboPolicyGradient(O.DiffusionPretrainObjective(model, process), mean_field, draws=4)
    if name == "ar_grpo":
        return rl.ArGRPO(AutoregressiveScorer(model))
    raise ValueError(name)


@pytest.mark.parametrize("name", ["diffu_grpo", "wd1", "elbo", "ar_grpo"])
def test_every_objective_raises_the_expected_reward_to_the_optimum(name):
    model, params = tiny()
    objective = build(name, model)
    scorer = objective.scorer
    before = expected_reward(scorer, params)
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init(params)
    grad_fn = jax.jit(jax.grad(lambda p, b, k: objective(p, b, k)[0]))
    for step in range(60):
        batch = make_batch(scorer, params, jax.random.key(1000 + step))
        grads = grad_fn(params, batch, jax.random.key(step))
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    after = expected_reward(scorer, params)
    assert before < 0.3, before  # a random policy: 1/8 of its mass on 5 at each position
    assert after > 0.9, (name, before, after)  # the optimum is 1.0 (always (5, 5))


@pytest.mark.parametrize("normalization", ["paper", "row_mean"])
def test_ar_grpo_gradient_equals_reinforce_by_enumeration(normalization):
    """On-policy (ratio 1), no KL: d1's GRPO gradient is -sum_i A_i grad log pi(o_i) / sum_i |o_i| (every row's
    tokens counted), the per-row mean's -mean_i over every row of A_i / |o_i| grad log pi(o_i); log pi(o_i) here
    comes from separate forward passes over each prefix (no shifted logits), summed by hand."""
    model, params = tiny(seed=3)
    objective = rl.ArGRPO(AutoregressiveScorer(model), normalization=normalization)
    batch = make_batch(objective.scorer, params, jax.random.key(7), group_size=8, groups=2)

    def log_pi(p, row):
        total = 0.0
        for t in (1, 2):  # completion positions: predict row[t] from row[:t]
            logits, _ = T.forward(model, p, row[None, :t], causal=True)
            total = total + jax.nn.log_softmax(logits[0, -1].astype(jnp.float32))[row[t]]
        return total

    def reinforce(p):
        terms = [
            batch["advantages"][i] * batch["valid"][i] * log_pi(p, batch["tokens"][i]) / 2.0
            for i in range(len(batch["tokens"]))
        ]
        # every row has |o_i| = 2 completion tokens, so d1's token count is 2 x the rows, and the per-row mean over
        # every row (a tied group's too) is the same sum
        return -sum(terms) / len(batch["tokens"])

    expected = jax.grad(reinforce)(params)
    got = jax.grad(lambda p: objective(p, batch, jax.random.key(0))[0])(params)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=1e-6)
    assert any(float(jnp.abs(x).max()) > 0 for x in jax.tree.leaves(got))


def test_one_step_estimator_without_prompt_masking_equals_masked_log_probs():
    model, params = tiny(seed=1)
    rng = np.random.default_rng(0)
    tokens = rng.integers(4, V, (4, 6)).astype(np.int32)
    completion = rng.random((4, 6)) < 0.5
    completion[:, 0] = True
    scorer = MeanFieldScorer(model, MASK)
    got, entropy, _ = scorer(params, jnp.asarray(tokens), jnp.asarray(completion), jnp.zeros((4, 6), bool))
    noisy = np.where(completion, MASK, tokens)
    logits, _ = T.forward(model, params, jnp.asarray(noisy), causal=False)
    logits = np.asarray(logits, np.float64)
    keep = np.arange(V) != MASK  # the mask token is never a clean token: renormalise over the others
    z = np.log(np.exp(logits[..., keep]).sum(-1))
    direct = np.take_along_axis(logits, tokens[..., None], -1)[..., 0] - z
    np.testing.assert_allclose(np.asarray(got), np.where(completion, direct, 0.0), rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(entropy)[completion] > 0) and np.all(np.asarray(entropy)[~completion] == 0)


def test_prompt_masking_changes_the_estimate():
    model, params = tiny(seed=1)
    tokens = jnp.asarray(np.tile(np.array([[4, 5, 6, 7, 4, 5]], np.int32), (2, 1)))
    completion = jnp.asarray(np.array([[False, False, False, True, True, True]] * 2))
    scorer = MeanFieldScorer(model, MASK)
    plain, _, _ = scorer(params, tokens, completion, jnp.zeros((2, 6), bool))
    masked, _, _ = scorer(params, tokens, completion, ~completion)
    assert not np.allclose(np.asarray(plain), np.asarray(masked))


def test_wd1_weights_sum_per_group_and_vanish_on_ties():
    objective = rl.WD1(scorer=None, group_size=4, negative_weight=1.0)
    adv = jnp.asarray([1.0, -1.0, 0.5, -0.5, 0.0, 0.0, 0.0, 0.0])
    valid = jnp.asarray([1.0] * 4 + [0.0] * 4)
    w = np.asarray(objective.weights(adv, valid))
    assert abs(w[:4].sum()) < 1e-6  # (sum of w+) - (sum of w-) = 1 - 1
    assert w[0] > 0 > w[1]
    np.testing.assert_array_equal(w[4:], 0.0)


def test_k3_kl_is_zero_at_the_reference_and_positive_elsewhere():
    lp = jnp.asarray([[-1.0, -2.0]])
    assert float(jnp.abs(rl.k3_kl(lp, lp)).max()) == 0.0
    assert float(rl.k3_kl(lp, lp + 0.3).min()) > 0.0


def expert_batch(scorer, params, key):
    """Half the rows the policy's own samples (rewards mostly below 1), half the expert's: an exact search over the
    64 completions returns the optimum (5, 5), which the checker accepts."""
    batch = make_batch(scorer, params, key, group_size=16, groups=2)
    n = len(batch["tokens"])
    tokens = np.asarray(batch["tokens"]).copy()
    tokens[n // 2 :, 1:] = 5
    rewards = reward_table(tokens[:, 1:])
    return {**batch, "tokens": jnp.asarray(tokens), "rewards": jnp.asarray(rewards),
            "solved": jnp.asarray((rewards >= 1).astype(np.float32))}  # fmt: skip


def build_expert_iteration(likelihood, model):
    if likelihood == "elbo":
        process = MaskingProcess(vocab_size=V, schedule=LinearSchedule(), mask_id=MASK)
        return rl.ExpertIteration(MeanFieldScorer(model, MASK), O.DiffusionPretrainObjective(model, process), draws=2)
    return rl.ExpertIteration(AutoregressiveScorer(model))


@pytest.mark.parametrize("likelihood", ["elbo", "ar"])
def test_expert_iteration_moves_the_policy_to_the_searched_optimum(likelihood):
    model, params = tiny()
    objective = build_expert_iteration(likelihood, model)
    before = expected_reward(objective.scorer, params)
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init(params)
    grad_fn = jax.jit(jax.grad(lambda p, b, k: objective(p, b, k)[0]))
    for step in range(40):
        batch = expert_batch(objective.scorer, params, jax.random.key(1000 + step))
        updates, opt_state = optimizer.update(grad_fn(params, batch, jax.random.key(step)), opt_state, params)
        params = optax.apply_updates(params, updates)
    after = expected_reward(objective.scorer, params)
    assert before < 0.3 and after > 0.9, (likelihood, before, after)


@pytest.mark.parametrize("likelihood", ["elbo", "ar"])
def test_expert_iteration_learns_from_accepted_rows_only(likelihood):
    """Rows the checker rejects carry no weight: rewriting their tokens leaves the gradient unchanged; with no
    accepted row the gradient is zero."""
    model, params = tiny(seed=2)
    objective = build_expert_iteration(likelihood, model)
    batch = expert_batch(objective.scorer, params, jax.random.key(3))
    rejected = np.asarray(batch["solved"]) == 0
    assert rejected.any() and not rejected.all()
    other = np.asarray(batch["tokens"]).copy()
    other[rejected, 1:] = (other[rejected, 1:] + 1) % V
    grad = jax.jit(jax.grad(lambda p, b: objective(p, b, jax.random.key(5))[0]))
    a = grad(params, batch)
    b = grad(params, {**batch, "tokens": jnp.asarray(other)})
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-7)
    assert any(float(jnp.abs(x).max()) > 0 for x in jax.tree.leaves(a))
    none = grad(params, {**batch, "solved": jnp.zeros_like(batch["solved"])})
    assert all(float(jnp.abs(x).max()) == 0 for x in jax.tree.leaves(none))


def test_expert_iteration_with_the_ar_scorer_is_the_exact_nll_of_the_accepted_rows():
    model, params = tiny(seed=4)
    objective = build_expert_iteration("ar", model)
    batch = expert_batch(objective.scorer, params, jax.random.key(9))
    loss, metrics = objective(params, batch, jax.random.key(0))
    log_probs, _, _ = objective.scorer(params, batch["tokens"], batch["completion"], batch["prompt_masked"])
    accepted = np.asarray(batch["solved"]) > 0
    expected = -np.asarray(log_probs)[accepted][:, 1:].mean()
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    assert float(metrics["accepted_rows"]) == accepted.mean()


def test_the_expert_iteration_recipe_is_a_valid_rl_config():
    from hackable_diffusion import cli
    from hackable_diffusion.rl import command

    c = cli.load_config_file("configs/rl_sudoku.py:expert_iteration")
    command.check_rl_config(c, autoregressive=False)
    assert c.rl.objective == "expert_iteration" and c.rl.group_size == 1 and c.rl.kl_beta == 0
    assert c.solver.search and c.solver.search_paced and c.solver.parallel_attempts == 4 and c.solver.pass_budget == 12
    assert c.train.num_steps % c.rl.inner_updates == 0  # whole rollouts
