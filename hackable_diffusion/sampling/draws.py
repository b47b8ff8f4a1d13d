"""Drawing every canvas position's candidate token from its categorical distribution, one key per row.

A denoising step draws a candidate at every position of the canvas from softmax(shaped logits) over the whole
vocabulary: for DiffusionGemma's canvas of 256 and a 262k vocabulary that is 67M categorical weights per step, as many
as the output head's matmul has outputs. Two ways to draw, the same distribution:

* `GumbelMax` (default): argmax(logits + Gumbel noise), `jax.random.categorical`, as the reference sampler
  (gemma `gemma/diffusion/_sampler.py`) does. It needs one random number and two logarithms per vocabulary entry:
  on a 2-core CPU a denoising step of an 80M model (canvas 256, 32k vocabulary) takes 494 ms with it, 370 ms with
  the draw below (results/text/README.md).
* `BlockedInverseCdf`: inverse-CDF sampling in two levels with two uniforms per position: the vocabulary is cut
  into blocks of `block` ids, a block is drawn with probability its mass, then an id inside it with probability
  proportional to its weight. P(id) = mass(block)/total x weight(id)/mass(block) = weight(id)/total: the exact
  categorical, with one exponential per entry and no per-entry random numbers. Not in the reference. It draws other
  tokens than `GumbelMax` for the same key, so seeded outputs differ between the two.

Both take the (b, c, v) float32 logits, a (b,) array of row keys and return (b, c) int32 ids; logits of -1e30
(forbidden tokens) are never drawn by either.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


@dataclasses.dataclass(frozen=True)
class GumbelMax:
    """argmax(logits + Gumbel noise): `jax.random.categorical` with each row's key (the reference's draw)."""

    def __call__(self, keys: Array, logits: Float[Array, "b c v"]) -> Int[Array, "b c"]:
        draws = jax.vmap(lambda k, x: jax.random.categorical(k, x, axis=-1))(keys, logits)
        return draws.astype(jnp.int32)


def _first_above(cumulative: Float[Array, "... n"], threshold: Float[Array, "..."], mass: Float[Array, "... n"]):
    """Index of the first entry whose cumulative sum exceeds `threshold`, never one with zero mass: rounding can put
    the threshold at or past the total, so the count is capped at the last entry that has mass."""
    count = jnp.sum(cumulative <= threshold[..., None], axis=-1)
    n = mass.shape[-1]
    last_with_mass = n - 1 - jnp.argmax(jnp.flip(mass > 0, axis=-1), axis=-1)
    return jnp.minimum(count, last_with_mass)


@dataclasses.dataclass(frozen=True)
class BlockedInverseCdf:
    """The exact categorical by two-level inverse CDF (see the module docstring); `block` ids per block."""

    block: int = 128

    def __post_init__(self):
        if not (isinstance(self.block, int) and self.block >= 1):
            raise ValueError(f"BlockedInverseCdf.block must be an int >= 1, got {self.block!r}.")

    def __call__(self, keys: Array, logits: Float[Array, "b c v"]) -> Int[Array, "b c"]:
        b, c, v = logits.shape
        g = min(self.block, v)
        padded = -(-v // g) * g
        x = logits.astype(jnp.float32)
        if padded != v:  # a vocabulary that the block does not divide: weightless ids at the end
            x = jnp.pad(x, ((0, 0), (0, 0), (0, padded - v)), constant_values=-jnp.inf)
        weights = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True)).reshape(b, c, padded // g, g)
        block_mass = jnp.sum(weights, axis=-1)  # (b, c, blocks)
        u = jax.vmap(lambda k: jax.random.uniform(k, (c, 2)))(keys)  # (b, c, 2), in [0, 1)
        block_cdf = jnp.cumsum(block_mass, axis=-1)
        chosen = _first_above(block_cdf, u[..., 0] * block_cdf[..., -1], block_mass)
        inside = jnp.take_along_axis(weights, chosen[..., None, None], axis=2)[:, :, 0]  # (b, c, g)
        inside_cdf = jnp.cumsum(inside, axis=-1)
        offset = _first_above(inside_cdf, u[..., 1] * inside_cdf[..., -1], inside)
        return (chosen * g + offset).astype(jnp.int32)


DRAWS = {"gumbel_max": GumbelMax, "blocked_inverse_cdf": BlockedInverseCdf}


def make_draw(name: str, **kwargs) -> GumbelMax | BlockedInverseCdf:
    """`config.sampler.draw` -> the draw; a clear error listing the choices."""
    if name not in DRAWS:
        raise ValueError(f"unknown sampler draw {name!r}; choose one of {sorted(DRAWS)}.")
    return DRAWS[name](**kwargs)
