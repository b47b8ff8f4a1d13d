"""Token temperature schedules (`sampling/temperature.py`) and early-stopping rules (`sampling/early_stopping.py`)
per row, on hand-made logits."""

import jax.numpy as jnp
import numpy as np
import pytest
from _tiny_sampling import logits_from_probs

from hackable_diffusion.sampling import early_stopping as E
from hackable_diffusion.sampling import temperature as TEMP


def test_annealed_temperature_closed_form():
    temp = TEMP.AnnealedTemperature()
    np.testing.assert_allclose([temp(1.0), temp(0.0), temp(1 - 47 / 48)], [0.8, 0.4, 0.8 - 0.4 * 47 / 48], rtol=1e-6)
    np.testing.assert_allclose(TEMP.AnnealedTemperature(0.2, 1.0, 2.0)(0.5), 0.2 + 0.8 * 0.75, rtol=1e-6)
    np.testing.assert_allclose(TEMP.ConstantTemperature(0.7)(jnp.zeros(3)), [0.7] * 3)
    with pytest.raises(ValueError, match="min_temperature"):
        TEMP.AnnealedTemperature(0.9, 0.8)


def test_early_stopping_rules_per_row():
    sharp = logits_from_probs(np.array([[1 - 3e-9, 1e-9, 1e-9, 1e-9], [1e-9, 1 - 3e-9, 1e-9, 1e-9]]))
    flat = jnp.zeros((2, 4))
    logits = jnp.stack([sharp, flat])  # row 0 confident (argmax [0, 1]), row 1 uniform (argmax [0, 0])
    previous = jnp.array([[0, 1], [0, 0]])
    current = jnp.array([[0, 2], [0, 0]])
    free = jnp.ones((2, 2), bool)
    np.testing.assert_array_equal(E.TokenStability()(logits, previous, current, free), [True, True])
    np.testing.assert_array_equal(E.TokenStability(against="output")(logits, previous, current, free), [False, True])
    np.testing.assert_array_equal(E.EntropyBelow(0.005)(logits, previous, current, free), [True, False])
    np.testing.assert_array_equal(
        E.Chained([E.TokenStability(), E.EntropyBelow()])(logits, previous, current, free), [True, False]
    )
    # Fixed positions do not count: row 0 disagrees only at a fixed position.
    np.testing.assert_array_equal(
        E.TokenStability()(logits, jnp.array([[0, 3], [1, 1]]), current, jnp.array([[True, False], [True, True]])),
        [True, False],
    )
    assert not E.NoEarlyStop()(logits, previous, current, free).any()
    with pytest.raises(ValueError, match="non-empty"):
        E.Chained(())
