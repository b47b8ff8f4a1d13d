"""Checkpoints (`training/checkpointing.py`): a corrupt latest checkpoint falls back to the one before, with a warning,
and is moved aside."""

from __future__ import annotations

import logging
import os
import shutil

import _toy_train_worker as toy
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _training_helpers import (
    _mesh,
)

from hackable_diffusion.training import checkpointing, optimizers, sharding
from hackable_diffusion.training.train_state import TrainState


@pytest.mark.slow
def test_corrupt_latest_checkpoint_falls_back_with_warning(tmp_path, caplog):
    mesh = _mesh(data=2, fsdp=2, tensor=2)
    tx = optimizers.make_optimizer(toy.optimizer_cfg(10))
    create = lambda: TrainState.create(toy.init_fn(jax.random.key(0)), tx, jax.random.key(1))  # noqa: E731
    abstract = jax.eval_shape(create)
    p_shard = sharding.param_shardings(abstract.params, toy.logical_axes_fn, mesh)
    s_shard = sharding.state_shardings(abstract, p_shard, mesh)
    state = jax.jit(create, out_shardings=s_shard, compiler_options=toy.FAST_COMPILE)()
    bump = jax.jit(
        lambda s: s.replace(step=s.step + 1, params=jax.tree.map(lambda x: x + 1.0, s.params)),
        out_shardings=s_shard,
        compiler_options=toy.FAST_COMPILE,
    )
    it = toy.make_iterator()
    ckpt = checkpointing.Checkpointer(str(tmp_path / "ckpt"), max_to_keep=3)
    saved = {}
    for step in (1, 2):
        next(it)
        state = bump(state)
        ckpt.save(step, state, it)
        saved[step] = (jax.device_get(state.params), it.get_state())
    bad = state.replace(params=jax.tree.map(lambda x: x * jnp.nan, state.params))
    with pytest.raises(checkpointing.NonFiniteStateError, match="refusing to checkpoint step 3"):
        ckpt.save(3, bad, it)
    ckpt.close()
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["1", "2"]
    # Damage step 2: truncate every array chunk file and delete its data-iterator item.
    for root, _, files in os.walk(tmp_path / "ckpt" / "2" / "state"):
        for f in files:
            if os.path.basename(root) == "d":
                path = os.path.join(root, f)
                os.truncate(path, os.path.getsize(path) // 2)
    shutil.rmtree(tmp_path / "ckpt" / "2" / "data")

    fresh_it = toy.make_iterator()
    ckpt = checkpointing.Checkpointer(str(tmp_path / "ckpt"), max_to_keep=3)
    with caplog.at_level(logging.WARNING, logger=checkpointing.logger.name):
        restored, step = ckpt.restore_latest(checkpointing.abstract_like(state), fresh_it, move_damaged=True)
    assert step == 1 and int(restored.step) == 1
    assert any("checkpoint step 2" in r.getMessage() and "falling back" in r.getMessage() for r in caplog.records)
    # The damaged step 2 is moved out of orbax's sight (kept, not deleted), with a warning saying where.
    assert ckpt.all_steps() == [1] and os.listdir(tmp_path / "ckpt_damaged") == ["2"]
    assert any("moved the damaged checkpoint step 2" in r.getMessage() for r in caplog.records)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored.params), saved[1][0])
    assert restored.params["experts"]["w_in"].sharding == state.params["experts"]["w_in"].sharding
    assert fresh_it.get_state() == saved[1][1]
    # Training on from step 1 saves step 2 again.
    next(fresh_it)
    ckpt.save(2, bump(restored), fresh_it)
    ckpt.wait()
    again, step = ckpt.restore_latest(checkpointing.abstract_like(state), toy.make_iterator())
    ckpt.close()
    assert step == 2
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(again.params), saved[2][0])
