"""Structure priors: what a task knows about where its tokens sit, given to the backbone through one hook.

Not in DiffusionGemma (text needs none). RoPE tells a layer the offset between two positions; in a grid puzzle,
whether two cells share a row, a column or a box depends on where they are, not only on their offset. A task that
knows such a structure registers a `PositionStructure` under a name (`register_structure`); a model config names one
(`model.structure="NAME:ARGUMENT"`, e.g. the Sudoku task's `"grid:9"`) and switches on its two uses:

* `model.structure_embeddings`: a learned embedding of each unit a position belongs to (its row, its column, its
  box) is added to the input, the tables initialised so that their sum has unit variance like sqrt(d)-scaled tokens;
* `model.structure_attention_bias` = b > 0: every attention layer adds a learned per-head bias to the logit of each
  query/key pair that shares a unit, a relational prior in the spirit of the puzzle graph that recurrent relational
  networks (Palm et al. 2018) pass messages over. Head h starts with bias b on unit h mod (U + 1) (U units; the
  remaining heads get no extra bias).

The parameters are named by the structure (`{name}_embedding/{unit}`, `attn/{name}_bias`), so a structure keeps its
checkpoints' names. The models layer defines no structure itself: `tasks/sudoku/structure.py` registers `grid`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Protocol

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int


class PositionStructure(Protocol):
    """Which units (a row, a column, ...) each position belongs to."""

    name: str  # names the parameters: `{name}_embedding/{unit}`, `attn/{name}_bias`
    units: tuple[str, ...]  # the units' names
    sizes: tuple[int, ...]  # how many values each unit takes

    def unit_indices(self, positions: Int[Array, "*b"]) -> tuple[Int[Array, "*b"], ...]:
        """Each unit's value (0..size-1) at every position."""


_STRUCTURES: dict[str, Callable[[str], PositionStructure]] = {}


def register_structure(name: str, make: Callable[[str], PositionStructure]) -> None:
    """Makes `model.structure="NAME:ARGUMENT"` build `make(ARGUMENT)` (a task calls this when it is imported)."""
    _STRUCTURES[name] = make


@functools.cache
def get_structure(spec: str) -> PositionStructure:
    """The structure `model.structure` names; ValueError when it is not registered or its argument is bad."""
    name, _, argument = spec.partition(":")
    if name not in _STRUCTURES:
        raise ValueError(
            f"model.structure={spec!r}: no structure {name!r} is registered (registered: {sorted(_STRUCTURES)}); a "
            "task registers its structures when it is imported (the Sudoku task: 'grid:SIDE')."
        )
    return _STRUCTURES[name](argument)


def shared_units(
    structure: PositionStructure, q_pos: Int[Array, "b l"], k_pos: Int[Array, "b s"]
) -> Float[Array, "b u l s"]:
    """1.0 where the query and key positions share unit u (in `structure.units` order), else 0.0."""
    pairs = zip(structure.unit_indices(q_pos), structure.unit_indices(k_pos))
    return jnp.stack([a[:, :, None] == b[:, None, :] for a, b in pairs], axis=1).astype(jnp.float32)


def unit_bias_init(value: float):
    """Initial (units, heads) bias weights: head h gets `value` on unit h mod (units + 1), the others nothing."""

    def init(key, shape, dtype=jnp.float32):
        del key
        units, heads = shape
        w = np.zeros(shape, np.float32)
        for h in range(heads):
            if h % (units + 1) < units:
                w[h % (units + 1), h] = value
        return jnp.asarray(w, dtype)

    return init


class StructureEmbedding(nn.Module):
    """The sum of a learned embedding per unit of each position (see the module docstring)."""

    structure: PositionStructure
    embed_dim: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, positions: Int[Array, "*b"]) -> Float[Array, "*b d"]:
        s = self.structure
        init = nn.initializers.normal(stddev=len(s.units) ** -0.5)  # the sum has unit variance
        out = 0.0
        for unit, size, index in zip(s.units, s.sizes, s.unit_indices(positions)):
            table = self.param(unit, init, (size, self.embed_dim), self.param_dtype)
            out = out + jnp.take(table, index, axis=0).astype(self.dtype)
        return out
