"""The train step (`training/train_state.py`): frozen leaves stay bit-identical, gradient accumulation equals the
full batch, non-finite steps are skipped."""

from __future__ import annotations

import _toy_train_worker as toy
import jax
import numpy as np
import pytest
from _training_helpers import (
    _create_state,
    _jit,
)

from hackable_diffusion.training import optimizers
from hackable_diffusion.training.train_state import make_train_step, step_key


@pytest.mark.slow
@pytest.mark.parametrize("name", ["adamw", "adafactor"])
def test_trainable_mask_keeps_frozen_params_bit_identical(name):
    params = jax.device_get(_jit(toy.init_fn)(jax.random.key(0)))

    def mask_fn(tree):  # frozen: the embedding and the experts' input projection
        mask = jax.tree.map(lambda _: True, tree)
        mask["embed"] = False
        mask["experts"]["w_in"] = False
        return mask

    # adamw gets the mask as a pytree of bools, adafactor as a callable.
    mask = mask_fn(params) if name == "adamw" else mask_fn
    tx = optimizers.make_optimizer(toy.optimizer_cfg(10, name=name, warmup_steps=0), trainable_mask=mask)
    state = _create_state(tx)
    step = _jit(make_train_step(toy.make_loss_fn(), tx, trainable_mask=mask))
    it = toy.make_iterator()
    batch = next(it)
    grads = _jit(jax.grad(lambda p: toy.make_loss_fn()(p, batch, step_key(state.rng, state.step))[0]))(state.params)
    for i in range(3):
        state, m = step(state, batch if i == 0 else next(it))
        assert bool(m["finite"])
        if i == 0:  # grad_norm covers the trainable params only
            trainable = [grads["out"]["kernel"], grads["out"]["bias"], grads["experts"]["w_out"]]
            np.testing.assert_allclose(m["grad_norm"], np.sqrt(sum(np.sum(np.square(g)) for g in trainable)), rtol=1e-5)
    assert np.array_equal(state.params["embed"], params["embed"])
    assert np.array_equal(state.params["experts"]["w_in"], params["experts"]["w_in"])
    assert not np.array_equal(state.params["out"]["kernel"], params["out"]["kernel"])
    assert not np.array_equal(state.params["experts"]["w_out"], params["experts"]["w_out"])


@pytest.mark.slow
def test_grad_accumulation_matches_full_batch_and_non_finite_steps_are_skipped():
    tx = optimizers.make_optimizer(toy.optimizer_cfg(10, warmup_steps=0))
    loss_fn = toy.make_loss_fn(noise=0.0)  # rng-free, so micro-batch keys do not matter
    batch = next(toy.make_iterator(global_batch=16))
    state = _create_state(tx, use_ema=True)
    steps = {accum: _jit(make_train_step(loss_fn, tx, grad_accum_steps=accum, ema_decay=0.5)) for accum in (1, 2)}
    (s1, m1), (s2, m2) = steps[1](state, batch), steps[2](state, batch)
    assert bool(m1["finite"]) and bool(m2["finite"])
    np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-6)
    np.testing.assert_allclose(m1["grad_norm"], m2["grad_norm"], rtol=1e-5)
    np.testing.assert_allclose(m1["ce"], m2["ce"], rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), s1.params, s2.params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), s1.ema_params, s2.ema_params)
    assert int(s1.step) == 1 and not np.array_equal(s1.params["embed"], state.params["embed"])
    with pytest.raises(ValueError, match="not divisible by grad_accum_steps=3"):
        _jit(make_train_step(loss_fn, tx, grad_accum_steps=3, ema_decay=0.5))(state, batch)

    # One NaN weight poisons loss and grads: the state comes back unchanged, flagged non-finite.
    poisoned = dict(batch, weight=np.where(np.arange(16) == 3, np.nan, 1.0).astype(np.float32))
    s_bad, m_bad = steps[1](s1, poisoned)
    assert not bool(m_bad["finite"]) and np.isnan(m_bad["loss"])
    jax.tree.map(np.testing.assert_array_equal, s_bad, s1)
