"""The distillation teacher compiles its trajectory programs once: batches of other prompts (other prefix masks and
canvas givens) and the batches of a second pool build no program (`training.compilations.count_compilations`)."""

import jax
import numpy as np
import pytest
from _tiny_configs import tiny_text_config

from hackable_diffusion import builders, experiment
from hackable_diffusion.distill import teacher
from hackable_diffusion.models import transformer as T
from hackable_diffusion.training.compilations import count_compilations

CANVAS = 8


def prompt_batches(seed: int, batch: int = 4, length: int = 32):
    """Training-like batches: random tokens, a random number of leading padding positions (weight 0)."""
    rng = np.random.default_rng(seed)
    while True:
        tokens = rng.integers(5, 60, (batch, length)).astype(np.int32)
        weights = (np.arange(length)[None] >= rng.integers(0, length - CANVAS, (batch, 1))).astype(np.float32)
        yield {"tokens": tokens, "weights": weights}


@pytest.mark.slow
def test_teacher_trajectories_compile_once(tmp_path):
    config = tiny_text_config("masking", moe=False)
    exp = experiment.build(config, str(tmp_path), inference=True)
    params = T.init_params(exp.model, jax.random.key(0))  # random weights: the programs are what is counted
    sampler = builders.build_sampler(config, exp.process)

    def pool(seed: int, size: int) -> dict:
        return teacher.build_pool(
            model=exp.model,
            params=params,
            sampler=sampler,
            prompt_batches=prompt_batches(seed),
            canvas_len=CANVAS,
            pool_size=size,
            seed=seed,
            workdir=None,
            meta={},
        )

    first = pool(0, 4)
    assert first["trajectory"].shape == (4, sampler.num_steps + 1, CANVAS)
    for second_pass in (False, True):
        with count_compilations() as log:
            pool(1, 10)  # three batches, the last cut to 2 rows on the host
            pool(2, 7)
        assert log.count == 0, f"{'a second pass' if second_pass else 'the pools'} recompiled: {log.summary()}"
