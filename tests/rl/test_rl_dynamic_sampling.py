"""Dynamic sampling (`rl.dynamic_sampling`): the group selection, and `RolloutStream` on a stub task whose tied
prompts the test chooses: informative groups kept, tied ones filling the batch at the cap, the prompt order advanced
by the draws, the former batches with the key at 0, and exact resume from the stream's state."""

import json
import types

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from hackable_diffusion.rl import settings as rl_settings
from hackable_diffusion.rl import command
from hackable_diffusion.rl.advantages import group_advantages, select_informative_groups
from hackable_diffusion.rl.rollouts import RolloutSettings, RolloutStream, prompt_indices

N, K, G, SEED = 12, 3, 4, 5
TIMINGS = ("rollout_seconds", "update_seconds")


class StubTask:
    """Prompt i is the row [i, 100 + i]; a completion is [prompt id, 3 tokens drawn from the rollout seed]. Rewards
    of an informative prompt differ across its group (they grow with the row's place in it); a tied prompt's all
    equal 0.25, whatever the completion."""

    name = "stub"

    def __init__(self, informative_ids):
        self.informative = np.asarray(sorted(informative_ids), np.int64)
        self.calls: list[tuple[np.ndarray, int]] = []  # (prompt ids, seed) of every rollout call

    def rl_prompts(self, exp):
        del exp
        ids = np.arange(N, dtype=np.int32)
        return np.stack([ids, 100 + ids], axis=1)

    def rollout(self, exp, params, prompts, *, seed, config):
        del exp, params, config
        self.calls.append((prompts[::G, 0].copy(), seed))
        noise = np.random.default_rng(seed).integers(0, 50, (len(prompts), 3))
        return np.concatenate([prompts[:, :1], noise], axis=1).astype(np.int32)

    def reward(self, prompts, completions):
        del completions
        place = np.arange(len(prompts)) % G
        return np.where(np.isin(prompts[:, 0], self.informative), place / (G - 1), 0.25).astype(np.float32)

    def policy_rows(self, exp, prompts, completions):
        del exp
        tokens = np.concatenate([prompts, completions], axis=1).astype(np.int32)
        completion = np.zeros(tokens.shape, bool)
        completion[:, prompts.shape[1] :] = True
        return {"tokens": tokens, "completion": completion}


def scorer(params, tokens, completion, masked):
    return tokens.astype(jnp.float32) * params - masked.astype(jnp.float32) + completion, None, None


def order(draws: int) -> np.ndarray:
    """The prompt ids of the first `draws` draws, in the stream's seeded order."""
    return np.concatenate([prompt_indices(N, d, K, SEED) for d in range(draws)])


def make_stream(informative_ids, *, dynamic_sampling=0, inner_updates=1, prompt_mask_prob=0.0):
    settings = RolloutSettings(
        prompts_per_rollout=K,
        group_size=G,
        inner_updates=inner_updates,
        prompt_mask_prob=prompt_mask_prob,
        seed=SEED,
        dynamic_sampling=dynamic_sampling,
    )
    stream = RolloutStream(
        exp=types.SimpleNamespace(task=StubTask(informative_ids)),
        settings=settings,
        rollout_config=ml_collections.ConfigDict(),
        scorer=scorer,
        policy_params=lambda params: params,
        reference_params=None,
        needs_old_log_probs=True,
    )
    stream.prepare(0, types.SimpleNamespace(params=jnp.float32(0.5)))
    return stream


def batch_ids(batch) -> np.ndarray:
    return batch["tokens"][::G, 0]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert set(x) == set(y)
        for key in set(x) - set(TIMINGS):
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


# -- the selection ----------------------------------------------------------------------------------------------
def test_selection_keeps_the_first_informative_groups_in_draw_order():
    tied, good = [0.5, 0.5, 0.5], [0.0, 1.0, 0.0]
    rewards = np.array([tied, good, tied, good, good, tied, good])
    np.testing.assert_array_equal(select_informative_groups(rewards, 3), [1, 3, 4])
    np.testing.assert_array_equal(select_informative_groups(rewards[:3], 3), [0, 1, 2])  # one draw: all, as drawn


def test_selection_fills_with_the_first_tied_groups_when_short():
    tied, good = [1.0, 1.0], [0.0, 1.0]
    rewards = np.array([tied, tied, tied, good, tied, tied])
    np.testing.assert_array_equal(select_informative_groups(rewards, 3), [0, 1, 3])
    np.testing.assert_array_equal(select_informative_groups(np.array([tied] * 4), 2), [0, 1])
    with pytest.raises(ValueError, match="cannot keep 5 groups out of 4"):
        select_informative_groups(np.array([tied] * 4), 5)
    with pytest.raises(ValueError, match="cannot keep 0 groups"):
        select_informative_groups(np.array([tied] * 4), 0)
    np.testing.assert_array_equal(select_informative_groups(rewards, 1), [3])  # one group: the first informative


# -- the stream -------------------------------------------------------------------------------------------------
def test_enough_informative_groups_fill_the_batch_alone():
    ids = order(4)
    stream = make_stream(ids[[1, 4, 7, 8]], dynamic_sampling=5)  # draws 0 and 1 hold one each, draw 2 two
    batch = next(stream)
    np.testing.assert_array_equal(batch_ids(batch), ids[[1, 4, 7]])
    np.testing.assert_array_equal(batch["valid"], 1.0)
    np.testing.assert_array_equal(batch["draws"], 3.0)
    assert stream.draw_index == 3 and stream.rollout_index == 1
    assert stream.last_rollout["informative_groups"] == K and stream.last_rollout["draws"] == 3
    rewards = batch["rewards"].reshape(K, G)
    np.testing.assert_allclose(batch["advantages"].reshape(K, G), group_advantages(rewards)[0])
    assert batch["tokens"].shape == (K * G, 6) and batch["prompt_masked"].shape == (K * G, 6)


def test_at_the_cap_tied_groups_fill_the_batch_in_draw_order():
    ids = order(3)
    stream = make_stream(ids[[4]], dynamic_sampling=1)  # draw 2 would hold none, but the cap is 2 draws
    batch = next(stream)
    np.testing.assert_array_equal(batch_ids(batch), ids[[0, 1, 4]])
    np.testing.assert_array_equal(batch["valid"].reshape(K, G)[:, 0], [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(batch["draws"], 2.0)
    assert stream.draw_index == 2 and stream.last_rollout["informative_groups"] == 1
    np.testing.assert_array_equal(batch["advantages"][: 2 * G], 0.0)


def test_the_prompt_order_advances_by_the_draws():
    stream = make_stream(order(1)[[0]], dynamic_sampling=2)  # prompt order(1)[0] informative, every other tied
    draws = [int(next(stream)["draws"][0]) for _ in range(5)]
    assert stream.draw_index == sum(draws) > 5 and stream.rollout_index == 5
    calls = stream.task.calls
    assert len(calls) == sum(draws)
    np.testing.assert_array_equal(np.concatenate([ids for ids, _ in calls]), order(sum(draws)))
    expected_seeds = [int(np.random.default_rng([SEED, d, 1]).integers(2**31 - 1)) for d in range(sum(draws))]
    assert [seed for _, seed in calls] == expected_seeds


def former_rollout(task, rollout: int, inner_updates: int, prompt_mask_prob: float):
    """The arrays a rollout was made of before dynamic sampling existed (one draw per rollout, every group kept)."""
    prompts = np.repeat(task.rl_prompts(None)[prompt_indices(N, rollout, K, SEED)], G, axis=0)
    seed = int(np.random.default_rng([SEED, rollout, 1]).integers(2**31 - 1))
    completions = task.rollout(None, None, prompts, seed=seed, config=None)
    rewards = task.reward(prompts, completions)
    advantages, valid = group_advantages(rewards.reshape(-1, G))
    rows = task.policy_rows(None, prompts, completions)
    tokens, completion = rows["tokens"], rows["completion"]
    shape = (inner_updates, *tokens.shape)
    masks = (np.random.default_rng([SEED, rollout, 2]).random(shape) < prompt_mask_prob) & ~completion[None]
    old = np.stack([np.asarray(scorer(jnp.float32(0.5), tokens, completion, m)[0]) for m in masks])
    return {
        "tokens": tokens,
        "completion": completion,
        "advantages": advantages.reshape(-1),
        "valid": np.repeat(valid, G).astype(np.float32),
        "rewards": rewards,
        "solved": (rewards >= 1.0).astype(np.float32),
        "has_reference": np.ones(len(tokens), np.float32),
        "draws": np.ones(len(tokens), np.float32),
        "masks": masks,
        "old": old,
    }


def test_off_it_gives_the_former_batches():
    informative = order(2)[[0, 4]]  # rollouts 0 and 1 hold tied groups: they stay in the batch
    stream = make_stream(informative, inner_updates=2, prompt_mask_prob=0.3)
    used = []
    for rollout in range(3):
        expected = former_rollout(StubTask(informative), rollout, 2, 0.3)
        for j in range(2):
            batch = next(stream)
            assert set(batch) == set(expected) - {"masks", "old"} | {
                "rollout_seconds", "update_seconds", "prompt_masked", "old_log_probs", "ref_log_probs",
            }  # fmt: skip
            for key in set(expected) - {"masks", "old"}:
                np.testing.assert_array_equal(batch[key], expected[key], err_msg=key)
            np.testing.assert_array_equal(batch["prompt_masked"], expected["masks"][j])
            np.testing.assert_array_equal(batch["old_log_probs"], expected["old"][j])
            np.testing.assert_array_equal(batch["ref_log_probs"], expected["old"][j])
            used.append(float(np.mean(batch["valid"])))
        assert stream.draw_index == stream.rollout_index == rollout + 1
    assert used == pytest.approx([1 / K] * 4 + [0.0] * 2)  # tied groups stay in the batch


def test_a_first_draw_without_ties_needs_no_more():
    everything = np.arange(N)
    on = make_stream(everything, dynamic_sampling=3, inner_updates=2, prompt_mask_prob=0.3)
    off = make_stream(everything, inner_updates=2, prompt_mask_prob=0.3)
    assert_same_batches([next(on) for _ in range(6)], [next(off) for _ in range(6)])
    assert on.draw_index == off.draw_index == 3


@pytest.mark.parametrize("stop", [3, 4])  # inside rollout 1 (its second batch is next), and between rollouts
def test_a_resumed_stream_replays_the_same_batches(stop):
    informative = np.arange(0, N, 3)  # a third of the prompts: most rollouts need extra draws, some hit the cap
    settings = dict(dynamic_sampling=2, inner_updates=2, prompt_mask_prob=0.3)
    whole = make_stream(informative, **settings)
    expected = [next(whole) for _ in range(10)]
    assert len({int(b["draws"][0]) for b in expected}) > 1
    first = make_stream(informative, **settings)
    parts = [next(first) for _ in range(stop)]
    state = first.get_state()
    assert json.loads(state)["draw_index"] == first.draw_index > first.rollout_index
    resumed = make_stream(informative, **settings)
    resumed.set_state(state)
    parts += [next(resumed) for _ in range(10 - stop)]
    assert_same_batches(parts, expected)
    assert resumed.draw_index == whole.draw_index


def test_a_state_saved_before_dynamic_sampling_resumes():
    stream = make_stream(np.arange(N))
    stream.set_state(json.dumps({"rollout_index": 4, "inner": 0}).encode())
    assert stream.draw_index == 4
    np.testing.assert_array_equal(batch_ids(next(stream)), prompt_indices(N, 4, K, SEED))


# -- the config -------------------------------------------------------------------------------------------------
def rl_config(**rl) -> ml_collections.ConfigDict:
    section = dict(
        objective="diffu_grpo", prompts_per_rollout=K, group_size=G, inner_updates=1, prompt_mask_prob=0.0,
        advantage_scale="std", kl_beta=0.0, temperature=1.0, diffu_grpo=dict(clip_eps=0.2),
    )  # fmt: skip
    return ml_collections.ConfigDict(dict(seed=SEED, rl={**section, **rl}))


def test_the_key_is_checked_and_optional():
    assert "dynamic_sampling" in command.RL_KEYS
    command.check_rl_config(rl_config())  # a config saved before the key existed
    assert command.rollout_settings(rl_config()).dynamic_sampling == 0
    assert command.rollout_settings(rl_config(dynamic_sampling=3)).dynamic_sampling == 3
    for bad in (-1, 1.5):
        with pytest.raises(ValueError, match="config.rl.dynamic_sampling=.* must be an integer >= 0"):
            command.check_rl_config(rl_config(dynamic_sampling=bad))
    with pytest.raises(ValueError, match="dynamic_sampling=-2 must be >= 0"):
        RolloutSettings(prompts_per_rollout=K, group_size=G, dynamic_sampling=-2)
    sections = rl_settings.rl_sections(ml_collections.ConfigDict(dict(optimizer={}, train={})), checkpoint="src")
    assert sections.rl.dynamic_sampling == 0


def test_the_draws_reach_the_metrics():
    loss = command.with_draws_metric(lambda params, batch, key: (jnp.float32(1.0), {"loss_part": jnp.float32(2.0)}))
    _, metrics = loss(None, {"draws": np.array([3.0, 3.0])}, None)
    assert float(metrics["draws"]) == 3.0 and float(metrics["loss_part"]) == 2.0
    assert "draws" not in loss(None, {}, None)[1]
    assert "draws" in dict(command.RolloutReport.SHOWN)
