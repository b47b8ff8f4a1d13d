"""Every RL objective against its paper's equation or its reference code's normalisation (named for each), transcribed
here in NumPy (not from the toolbox's code).

The batch is tiny and fixed: K = 3 prompts x G = 4 completions (the third group tied), rows of one prompt position and
five completion positions, completions of different lengths (the positions after a row's EOS are not part of it, and
the table scorer below gives them log-probs anyway, so an objective that counted them would be caught). The per-token
log-probs are the parameters themselves (`TableScorer`), so jax.grad of an objective w.r.t. them is its gradient
w.r.t. the per-token log-probs, checked against the closed form. Off-policy: the old log-probs differ from the
current ones by up to +-0.6 nats (mu >= 2), and by -0.5 at one token of every row with A < 0, so the ratio's
clip fires on both sides.

Equations (A_i = r_i - mean of the group, d1 and wd1; N = the batch's completion tokens; l, o, ref: current, old and
reference log-probs of token t of row i; rho = exp(l - o)):

* diffu-GRPO (d1) and AR GRPO, as d1's reference code normalises (its TRL-derived trainer: the masked per-token loss
  summed over the batch, divided by the completion-token count; d1's paper writes GRPO's per-row 1/|o_i| mean):
  L = (1/N) sum_{i,t} [-min(rho A_i, clip(rho, 1-eps, 1+eps) A_i) + beta k3],
  k3 = exp(ref - l) - (ref - l) - 1; dL/dl_it = (1/N) [-A_i rho_it [unclipped branch] + beta (1 - exp(ref - l))].
* GRPO as Shao et al. 2024 write it (`row_mean`): L = -(1/(K G)) sum_i (1/|o_i|) sum_t [min(...) - beta k3], every
  row (a tied group's with A = 0, its KL term kept).
* wd1, as its reference code computes it: L = (1/K) sum_groups sum_i -(w+_i - lambda w-_i) sum_t l_it, w+- = softmax
  over the group of +-psi A (a tied group: A = 0, so each of its rows weighs (1 - lambda) / G).
* ELBO policy gradient: L = mean over informative rows of A_i x (negative ELBO_i / |o_i|).
* expert iteration: L = mean over accepted rows of -(1/|o_i|) sum_t l_it.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _tiny_countdown import tiny_countdown_config
from _tiny_sudoku import tiny_sudoku_config

from hackable_diffusion import run_config
from hackable_diffusion.rl import settings as rl_settings
from hackable_diffusion.data.tokenizers import EOS_ID, PAD_ID
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.rl import command
from hackable_diffusion.rl import objectives as rl
from hackable_diffusion.rl.advantages import group_advantages
from hackable_diffusion.rl.scorers import AutoregressiveScorer, TrajectoryScorer
from hackable_diffusion.tasks.countdown.task import CountdownTask
from hackable_diffusion.tasks.countdown.vocab import VOCAB_SIZE
from hackable_diffusion.training import train_state

K, G, L = 3, 4, 6
EPS = 0.3  # neither the objectives' default clip (0.5) nor TRL's (0.2): an objective that ignored clip_eps fails
REWARDS = np.array([[1.0, 0.0, 0.0, 0.5], [0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
LENGTHS = np.array([5, 3, 2, 4, 1, 5, 3, 4, 2, 2, 5, 3])  # completion tokens per row, EOS included


def numpy_advantages(rewards):
    return (rewards - rewards.mean(axis=1, keepdims=True)).reshape(-1)


def fixed_batch(seed=0):
    rng = np.random.default_rng(seed)
    n = K * G
    completion = np.zeros((n, L), bool)
    for i, length in enumerate(LENGTHS):
        completion[i, 1 : 1 + length] = True
    logp = -rng.uniform(0.1, 3.0, (n, L))
    delta = rng.uniform(-0.6, 0.6, (n, L))
    delta = np.where(np.abs(np.abs(np.exp(delta) - 1) - EPS) < 0.02, 0.45, delta)  # no ratio on a clip boundary
    negative = numpy_advantages(REWARDS) < 0
    delta[negative, 1] = -0.5  # rho = 0.61 < 1 - EPS where A < 0: the lower clip fires too
    old = logp - delta
    ref = logp + rng.uniform(-0.5, 0.5, (n, L))
    valid = np.repeat(REWARDS.max(1) > REWARDS.min(1), G).astype(np.float32)
    rewards = REWARDS.reshape(-1).astype(np.float32)
    batch = {
        "tokens": jnp.zeros((n, L), jnp.int32),
        "completion": jnp.asarray(completion),
        "prompt_masked": jnp.zeros((n, L), bool),
        "advantages": jnp.asarray(numpy_advantages(REWARDS), jnp.float32),
        "valid": jnp.asarray(valid),
        "old_log_probs": jnp.asarray(old, jnp.float32),
        "ref_log_probs": jnp.asarray(ref, jnp.float32),
        "rewards": jnp.asarray(rewards),
        "solved": jnp.asarray((rewards >= 1).astype(np.float32)),
        "rollout_seconds": jnp.zeros((n,)),
        "update_seconds": jnp.zeros((n,)),
        "has_reference": jnp.ones((n,)),
    }
    return batch, logp


@dataclasses.dataclass(frozen=True)
class TableScorer:
    """The per-token log-probs are `params["logp"]`, returned as they are (positions outside the completion too)."""

    def __call__(self, params, tokens, completion, prompt_masked, commit_pass=None):
        return params["logp"], jnp.zeros_like(params["logp"]), {}


def loss_and_grad(objective, logp, batch):
    params = {"logp": jnp.asarray(logp, jnp.float32)}
    fn = lambda p: objective(p, batch, jax.random.key(0))[0]  # noqa: E731
    loss, grad = jax.value_and_grad(fn)(params)
    return float(loss), np.asarray(grad["logp"])


def d1_reference(logp, batch, beta):
    """(loss, dL/dl) of d1's objective with its reference code's normalisation (the sum over the batch's completion
    tokens divided by their count), not its paper's equation (GRPO's per-row 1/|o_i| mean, `row_mean` below)."""
    c = np.asarray(batch["completion"], np.float64)
    a = np.asarray(batch["advantages"], np.float64)[:, None]
    old, ref = np.asarray(batch["old_log_probs"], np.float64), np.asarray(batch["ref_log_probs"], np.float64)
    rho = np.exp(logp - old)
    unclipped, clipped = rho * a, np.clip(rho, 1 - EPS, 1 + EPS) * a
    k3 = np.exp(ref - logp) - (ref - logp) - 1
    n_tokens = c.sum()
    loss = np.sum((-np.minimum(unclipped, clipped) + beta * k3) * c) / n_tokens
    active = unclipped <= clipped  # the min picks the unclipped term: its gradient flows
    grad = (-a * rho * active + beta * (1 - np.exp(ref - logp))) * c / n_tokens
    return loss, grad


@pytest.mark.parametrize("beta", [0.0, 0.3])
@pytest.mark.parametrize("cls", [rl.DiffuGRPO, rl.ArGRPO])
def test_clipped_objectives_are_d1s_equation(cls, beta):
    batch, logp = fixed_batch()
    loss, grad = loss_and_grad(cls(TableScorer(), clip_eps=EPS, kl_beta=beta), logp, batch)
    want_loss, want_grad = d1_reference(logp, batch, beta)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-7)
    rho = np.exp(logp - np.asarray(batch["old_log_probs"]))
    c, a = np.asarray(batch["completion"]), np.asarray(batch["advantages"])[:, None]
    upper, lower = c & (a > 0) & (rho > 1 + EPS), c & (a < 0) & (rho < 1 - EPS)
    assert upper.sum() >= 3 and lower.sum() >= 3  # the clip fires on both sides
    fires = upper | lower
    kl_only = beta * (1 - np.exp(np.asarray(batch["ref_log_probs"]) - logp)) / c.sum()
    np.testing.assert_allclose(grad[fires], kl_only[fires], rtol=1e-4, atol=1e-8)  # clipped: no policy gradient
    assert np.all(grad[~c] == 0)  # after the EOS: nothing


def shao_reference(logp, batch, beta):
    """-J of GRPO's objective as Shao et al. 2024 write it: J = 1/G sum_i 1/|o_i| sum_t [min(rho A, clip(rho) A) -
    beta k3], over every row of the batch (the K groups' rows, tied ones with A = 0 and their KL term)."""
    c, a = np.asarray(batch["completion"], np.float64), np.asarray(batch["advantages"], np.float64)[:, None]
    old, ref = np.asarray(batch["old_log_probs"], np.float64), np.asarray(batch["ref_log_probs"], np.float64)
    rho = np.exp(logp - old)
    k3 = np.exp(ref - logp) - (ref - logp) - 1
    inner = np.minimum(rho * a, np.clip(rho, 1 - EPS, 1 + EPS) * a) - beta * k3
    j = np.mean([np.sum(inner[i] * c[i]) / c[i].sum() for i in range(len(c))])
    return -j


@pytest.mark.parametrize("beta", [0.0, 0.3])
def test_the_per_row_mean_is_grpos_equation_over_every_row(beta):
    batch, logp = fixed_batch()
    assert np.asarray(batch["valid"]).min() == 0  # a tied group is in the batch
    objective = rl.DiffuGRPO(TableScorer(), clip_eps=EPS, kl_beta=beta, normalization="row_mean")
    loss, grad = loss_and_grad(objective, logp, batch)
    np.testing.assert_allclose(loss, shao_reference(logp, batch, beta), rtol=1e-5)
    tied = np.asarray(batch["valid"]) == 0
    c = np.asarray(batch["completion"])
    if beta:  # the tied rows still carry the KL term
        assert np.all(np.abs(grad[tied][c[tied]]) > 0)
    else:
        assert np.all(grad[tied] == 0)
    with pytest.raises(ValueError, match="loss_normalization"):
        rl.DiffuGRPO(TableScorer(), normalization="sequence_sum")


def wd1_reference(logp, batch, psi, lam, beta, zero_tied=False):
    """wd1's code: every group's softmaxes, a tied group's too (A = 0: each row (1 - lambda) / G); `zero_tied`: the
    toolbox's option giving a tied group's rows weight 0."""
    c = np.asarray(batch["completion"], np.float64)
    a = np.asarray(batch["advantages"], np.float64).reshape(K, G)
    soft = lambda x: np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)  # noqa: E731
    w = soft(psi * a) - lam * soft(-psi * a)
    if zero_tied:
        w = w * (REWARDS.max(1) > REWARDS.min(1))[:, None]
    w = w.reshape(-1, 1)
    ref = np.asarray(batch["ref_log_probs"], np.float64)
    k3 = np.exp(ref - logp) - (ref - logp) - 1
    loss = -np.sum(w * logp * c) / K + beta * np.sum(k3 * c) / c.sum()
    grad = -w * c / K + beta * (1 - np.exp(ref - logp)) * c / c.sum()
    return loss, grad


@pytest.mark.parametrize("zero_tied", [False, True])
@pytest.mark.parametrize("psi, lam, beta", [(1.0, 1.0, 0.0), (2.0, 0.5, 0.2)])
def test_wd1_is_its_equation_on_sequence_sums(psi, lam, beta, zero_tied):
    batch, logp = fixed_batch()
    objective = rl.WD1(
        TableScorer(), group_size=G, psi=psi, negative_weight=lam, kl_beta=beta, zero_tied_groups=zero_tied
    )
    loss, grad = loss_and_grad(objective, logp, batch)
    want_loss, want_grad = wd1_reference(logp, batch, psi, lam, beta, zero_tied)
    tied = np.asarray(objective.weights(batch["advantages"], batch["valid"]))[2 * G :]  # the third group ties
    np.testing.assert_allclose(tied, 0.0 if zero_tied else (1 - lam) / G, atol=1e-6)  # wd1's code: (1 - lambda) / G
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-7)
    best = np.argmax(REWARDS[0])  # the best completion of group 0 is pushed up, the worst down
    assert grad[best, 1] < 0 < grad[1, 1]


@dataclasses.dataclass(frozen=True)
class TableElbo:
    """The negative ELBO of row i is `params["nats"][i]` over `counted` tokens (the completion's length)."""

    counted: np.ndarray
    canvas_len = None

    def elbo_per_example(self, params, rows, key):
        del rows, key
        return params["nats"], jnp.asarray(self.counted, jnp.float32)


def test_the_elbo_policy_gradient_is_a_times_the_negative_elbo_per_token():
    batch, logp = fixed_batch()
    nats = np.random.default_rng(1).uniform(5.0, 20.0, (K * G,))
    objective = rl.ElboPolicyGradient(TableElbo(LENGTHS), TableScorer(), draws=2)
    params = {"nats": jnp.asarray(nats, jnp.float32), "logp": jnp.asarray(logp, jnp.float32)}
    loss, grads = jax.value_and_grad(lambda p: objective(p, batch, jax.random.key(0))[0])(params)
    a, valid = np.asarray(batch["advantages"], np.float64), np.asarray(batch["valid"], np.float64)
    np.testing.assert_allclose(float(loss), np.sum(valid * a * nats / LENGTHS) / valid.sum(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grads["nats"]), valid * a / LENGTHS / valid.sum(), rtol=1e-5, atol=1e-8)
    assert np.all(np.asarray(grads["logp"]) == 0)  # the scorer only measures when kl_beta = 0
    assert grads["nats"][np.argmax(a)] > 0  # descent lowers the best completion's negative ELBO


@dataclasses.dataclass(frozen=True)
class RowsElbo:
    """A negative ELBO that reads its rows and its key: row i's is `params["nats"][i]`, plus 100 per position whose
    holding is wrong (a position the sampler wrote held, or a prompt position corrupted), plus a noise term
    uniform in [-5, 5] drawn from `key`; over `counted` tokens."""

    written: np.ndarray
    counted: np.ndarray
    canvas_len = None

    def elbo_per_example(self, params, rows, key):
        wrong = jnp.sum(rows["fixed"] == jnp.asarray(self.written), axis=1)
        noise = jax.random.uniform(key, (len(self.counted),), minval=-5.0, maxval=5.0)
        return params["nats"] + 100.0 * wrong + noise, jnp.asarray(self.counted, jnp.float32)


@pytest.mark.parametrize("cut_at_eos", [False, True])
def test_the_elbo_holds_the_prompt_and_averages_independent_noise_draws(cut_at_eos):
    """The rows corrupt what the sampler wrote (with `masked`, the tail after the EOS too) and hold the prompt; the
    estimate is the mean over `draws` independent noise draws (keys split from the step's key)."""
    batch, logp = fixed_batch()
    written = np.asarray(batch["completion"]).copy()
    if cut_at_eos:
        written[:, 1:] = True  # in place: the sampler wrote every completion position; the scored rows end at the EOS
        batch = dict(batch, masked=jnp.asarray(written))
    nats = np.random.default_rng(2).uniform(5.0, 20.0, (K * G,))
    params = {"nats": jnp.asarray(nats, jnp.float32), "logp": jnp.asarray(logp, jnp.float32)}
    rng, draws = jax.random.key(5), 4
    objective = rl.ElboPolicyGradient(RowsElbo(written, LENGTHS), TableScorer(), draws=draws)
    got = np.asarray(objective.negative_elbo(params, batch, rng))
    noise = [np.asarray(jax.random.uniform(k, (K * G,), minval=-5.0, maxval=5.0)) for k in jax.random.split(rng, draws)]
    np.testing.assert_allclose(got, (nats + np.mean(noise, axis=0)) / LENGTHS, rtol=1e-5)
    assert not np.allclose(got, (nats + noise[0]) / LENGTHS, rtol=1e-3)  # not one draw: their mean


def test_expert_iteration_is_the_nll_of_the_accepted_rows():
    batch, logp = fixed_batch()
    loss, grad = loss_and_grad(rl.ExpertIteration(TableScorer()), logp, batch)
    c, accepted = np.asarray(batch["completion"], np.float64), np.asarray(batch["solved"], np.float64)
    nll = -(logp * c).sum(1) / c.sum(1)
    np.testing.assert_allclose(loss, (nll * accepted).sum() / accepted.sum(), rtol=1e-5)
    np.testing.assert_allclose(grad, -c * (accepted / c.sum(1) / accepted.sum())[:, None], rtol=1e-5, atol=1e-8)


def test_k3_has_the_known_value_and_direction():
    log_probs, ref = jnp.array([[0.0, 0.0]]), jnp.array([[1.0, -1.0]])  # ref - l = +1, -1
    np.testing.assert_allclose(rl.k3_kl(log_probs, ref), [[np.e - 2.0, np.exp(-1.0)]], rtol=1e-6)


@pytest.mark.parametrize("cls", [rl.DiffuGRPO, rl.WD1])
def test_with_zero_advantages_the_kl_pulls_the_policy_to_the_reference(cls):
    batch, logp = fixed_batch()
    batch = dict(batch, advantages=jnp.zeros_like(batch["advantages"]))
    objective = cls(TableScorer(), kl_beta=0.5, **({"group_size": G} if cls is rl.WD1 else {}))
    _, grad = loss_and_grad(objective, logp, batch)
    c, ref = np.asarray(batch["completion"]), np.asarray(batch["ref_log_probs"])
    stepped = logp - 1.0 * grad
    assert np.all(np.abs(stepped - ref)[c] < np.abs(logp - ref)[c])


def tiny_model(vocab, seed=0):
    shape = dict(presets.tiny(vocab_size=vocab, moe=False), sliding_window=32)
    model = T.Transformer(TransformerConfig.from_dict(shape))
    return model, T.init_params(model, jax.random.key(seed))


def test_ar_grpo_rows_end_at_the_first_eos_and_its_gradient_is_d1s_through_the_model(tmp_path):
    """Countdown AR rows: the completion ends at the first EOS (included), the PAD the sampler wrote after it is not
    scored nor counted; the model gradient is the vjp of the exact log-probs with d1's closed-form dL/dl."""
    config = tiny_countdown_config(tmp_path, layout="ar")
    P, C = int(config.data.prompt_len), int(config.data.completion_len)
    rng = np.random.default_rng(3)
    prompts = rng.integers(5, VOCAB_SIZE, (8, P)).astype(np.int32)
    completions = rng.integers(5, VOCAB_SIZE, (8, C)).astype(np.int32)
    ends = np.array([2, 5, C, 1, 7, 3, 9, 4])  # the position of the first EOS; C: none
    for i, e in enumerate(ends):
        if e < C:
            completions[i, e], completions[i, e + 1 :] = EOS_ID, PAD_ID
    exp = type("Exp", (), {"config": config})()
    rows = CountdownTask().policy_rows(exp, prompts, completions)
    want = np.zeros((8, P + C), bool)
    for i, e in enumerate(ends):
        want[i, P : P + min(e + 1, C)] = True
    np.testing.assert_array_equal(rows["completion"], want)
    in_place = tiny_countdown_config(tmp_path, layout="in_place")
    assert CountdownTask().policy_rows(type("Exp", (), {"config": in_place})(), prompts, completions)["completion"][
        :, P:
    ].all()  # in place, the sampler draws the PAD tail too

    model, params = tiny_model(VOCAB_SIZE)
    scorer = AutoregressiveScorer(model)
    tokens, completion = jnp.asarray(rows["tokens"]), jnp.asarray(rows["completion"])
    n = len(tokens)

    def log_probs(p):
        return scorer(p, tokens, completion, jnp.zeros_like(completion))[0]

    logp, vjp = jax.vjp(log_probs, params)
    logp_np = np.asarray(logp, np.float64)
    delta = rng.uniform(-0.6, 0.6, logp_np.shape)
    adv = numpy_advantages(np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]]))
    batch = {
        "tokens": tokens,
        "completion": completion,
        "prompt_masked": jnp.zeros_like(completion),
        "advantages": jnp.asarray(adv, jnp.float32),
        "valid": jnp.ones((n,)),
        "old_log_probs": jnp.asarray(logp_np - delta, jnp.float32),
        "ref_log_probs": jnp.asarray(logp_np + 0.3, jnp.float32),
        "rewards": jnp.zeros((n,)),
        "solved": jnp.zeros((n,)),
        "rollout_seconds": jnp.zeros((n,)),
        "update_seconds": jnp.zeros((n,)),
        "has_reference": jnp.ones((n,)),
    }
    objective = rl.ArGRPO(scorer, clip_eps=EPS, kl_beta=0.1)
    loss, grads = jax.value_and_grad(lambda p: objective(p, batch, jax.random.key(0))[0])(params)
    want_loss, want_grad = d1_reference(logp_np, batch, 0.1)
    assert np.asarray(batch["completion"]).sum() == sum(min(e + 1, C) for e in ends)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-4)
    (expected,) = vjp(jnp.asarray(want_grad, jnp.float32))
    for got, exp_leaf in zip(jax.tree.leaves(grads), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(exp_leaf), rtol=2e-3, atol=1e-6)


def test_the_trajectory_scorer_never_masks_the_prompt():
    model, params = tiny_model(8, seed=1)
    tokens = jnp.array([[4, 5, 6, 7, 5, 6], [4, 4, 6, 1, 2, 0]], jnp.int32)
    completion = jnp.array([[False, False, True, True, True, True]] * 2)
    commit = jnp.array([[-1, -1, 0, 1, 1, 2]] * 2, jnp.int32)
    scorer = TrajectoryScorer(model, mask_id=3, num_passes=3)
    plain = scorer(params, tokens, completion, jnp.zeros_like(completion), commit)[0]
    masked = scorer(params, tokens, completion, ~completion, commit)[0]
    np.testing.assert_array_equal(np.asarray(plain), np.asarray(masked))


def rl_config(tmp_path, **rl_values):
    source = tiny_sudoku_config("in_place", tmp_path=tmp_path)
    r = rl_settings.rl_sections(source, checkpoint=str(tmp_path / "src"))
    for key, value in rl_values.items():
        r.rl[key] = value
    return r, source


@pytest.mark.parametrize(
    "values, message",
    [
        ({"scorer": "trajectory", "prompt_mask_prob": 0.15}, "set config.rl.prompt_mask_prob=0"),
        ({"loss_normalization": "sequence_sum"}, "loss_normalization='sequence_sum' must be 'paper' or one of"),
        ({"objective": "elbo", "loss_normalization": "row_mean"}, "has one normalisation"),
    ],
)
def test_variant_settings_are_checked(tmp_path, values, message):
    config, _ = rl_config(tmp_path, **values)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        command.check_rl_config(config)


def test_the_defaults_are_the_papers(tmp_path):
    config, _ = rl_config(tmp_path)
    assert config.rl.advantage_scale == "none" and config.rl.loss_normalization == "paper"
    assert not config.rl.skip_uninformative_steps
    assert command.rollout_settings(config).advantage_scale == "none"
    adv, _ = group_advantages(np.array([[0.0, 1.0, 1.0, 1.0]]))
    np.testing.assert_allclose(adv, [[-0.75, 0.25, 0.25, 0.25]])  # r - mean, no division by the std
    for cls in (rl.DiffuGRPO, rl.ArGRPO):
        assert rl.resolve_normalization("clipped", cls(TableScorer()).normalization) == "batch_tokens"
    assert rl.resolve_normalization("wd1", rl.WD1(TableScorer(), group_size=G).normalization) == "sequence_sum"


def test_a_token_shift_run_is_refused_before_its_weights_are_read(tmp_path):
    config, source = rl_config(tmp_path)
    source.diffusion.token_shift = True
    run_config.save_config(source, tmp_path / "src" / "config.json")  # a run directory with no weights in it
    with pytest.raises(ValueError, match="was trained with diffusion.token_shift"):
        command.setup(config, str(tmp_path / "rl"))
    assert not (tmp_path / "rl" / "config.json").exists()


def test_a_skipped_step_leaves_weights_optimizer_and_ema_bit_identical():
    """AdamW keeps moving the weights on a zero-gradient step; with the update vetoed nothing moves but the step."""
    optimizer = optax.adamw(1e-2, b1=0.9, weight_decay=0.1)

    def loss_fn(params, batch, key):
        loss = jnp.sum(params["w"] * batch["x"])
        return loss, {train_state.APPLY_UPDATE: batch["apply"]} if "apply" in batch else {}

    for veto in (False, True):
        step = jax.jit(train_state.make_train_step(loss_fn, optimizer, ema_decay=0.5))
        state = train_state.TrainState.create({"w": jnp.ones((3,))}, optimizer, jax.random.key(0), use_ema=True)
        first = {"x": jnp.array([1.0, -2.0, 0.5])}
        zero = {"x": jnp.zeros((3,))}
        if veto:
            first, zero = dict(first, apply=jnp.float32(1.0)), dict(zero, apply=jnp.float32(0.0))
        state, _ = step(state, first)
        before = jax.device_get(state)
        state, _ = step(state, zero)
        after = jax.device_get(state)
        assert int(after.step) == 2
        same = [np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before.params), jax.tree.leaves(after.params))]
        if not veto:
            assert not all(same)  # momentum: the weights move on a step without gradient
            continue
        for part in ("params", "opt_state", "ema_params"):
            for a, b in zip(jax.tree.leaves(getattr(before, part)), jax.tree.leaves(getattr(after, part))):
                np.testing.assert_array_equal(a, b)


def test_the_update_gate_reads_the_informative_groups():
    gated = command.with_update_gate(lambda p, b, k: (jnp.float32(0.0), {}))
    for valid, want in (([0.0, 0.0, 0.0], 0.0), ([0.0, 1.0, 1.0], 1.0)):
        _, metrics = gated(None, {"valid": jnp.asarray(valid)}, None)
        assert float(metrics[train_state.APPLY_UPDATE]) == want


def test_expert_iterations_update_gate_reads_the_accepted_completions():
    """Groups of one always tie (valid = 0): expert iteration's gate is whether any completion was accepted."""
    gated = command.with_update_gate(
        lambda p, b, k: (jnp.float32(0.0), {}), grouped=rl.ExpertIteration.grouped
    )
    for solved, want in (([0.0, 0.0], 0.0), ([0.0, 1.0], 1.0)):
        _, metrics = gated(None, {"valid": jnp.zeros((2,)), "solved": jnp.asarray(solved)}, None)
        assert float(metrics[train_state.APPLY_UPDATE]) == want


def test_rl_refuses_gradient_accumulation(tmp_path):
    config, _ = rl_config(tmp_path)
    config.train.grad_accum_steps = 2
    with pytest.raises(ValueError, match="grad_accum_steps=2: .* set it to 1"):
        command.check_rl_config(config)


# -- branches and guards the equations above leave open ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class AuxTableScorer:
    """TableScorer plus a MoE auxiliary loss that depends on the parameters: `params["aux"]` as the load-balance
    loss (what the router adds to every objective's loss)."""

    def __call__(self, params, tokens, completion, prompt_masked, commit_pass=None):
        aux = {"moe_load_balance_loss": params["aux"], "moe_router_z_loss": 0.25 * params["aux"]}
        return params["logp"], jnp.zeros_like(params["logp"]), aux


def wd1_row_mean_reference(logp, batch, psi, lam, beta):
    """wd1's weights on each row's mean log-prob per completion token (`row_mean`), summed over rows and divided by
    the K groups; the KL as GRPO's paper (each row's mean k3 per token, then the mean over every row)."""
    c = np.asarray(batch["completion"], np.float64)
    a = np.asarray(batch["advantages"], np.float64).reshape(K, G)
    soft = lambda x: np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)  # noqa: E731
    w = (soft(psi * a) - lam * soft(-psi * a)).reshape(-1)
    ref = np.asarray(batch["ref_log_probs"], np.float64)
    k3 = np.exp(ref - logp) - (ref - logp) - 1
    row_mean = lambda x: (x * c).sum(1) / c.sum(1)  # noqa: E731
    return -np.sum(w * row_mean(logp)) / K + beta * np.mean(row_mean(k3))


@pytest.mark.parametrize("beta", [0.0, 0.2])
def test_wd1_per_row_means_are_its_weights_on_mean_log_probs(beta):
    batch, logp = fixed_batch()
    objective = rl.WD1(
        TableScorer(), group_size=G, psi=2.0, negative_weight=0.5, kl_beta=beta, normalization="row_mean"
    )
    loss, grad = loss_and_grad(objective, logp, batch)
    np.testing.assert_allclose(loss, wd1_row_mean_reference(logp, batch, 2.0, 0.5, beta), rtol=1e-5)
    best = np.argmax(REWARDS[0])
    assert grad[best, 1] < 0 < grad[1, 1]  # descent raises the best completion's log-probs, lowers the worst's


def test_rows_without_reference_log_probs_carry_no_kl_in_every_normalisation():
    """`has_reference` 0 (a row the rollouts could not score under the reference): its KL term is 0, never divided."""
    batch, logp = fixed_batch()
    has = np.ones(K * G, np.float32)
    has[[0, 5]] = 0.0
    batch = dict(batch, has_reference=jnp.asarray(has), advantages=jnp.zeros_like(batch["advantages"]))
    c = np.asarray(batch["completion"], np.float64)
    ref = np.asarray(batch["ref_log_probs"], np.float64)
    k3 = (np.exp(ref - logp) - (ref - logp) - 1) * has[:, None]
    per_row = (k3 * c).sum(1) / c.sum(1)
    valid = np.asarray(batch["valid"], np.float64)
    cases = {
        rl.DiffuGRPO(TableScorer(), clip_eps=EPS, kl_beta=1.0): np.sum(k3 * c) / c.sum(),  # d1: over the tokens
        rl.DiffuGRPO(TableScorer(), clip_eps=EPS, kl_beta=1.0, normalization="row_mean"): per_row.mean(),
    }
    for objective, want in cases.items():
        loss, grad = loss_and_grad(objective, logp, batch)
        np.testing.assert_allclose(loss, want, rtol=1e-5)
        assert np.all(grad[[0, 5]] == 0) and np.isfinite(grad).all()
    nats = np.full(K * G, 10.0)
    elbo = rl.ElboPolicyGradient(TableElbo(LENGTHS), TableScorer(), draws=1, kl_beta=1.0)
    params = {"nats": jnp.asarray(nats, jnp.float32), "logp": jnp.asarray(logp, jnp.float32)}
    loss, metrics = elbo(params, batch, jax.random.key(0))
    np.testing.assert_allclose(float(metrics["kl"]), np.sum(per_row * valid) / valid.sum(), rtol=1e-5)


def test_the_kl_term_of_the_elbo_policy_gradient_has_a_gradient_when_weighted():
    """kl_beta > 0: the scorer's log-probs carry the KL's gradient (toward the reference); kl_beta = 0 (the other
    test): they are only measured."""
    batch, logp = fixed_batch()
    batch = dict(batch, advantages=jnp.zeros_like(batch["advantages"]))
    objective = rl.ElboPolicyGradient(TableElbo(LENGTHS), TableScorer(), draws=1, kl_beta=0.5)
    params = {"nats": jnp.full((K * G,), 10.0), "logp": jnp.asarray(logp, jnp.float32)}
    grads = jax.grad(lambda p: objective(p, batch, jax.random.key(0))[0])(params)
    c, valid = np.asarray(batch["completion"], np.float64), np.asarray(batch["valid"], np.float64)
    ref = np.asarray(batch["ref_log_probs"], np.float64)
    want = 0.5 * (1 - np.exp(ref - logp)) * c / c.sum(1, keepdims=True) * valid[:, None] / valid.sum()
    np.testing.assert_allclose(np.asarray(grads["logp"]), want, rtol=1e-4, atol=1e-8)


@pytest.mark.parametrize(
    "make",
    [
        lambda s: rl.DiffuGRPO(s, clip_eps=EPS),
        lambda s: rl.WD1(s, group_size=G),
        lambda s: rl.ExpertIteration(s),
    ],
    ids=["diffu_grpo", "wd1", "expert_iteration"],
)
def test_the_routers_auxiliary_loss_is_added_to_every_objective(make):
    batch, logp = fixed_batch()
    aux = 0.7
    without = float(make(TableScorer())({"logp": jnp.asarray(logp, jnp.float32)}, batch, jax.random.key(0))[0])
    params = {"logp": jnp.asarray(logp, jnp.float32), "aux": jnp.asarray(aux)}
    loss, grads = jax.value_and_grad(lambda p: make(AuxTableScorer())(p, batch, jax.random.key(0))[0])(params)
    np.testing.assert_allclose(float(loss), without + 1.25 * aux, rtol=1e-5)
    np.testing.assert_allclose(float(grads["aux"]), 1.25, rtol=1e-6)  # minimised, never maximised


def test_the_elbo_policy_gradient_adds_the_auxiliary_loss_and_reports_the_elbo_as_a_bound():
    batch, logp = fixed_batch()
    nats = np.random.default_rng(4).uniform(5.0, 20.0, (K * G,))
    objective = rl.ElboPolicyGradient(TableElbo(LENGTHS), AuxTableScorer(), draws=1)
    params = {"nats": jnp.asarray(nats, jnp.float32), "logp": jnp.asarray(logp, jnp.float32), "aux": jnp.asarray(0.4)}
    loss, metrics = objective(params, batch, jax.random.key(0))
    a, valid = np.asarray(batch["advantages"], np.float64), np.asarray(batch["valid"], np.float64)
    np.testing.assert_allclose(float(loss), np.sum(valid * a * nats / LENGTHS) / valid.sum() + 1.25 * 0.4, rtol=1e-5)
    elbo = -np.sum(valid * nats / LENGTHS) / valid.sum()  # log-likelihood bound per token: negative
    np.testing.assert_allclose(float(metrics["elbo_nats_per_token"]), elbo, rtol=1e-5)


def test_the_clip_fraction_counts_the_tokens_whose_ratio_left_the_trust_region():
    batch, logp = fixed_batch()
    _, metrics = rl.DiffuGRPO(TableScorer(), clip_eps=EPS)({"logp": jnp.asarray(logp)}, batch, jax.random.key(0))
    c, valid = np.asarray(batch["completion"], np.float64), np.asarray(batch["valid"], np.float64)
    outside = np.abs(np.exp(logp - np.asarray(batch["old_log_probs"])) - 1.0) > EPS
    per_row = (outside * c).sum(1) / c.sum(1)
    want = np.sum(per_row * valid) / valid.sum()
    assert 0 < want < 1
    np.testing.assert_allclose(float(metrics["clip_fraction"]), want, rtol=1e-5)


def test_means_over_valid_rows_of_one_row_and_of_none():
    np.testing.assert_allclose(float(rl.valid_mean(jnp.array([3.0, 5.0]), jnp.array([0.0, 1.0]))), 5.0)
    assert float(rl.valid_mean(jnp.array([3.0, 5.0]), jnp.zeros(2))) == 0.0  # no valid row: 0, not 0/0
    assert float(rl.row_means(jnp.ones((1, 3)), jnp.zeros((1, 3), bool))[0]) == 0.0


def test_a_completion_of_no_counted_token_has_a_finite_elbo():
    batch, _ = fixed_batch()
    counted = LENGTHS.copy()
    counted[3] = 0
    objective = rl.ElboPolicyGradient(TableElbo(counted), TableScorer(), draws=1)
    nelbo = np.asarray(objective.negative_elbo({"nats": jnp.full((K * G,), 6.0)}, batch, jax.random.key(0)))
    assert np.isfinite(nelbo).all() and nelbo[3] == 6.0


def test_noise_draws_must_be_at_least_one():
    rl.ElboPolicyGradient(TableElbo(LENGTHS), TableScorer(), draws=1)
    rl.ExpertIteration(TableScorer(), draws=1)
    for draws in (0, -1):
        with pytest.raises(ValueError, match=r"config.rl.elbo.draws=-?\d must be an integer >= 1"):
            rl.ElboPolicyGradient(TableElbo(LENGTHS), TableScorer(), draws=draws)
        with pytest.raises(ValueError, match=r"config.rl.expert_iteration.draws=-?\d must be an integer >= 1"):
            rl.ExpertIteration(TableScorer(), draws=draws)


def test_the_objectives_defaults_are_the_recipes_and_the_papers(tmp_path):
    """The classes' own defaults agree with `rl_settings.rl_sections` (what a config gets) and the papers: d1's clip 0.5,
    no KL; wd1's psi = lambda = 1 with tied groups weighted as its code; 4 ELBO draws; only the ratio objectives
    need the old policy's log-probs (an extra scoring pass per rollout)."""
    section = rl_settings.rl_sections(tiny_countdown_config(tmp_path), checkpoint="unused").rl
    clipped = rl.DiffuGRPO(TableScorer())
    assert (clipped.clip_eps, clipped.kl_beta) == (section.diffu_grpo.clip_eps, section.kl_beta) == (0.5, 0.0)
    assert rl.ArGRPO(TableScorer()).clip_eps == section.ar_grpo.clip_eps == 0.5
    wd1 = rl.WD1(TableScorer(), group_size=G)
    assert (wd1.psi, wd1.negative_weight, wd1.kl_beta) == (section.wd1.psi, section.wd1.negative_weight, 0.0)
    assert wd1.psi == 1.0 and wd1.zero_tied_groups is section.wd1.zero_tied_groups is False
    elbo = rl.ElboPolicyGradient(TableElbo(tuple(LENGTHS)), TableScorer())
    assert elbo.draws == section.elbo.draws == 4 and elbo.kl_beta == 0.0
    # one fresh noise draw per step, as pretraining
    assert rl.ExpertIteration(TableScorer()).draws == section.expert_iteration.draws == 1
    classes = (rl.DiffuGRPO, rl.ArGRPO, rl.WD1, rl.ElboPolicyGradient, rl.ExpertIteration)
    assert [cls.needs_old_log_probs for cls in classes] == [True, True, False, False, False]
    for objective in (clipped, wd1, elbo, rl.ExpertIteration(TableScorer())):
        with pytest.raises(dataclasses.FrozenInstanceError):  # jitted losses close over them: immutable and hashable
            objective.kl_beta = 1.0
        hash(objective)


@pytest.mark.parametrize("make", [
    lambda: rl.DiffuGRPO(TableScorer(), clip_eps=EPS, kl_beta=0.5),
    lambda: rl.DiffuGRPO(TableScorer(), clip_eps=EPS, kl_beta=0.5, normalization="row_mean"),
    lambda: rl.WD1(TableScorer(), group_size=G, kl_beta=0.5),
    lambda: rl.WD1(TableScorer(), group_size=G, kl_beta=0.0),
])  # fmt: skip
def test_rows_without_a_reference_stay_finite_however_unlikely_their_tokens(make):
    """A row without reference log-probs holds placeholder zeros; with a token at log-prob -100 (exp(0 + 100)
    overflows float32) its KL term must still be exactly 0 in value and gradient, never inf x 0 = NaN."""
    batch, logp = fixed_batch()
    logp = logp.copy()
    logp[0, 1] = -100.0
    has = np.ones(K * G, np.float32)
    has[0] = 0.0
    ref = np.asarray(batch["ref_log_probs"]).copy()
    ref[0] = 0.0
    batch = dict(batch, has_reference=jnp.asarray(has), ref_log_probs=jnp.asarray(ref))
    loss, grad = loss_and_grad(make(), logp, batch)
    assert np.isfinite(loss) and np.isfinite(grad).all()
    with_ref = dict(batch, has_reference=jnp.ones(K * G), ref_log_probs=jnp.asarray(np.where(has[:, None] > 0, ref, logp)))
    loss_same, grad_same = loss_and_grad(make(), logp, with_ref)  # a reference equal to the policy: KL exactly 0
    np.testing.assert_allclose(loss, loss_same, rtol=1e-6)
    np.testing.assert_allclose(grad, grad_same, rtol=1e-5, atol=1e-9)


def test_d1s_token_mean_divides_by_the_token_count_and_an_empty_batch_is_zero():
    """d1's reduction: sum over the batch's completion tokens / their count; with one token it is that token's value
    (a floor of 1 on the count, not 2), with none it is 0 (not 0 / 0)."""
    x = jnp.asarray([[2.0, 5.0, 7.0], [3.0, 11.0, 13.0]])
    one = jnp.asarray([[False, True, False], [False, False, False]])
    assert float(rl.batch_token_mean(x, one)) == 5.0
    assert float(rl.batch_token_mean(x, jnp.zeros((2, 3), bool))) == 0.0
    three = jnp.asarray([[True, False, True], [False, True, False]])
    np.testing.assert_allclose(float(rl.batch_token_mean(x, three)), (2 + 7 + 11) / 3, rtol=1e-6)
