"""Optimizers and learning-rate schedules (`training/optimizers.py`)."""

from __future__ import annotations

import math

import _toy_train_worker as toy
import numpy as np
import pytest

from hackable_diffusion.training import optimizers


def test_unknown_optimizer_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown optimizer name 'sgdd'.*adafactor.*adamw"):
        optimizers.make_optimizer(toy.optimizer_cfg(10, name="sgdd"))


def test_warmup_cosine_schedule_values():
    cfg = toy.optimizer_cfg(110, peak_lr=1.0, end_lr=0.1, warmup_steps=10)
    lr = optimizers.make_lr_schedule(cfg)
    expected = {
        0: 0.0,
        5: 0.5,
        10: 1.0,
        60: 0.1 + 0.9 * 0.5,
        35: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)),
        110: 0.1,
        500: 0.1,
    }
    for step, value in expected.items():
        np.testing.assert_allclose(float(lr(step)), value, rtol=1e-6, atol=1e-7, err_msg=f"step {step}")
