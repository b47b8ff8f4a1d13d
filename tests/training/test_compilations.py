"""`training.compilations.count_compilations`: one count per program built, named, none for a program already built."""

import jax
import jax.numpy as jnp

from hackable_diffusion.training.compilations import count_compilations


def test_counts_each_new_shape_once_and_a_compiled_one_not_at_all():
    @jax.jit
    def scaled_by_three(x):
        return x * 3

    inputs = [jnp.ones(n) for n in (3, 5)]  # made outside the block: their own small programs are not counted
    with count_compilations() as first:
        for x in inputs + inputs:
            scaled_by_three(x)
    assert first.count == 2 and first.by_name() == {"jit(scaled_by_three)": 2}
    assert len(first.seconds) == 2 and first.total_seconds > 0 and 0 <= first.cache_hits <= first.count
    with count_compilations() as second:
        for x in inputs:
            scaled_by_three(x)
    assert second.count == 0 and "0 compilations" in second.summary()
    assert first.trace_seconds > 0 and second.trace_seconds == 0  # a compiled call is not traced again
