import numpy as np
import pytest

from hackable_diffusion.rl.advantages import group_advantages
from hackable_diffusion.rl.rollouts import prompt_indices


def test_advantages_vanish_when_rewards_tie():
    adv, valid = group_advantages(np.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    np.testing.assert_array_equal(valid, [False, False, True])
    np.testing.assert_array_equal(adv[:2], 0.0)
    assert adv[2, 1] > 0 > adv[2, 0]


def test_std_and_mean_only_scales():
    r = np.array([[0.0, 1.0, 0.5, 0.5]])
    adv, _ = group_advantages(r, scale="std")
    np.testing.assert_allclose(adv, (r - 0.5) / (r.std() + 1e-6), rtol=1e-6)
    adv, _ = group_advantages(r, scale="none")
    np.testing.assert_allclose(adv, r - 0.5)
    with pytest.raises(ValueError, match="scale"):
        group_advantages(r, scale="max")
    with pytest.raises(ValueError, match="completions per prompt"):
        group_advantages(np.zeros((3,)))
    adv, valid = group_advantages(np.array([[1.0], [0.0]]))  # groups of one (expert iteration): no relative signal
    assert not valid.any() and not adv.any()


def test_each_group_is_centred_on_its_own_mean_when_groups_and_group_size_differ():
    """Three groups of four (not square, so a mean broadcast along the wrong axis cannot pass): written from the
    definition A_ij = r_ij - mean_j r_ij, and with `std` divided by the group's population standard deviation."""
    r = np.array([[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.2, 0.4, 0.6, 0.8]])
    expected_none = [[-0.5, 0.5, 0.5, -0.5], [0.25, 0.25, 0.25, -0.75], [-0.3, -0.1, 0.1, 0.3]]
    adv, valid = group_advantages(r)
    np.testing.assert_allclose(adv, expected_none, atol=1e-6)
    assert valid.all()
    spreads = [0.5, np.sqrt(3) / 4, np.sqrt(0.05)]  # sqrt(mean((r - mean)^2)) per group
    adv, _ = group_advantages(r, scale="std")
    np.testing.assert_allclose(adv, np.array(expected_none) / (np.array(spreads)[:, None] + 1e-6), rtol=1e-5)


def test_group_shapes_and_keyword_only_options():
    with pytest.raises(ValueError, match="completions per prompt"):
        group_advantages(np.zeros((3, 0)))  # groups of no completion
    adv, valid = group_advantages(np.zeros((0, 4)))  # no group at all: nothing to do, not an error
    assert adv.shape == (0, 4) and valid.shape == (0,)
    with pytest.raises(TypeError):
        group_advantages(np.zeros((1, 2)), "std")  # the scale is named, never positional


def test_prompt_order_is_a_permutation_per_epoch_and_depends_on_the_seed():
    first_epoch = np.concatenate([prompt_indices(10, r, 5, seed=0) for r in range(2)])
    assert sorted(first_epoch) == list(range(10))
    assert not np.array_equal(prompt_indices(10, 0, 5, seed=0), prompt_indices(10, 0, 5, seed=1))
    np.testing.assert_array_equal(prompt_indices(10, 3, 5, seed=0), prompt_indices(10, 3, 5, seed=0))
