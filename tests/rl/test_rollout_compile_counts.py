"""RL rollouts compile once: after the first rollout of a run, later rollouts (other prompts, other draws of dynamic
sampling, other completions) build no program (`training.compilations.count_compilations`)."""

import jax
import pytest
from _tiny_countdown import tiny_countdown_config

from hackable_diffusion.rl import settings as rl_settings
from hackable_diffusion.rl import command
from hackable_diffusion.training.compilations import count_compilations


@pytest.mark.slow
def test_rollouts_after_the_first_compile_nothing(tmp_path):
    config = rl_settings.rl_sections(tiny_countdown_config(tmp_path), checkpoint=str(tmp_path / "none"), steps=2)
    config.init.kind = "scratch"  # random weights of the run's shape: the programs are what is counted
    config.rl.prompts_per_rollout, config.rl.group_size, config.rl.inner_updates = 2, 2, 2
    config.rl.dynamic_sampling, config.rl.kl_beta = 1, 0.05  # one or two draws per rollout; reference log-probs
    run = command.setup(config, str(tmp_path / "rl"))
    params = run.trainable.init_fn(jax.random.key(0))
    run.stream.make_rollout(params, 0)
    with count_compilations() as log:
        batches = [run.stream.make_rollout(params, rollout) for rollout in (1, 2, 3)]
    assert log.count == 0, f"a rollout after the first recompiled: {log.summary()}"
    assert all(b["tokens"].shape == batches[0]["tokens"].shape for b in batches)
