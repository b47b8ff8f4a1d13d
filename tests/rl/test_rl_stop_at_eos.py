"""`rl.stop_at_eos` on an in-place run (d1): the scored completion ends at its first EOS, included, while every position
the sampler wrote stays masked in the scoring pass (`masked`), so the scored log-probs cannot read where the completion
ended from the unmasked tail: the rows, the scorers, the rollout stream and the objectives."""

import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from _tiny_countdown import tiny_countdown_config
from _tiny_sudoku import tiny_sudoku_config

from hackable_diffusion.rl import settings as rl_settings
from hackable_diffusion.data.tokenizers import EOS_ID, PAD_ID
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.rl import command
from hackable_diffusion.rl import objectives as rl
from hackable_diffusion.rl.rollouts import RolloutSettings, RolloutStream
from hackable_diffusion.rl.scorers import MeanFieldScorer, TrajectoryScorer
from hackable_diffusion.tasks.countdown.task import CountdownTask

V, MASK, EOS = 8, 3, 2
# prompt (2 positions), completion (5): the first EOS at completion position 2; two rows that differ after it only
TOKENS = np.array([[4, 5, 6, 7, EOS, 1, 1], [4, 5, 6, 7, EOS, 6, 4]], np.int32)
WRITTEN = np.array([[False, False, True, True, True, True, True]] * 2)
SCORED = np.array([[False, False, True, True, True, False, False]] * 2)


def tiny_model(vocab, seed=0):
    shape = dict(presets.tiny(vocab_size=vocab, moe=False), sliding_window=32)
    model = T.Transformer(TransformerConfig.from_dict(shape))
    return model, T.init_params(model, jax.random.key(seed))


def test_countdown_in_place_rows_cut_at_the_first_eos_and_mask_every_written_position(tmp_path):
    config = tiny_countdown_config(tmp_path, layout="in_place")
    P, C = int(config.data.prompt_len), int(config.data.completion_len)
    rng = np.random.default_rng(0)
    prompts = rng.integers(5, 20, (3, P)).astype(np.int32)
    completions = rng.integers(5, 20, (3, C)).astype(np.int32)
    completions[0, 4], completions[0, 5:] = EOS_ID, PAD_ID
    completions[1, 0] = EOS_ID
    exp = types.SimpleNamespace(config=config)
    assert "masked" not in CountdownTask().policy_rows(exp, prompts, completions)  # without an rl section: all C
    config.rl = ml_collections.ConfigDict({"stop_at_eos": True})
    rows = CountdownTask().policy_rows(exp, prompts, completions)
    want = np.zeros((3, P + C), bool)
    want[0, P : P + 5], want[1, P], want[2, P:] = True, True, True  # up to the first EOS included; none: all C
    np.testing.assert_array_equal(rows["completion"], want)
    np.testing.assert_array_equal(rows["masked"][:, P:], True)
    np.testing.assert_array_equal(rows["masked"][:, :P], False)


def test_the_mean_field_pass_keeps_the_tail_masked_and_so_leaks_no_length():
    model, params = tiny_model(V, seed=2)
    scorer = MeanFieldScorer(model, MASK)
    tokens, scored, written = (jnp.asarray(x) for x in (TOKENS, SCORED, WRITTEN))
    none = jnp.zeros_like(scored)
    cut = np.asarray(scorer(params, tokens, scored, none, masked=written)[0])
    full = np.asarray(scorer(params, tokens, written, none)[0])
    np.testing.assert_allclose(cut, np.where(SCORED, full, 0.0), rtol=1e-6, atol=1e-6)  # the same pass, fewer scored
    np.testing.assert_array_equal(cut[0], cut[1])  # the tails differ: nothing of them is seen
    leaky = np.asarray(scorer(params, tokens, scored, none)[0])  # the tail left unmasked: the pass reads it
    assert not np.allclose(leaky[0], leaky[1])


def test_the_trajectory_pass_keeps_the_tail_masked_until_its_own_pass():
    model, params = tiny_model(V, seed=3)
    scorer = TrajectoryScorer(model, mask_id=MASK, num_passes=3)
    tokens, scored, written = (jnp.asarray(x) for x in (TOKENS, SCORED, WRITTEN))
    commit = jnp.asarray(np.array([[-1, -1, 0, 1, 2, 2, 2]] * 2, np.int32))  # the tail written last
    cut = np.asarray(scorer(params, tokens, scored, jnp.zeros_like(scored), commit, masked=written)[0])
    full = np.asarray(scorer(params, tokens, written, jnp.zeros_like(scored), commit)[0])
    np.testing.assert_allclose(cut, np.where(SCORED, full, 0.0), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(cut[0], cut[1])


def test_diffu_grpo_scores_through_masked():
    model, params = tiny_model(V, seed=4)
    n = len(TOKENS)
    batch = {
        "tokens": jnp.asarray(TOKENS),
        "completion": jnp.asarray(SCORED),
        "masked": jnp.asarray(WRITTEN),
        "prompt_masked": jnp.zeros(TOKENS.shape, bool),
        "advantages": jnp.asarray([1.0, -1.0]),
        "valid": jnp.ones((n,)),
        "old_log_probs": jnp.zeros(TOKENS.shape),
        "ref_log_probs": jnp.zeros(TOKENS.shape),
        "rewards": jnp.zeros((n,)),
        "solved": jnp.zeros((n,)),
        "rollout_seconds": jnp.zeros((n,)),
        "update_seconds": jnp.zeros((n,)),
        "has_reference": jnp.ones((n,)),
    }
    scorer = MeanFieldScorer(model, MASK)
    log_probs, _, _ = rl.score(scorer, params, batch)
    want = scorer(params, batch["tokens"], batch["completion"], batch["prompt_masked"], masked=batch["masked"])[0]
    np.testing.assert_array_equal(np.asarray(log_probs), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(log_probs)[0], np.asarray(log_probs)[1])


class CutTask:
    """Prompts [4, 5]; completions are TOKENS' completion part; rows cut at the EOS, all written positions masked."""

    name = "cut"

    def rl_prompts(self, exp):
        return np.array([[4, 5], [4, 5]], np.int32)

    def rollout(self, exp, params, prompts, *, seed, config):
        return np.resize(TOKENS[:, 2:], (len(prompts), 5))

    def reward(self, prompts, completions):
        return np.arange(len(prompts), dtype=np.float32) % 2

    def policy_rows(self, exp, prompts, completions):
        tokens = np.concatenate([prompts, completions], axis=1)
        n = len(tokens)
        return {"tokens": tokens, "completion": np.resize(SCORED, (n, 7)), "masked": np.resize(WRITTEN, (n, 7))}


def test_the_rollout_stream_scores_the_old_policy_with_the_tail_masked():
    model, params = tiny_model(V, seed=5)
    scorer = MeanFieldScorer(model, MASK)
    stream = RolloutStream(
        exp=types.SimpleNamespace(task=CutTask()),
        settings=RolloutSettings(prompts_per_rollout=2, group_size=2, prompt_mask_prob=0.5, seed=1, inner_updates=2),
        rollout_config=ml_collections.ConfigDict(),
        scorer=scorer,
        policy_params=lambda p: p,
        reference_params=None,
        needs_old_log_probs=True,
    )
    stream.prepare(0, types.SimpleNamespace(params=params))
    batch = next(stream)
    np.testing.assert_array_equal(batch["masked"], np.resize(WRITTEN, (4, 7)))
    assert not np.any(batch["prompt_masked"] & batch["masked"])  # the prompt mask stays on the prompt
    want = scorer(
        params, jnp.asarray(batch["tokens"]), jnp.asarray(SCORED.repeat(2, 0)), jnp.asarray(batch["prompt_masked"]),
        masked=jnp.asarray(batch["masked"]),
    )[0]  # fmt: skip
    np.testing.assert_allclose(batch["old_log_probs"], np.asarray(want), rtol=1e-6, atol=1e-6)


def test_stop_at_eos_is_refused_where_completions_have_no_eos(tmp_path):
    source = tiny_sudoku_config("in_place", tmp_path=tmp_path)
    config = rl_settings.rl_sections(source, checkpoint=str(tmp_path / "src"))
    assert config.rl.stop_at_eos is False  # Sudoku's default
    config.rl.stop_at_eos = True
    with pytest.raises(ValueError, match="stop_at_eos .* set it to False"):
        command.check_rl_config(config)
    countdown = rl_settings.rl_sections(tiny_countdown_config(tmp_path), checkpoint=str(tmp_path / "src"))
    assert countdown.rl.stop_at_eos is True  # d1's behaviour on Countdown
    command.check_rl_config(countdown)
