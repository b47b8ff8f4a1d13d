"""Per-row PRNG keys: every random draw of a row comes from its own key, so a row samples the same tokens alone or
inside any batch.

`row_keys` makes the typed keys the samplers use (row i of a single key is fold_in(key, i)); `row_key_data` makes
their raw data on the host, in blocks of `ROW_KEY_BLOCK` rows, so that any number of rows runs one compiled program.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int


def row_keys(key: Any, batch_size: int) -> Array:
    """One typed PRNG key per row: an int seed or a single key gives fold_in(key, row); (b,) keys are used as is.

    To reproduce a row alone, pass that row's key (e.g. `keys[i:i+1]`), not the batch's single key.
    """
    if isinstance(key, (int, np.integer)):
        key = jax.random.key(int(key))
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.dtype != jnp.uint32 or key.shape[-1:] != (2,):
            raise ValueError(
                f"key must be an int seed, a jax.random.key or raw uint32 key data, got dtype {key.dtype} "
                f"shape {key.shape}."
            )
        key = jax.random.wrap_key_data(key)
    if key.ndim == 0:
        return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(batch_size))
    if key.shape != (batch_size,):
        raise ValueError(
            f"got {key.shape[0] if key.ndim else 1} keys for a batch of {batch_size} rows; pass one key "
            f"per row or a single key."
        )
    return key


ROW_KEY_BLOCK = 64  # `row_key_data` folds row indices in blocks of this many: one compiled program for any count


@jax.jit
def _row_key_block(key: Array, start: Int[Array, ""]) -> Array:
    rows = start + jnp.arange(ROW_KEY_BLOCK)
    return jax.random.key_data(jax.vmap(lambda i: jax.random.fold_in(key, i))(rows))


def row_key_data(key: Any, count: int) -> np.ndarray:
    """The raw data ((count, 2) uint32, on the host) of `row_keys(key, count)`: row i is fold_in(key, i). Made in
    blocks of ROW_KEY_BLOCK rows, so any count runs the same compiled program (`row_keys(key, count)` compiles one per
    count), and indexed, padded and sliced with numpy, never on the device; pass a slice as `key` to the samplers,
    which take raw key data."""
    typed = jax.random.key(int(key)) if isinstance(key, (int, np.integer)) else jnp.asarray(key)
    if not jnp.issubdtype(typed.dtype, jax.dtypes.prng_key):
        typed = jax.random.wrap_key_data(typed)
    if typed.ndim != 0:
        raise ValueError(f"row_key_data needs an int seed or a single key, got {typed.shape[0]} keys.")
    blocks = [np.asarray(_row_key_block(typed, np.int32(s))) for s in range(0, count, ROW_KEY_BLOCK)]
    return np.concatenate(blocks)[:count] if blocks else np.zeros((0, 2), np.uint32)
