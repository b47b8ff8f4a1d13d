"""Property-based check (hypothesis) of checkpoints (`training/checkpointing.py`): random trees of leaves round-trip
bit for bit."""

import jax.numpy as jnp
import numpy as np
import pytest
from _hypothesis_profiles import THOROUGH
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.slow

leaf_strategy = st.tuples(
    st.sampled_from(["float32", "bfloat16", "int32"]), st.lists(st.integers(1, 5), min_size=0, max_size=3)
)


@settings(max_examples=THOROUGH and 200 or 3)  # orbax saves cost about a second each
@given(
    leaves=st.dictionaries(st.sampled_from(list("abcdef")), leaf_strategy, min_size=1, max_size=4),
    step=st.integers(0, 10_000),
    seed=st.integers(0, 999),
)
def test_checkpoint_round_trip_is_bit_exact(tmp_path_factory, leaves, step, seed):
    from hackable_diffusion.training import checkpointing

    rng = np.random.default_rng(seed)
    tree = {
        name: jnp.asarray((rng.standard_normal(shape) * 100).astype(np.float32)).astype(dtype)
        for name, (dtype, shape) in leaves.items()
    }
    directory = tmp_path_factory.mktemp("ckpt")
    saver = checkpointing.Checkpointer(str(directory), async_save=False)
    saver.save(step, tree)
    restored = saver.restore(step, checkpointing.abstract_like(tree))
    saver.close()
    for name, value in tree.items():
        assert restored[name].dtype == value.dtype
        ours, theirs = np.atleast_1d(np.asarray(restored[name])), np.atleast_1d(np.asarray(value))
        assert np.array_equal(ours.view(np.uint8), theirs.view(np.uint8)), name
