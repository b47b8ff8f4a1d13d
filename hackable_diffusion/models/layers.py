"""Basic layers of the Gemma-4-style backbone: RMSNorm, embedder, gated-GELU FFN, rotary embeddings.

Follows docs/reference.md §1:
- RMSNorm is `x * rsqrt(mean(x^2) + eps) * scale` with `scale` initialised to 1 and used directly (Gemma 2/3 use
  `1 + scale`); a scale-free variant is used for values, the router input and self-conditioning.
- The embedder scales looked-up rows by sqrt(d) and is tied to the output head.
- FFNs are `gelu_tanh(x W_gate) * (x W_up) @ W_down` with the gemma parameter layout `gating_einsum (2, F, D)`,
  `linear (F, D)`.
- RoPE is a half-split rotation over pairs (j, j + H/2); only the first `int(proportion * H / 2)` pairs rotate,
  with frequencies `base^(-2j/H)` (H the full head dim), the others are identity (Gemma-4 partial rotary).
All matmuls take operands in the compute dtype and accumulate in float32 (`preferred_element_type`), which keeps
bf16 compute accurate and fast on CPU (XLA:CPU's bf16 matmuls are fast only with float32 accumulation).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


def einsum(eqn: str, x: Array, w: Array, dtype: Any) -> Array:
    """`jnp.einsum` in `dtype` with float32 accumulation, result cast back to `dtype`."""
    out = jnp.einsum(eqn, x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32)
    return out.astype(dtype)


WEIGHT_FIRST_MAX_TOKENS = 512


def weight_first(num_tokens: int) -> bool:
    """Whether a (tokens, D) x (F, D) product should be computed as (F, D) x (tokens, D) -> (F, tokens).

    Gemma's FFN weights keep the contracted D axis last. Inside the scanned layer loop XLA:CPU then copies (transposes)
    each layer's sliced weight before every matmul: for a decode step that copy is nearly all of the step's time (see
    experiments/speed/profile_steps.py). With the weight as the left operand its layout is already the canonical one and
    only the small activation is transposed: measured 6x faster for 1 token and 2.4x for 64 tokens over 6 layers,
    but 13% slower for 2048 tokens (training), hence the threshold on the (static) token count.
    """
    return num_tokens <= WEIGHT_FIRST_MAX_TOKENS


def token_einsum(eqn: str, x: Array, w: Array, dtype: Any, token_dims: int = 2) -> Array:
    """`einsum` with the leading `token_dims` axes of x flattened into one token axis `t` (restored after).

    `eqn` is written for the flattened x (e.g. "td,fd->tf"). XLA:CPU computes the weight gradient of a
    (b, l, d) x (d, f) product as a dot over two contracting axes, about 2.5x slower than the same product on
    (b*l, d) (measured by experiments/training/bench_moe.py's author), so every projection runs on flat tokens.
    """
    lead = x.shape[:token_dims]
    flat = x.reshape((-1,) + x.shape[token_dims:])
    out = einsum(eqn, flat, w, dtype)
    return out.reshape(lead + out.shape[1:])


PER_HEAD_MAX_TOKENS = 16


def to_heads(x: Float[Array, "b l d"], w: Float[Array, "... d h"], dtype: Any) -> Float[Array, "b l ... h"]:
    """x projected by a per-head weight w (leading head axes, then D, then H): `token_einsum("td,...dh->t...h")`.

    Gemma's attention weights keep the contracted D axis between the head axes and H, so inside the scanned layer loop
    XLA:CPU copies (transposes) each layer's q/kv weights before a product with few tokens, as it did the FFN weights
    (`weight_first`); the copy was most of an AR decode step. For at most `PER_HEAD_MAX_TOKENS` tokens the product is
    a dot batched over the heads, which takes each head's (D, H) matrix as stored (the tokens are broadcast over the
    heads instead: cheap for few tokens). Measured on an 80M model's AR step (3 layers of width 1024): 34 -> 14 ms,
    82% of the machine's measured bandwidth (results/text/README.md). Tested equal to the plain einsum
    (tests/models/test_attention_impl.py).
    """
    b, l, d = x.shape
    heads, h = w.shape[:-2], w.shape[-1]
    if b * l > PER_HEAD_MAX_TOKENS:
        letters = "ckn"[3 - len(heads) :]
        return token_einsum(f"td,{letters}dh->t{letters}h", x, w, dtype)
    stacked = w.reshape((-1, d, h)).astype(dtype)
    tokens = jnp.broadcast_to(x.reshape(1, b * l, d).astype(dtype), (stacked.shape[0], b * l, d))
    out = jax.lax.dot_general(tokens, stacked, (((2,), (1,)), ((0,), (0,))), preferred_element_type=jnp.float32)
    return jnp.transpose(out.astype(dtype), (1, 0, 2)).reshape((b, l) + heads + (h,))


def from_heads(x: Float[Array, "b l n h"], w: Float[Array, "n h d"], dtype: Any) -> Float[Array, "b l d"]:
    """The attention output projection `token_einsum("tnh,nhd->td")`; for few tokens a dot batched over the heads
    and a sum over them (the same reason as `to_heads`)."""
    b, l, n, h = x.shape
    if b * l > PER_HEAD_MAX_TOKENS:
        return token_einsum("tnh,nhd->td", x, w, dtype)
    per_head = jnp.transpose(x.reshape(b * l, n, h).astype(dtype), (1, 0, 2))
    out = jax.lax.dot_general(
        per_head, w.astype(dtype), (((2,), (1,)), ((0,), (0,))), preferred_element_type=jnp.float32
    )
    return jnp.sum(out, axis=0).astype(dtype).reshape(b, l, w.shape[-1])


def rms_normalize(x: Array, eps: float) -> Array:
    """Scale-free RMS normalisation computed in float32, returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return y.astype(x.dtype)


class RMSNorm(nn.Module):
    """RMSNorm with an optional learned scale (init 1, applied as `* scale`)."""

    with_scale: bool = True
    eps: float = 1e-6
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Float[Array, "... d"]) -> Float[Array, "... d"]:
        y = rms_normalize(x, self.eps)
        if not self.with_scale:
            return y
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.param_dtype)
        return (y.astype(jnp.float32) * scale.astype(jnp.float32)).astype(x.dtype)


class Embedder(nn.Module):
    """Token embedding scaled by sqrt(d), tied output head, and the expected embedding of a distribution."""

    vocab_size: int
    embed_dim: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def setup(self):
        self.input_embedding = self.param(
            "input_embedding",
            nn.initializers.normal(stddev=self.embed_dim**-0.5),
            (self.vocab_size, self.embed_dim),
            self.param_dtype,
        )

    def encode(self, tokens: Int[Array, "*b"]) -> Float[Array, "*b d"]:
        rows = jnp.take(self.input_embedding, tokens, axis=0).astype(self.dtype)
        return rows * jnp.asarray(self.embed_dim**0.5, self.dtype)

    def decode(self, x: Float[Array, "*b d"]) -> Float[Array, "*b v"]:
        """Tied head: x @ E^T, float32 logits (computed on flattened tokens, see `token_einsum`)."""
        flat = x.reshape(-1, x.shape[-1]).astype(self.dtype)
        logits = jnp.einsum(
            "td,vd->tv", flat, self.input_embedding.astype(self.dtype), preferred_element_type=jnp.float32
        )
        return logits.reshape(x.shape[:-1] + (self.vocab_size,))

    def encode_probs(self, probs: Float[Array, "*b v"]) -> Float[Array, "*b d"]:
        """sqrt(d) * probs @ E: the expected (scaled) embedding under a predicted distribution."""
        out = jnp.einsum(
            "...v,vd->...d",
            probs.astype(self.dtype),
            self.input_embedding.astype(self.dtype),
            preferred_element_type=jnp.float32,
        )
        return (out * self.embed_dim**0.5).astype(self.dtype)

    def mean_embedding(self) -> Float[Array, "d"]:
        """sqrt(d) * mean_v E[v]: what `encode_probs` gives for uniform probabilities."""
        return (jnp.mean(self.input_embedding.astype(jnp.float32), axis=0) * self.embed_dim**0.5).astype(self.dtype)

    def __call__(self, tokens):
        return self.encode(tokens)


class FeedForward(nn.Module):
    """Gated-GELU (tanh) FFN with gemma's parameter layout: gating_einsum (2, F, D), linear (F, D)."""

    hidden_dim: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Float[Array, "... d"]) -> Float[Array, "... d"]:
        d = x.shape[-1]
        gating = self.param(
            "gating_einsum", nn.initializers.normal(stddev=d**-0.5), (2, self.hidden_dim, d), self.param_dtype
        )
        linear = self.param(
            "linear", nn.initializers.normal(stddev=self.hidden_dim**-0.5), (self.hidden_dim, d), self.param_dtype
        )
        lead = x.shape[:-1]
        flat = x.reshape(-1, d)
        if weight_first(flat.shape[0]):  # decode / canvas steps: see `weight_first`
            gate_up = einsum("gfd,td->gft", gating, flat, self.dtype)
            hidden = jax.nn.gelu(gate_up[0], approximate=True) * gate_up[1]
            return einsum("ft,fd->td", hidden, linear, self.dtype).reshape(lead + (d,))
        gate_up = einsum("td,gfd->tgf", flat, gating, self.dtype)
        hidden = jax.nn.gelu(gate_up[:, 0], approximate=True) * gate_up[:, 1]
        return einsum("tf,fd->td", hidden, linear, self.dtype).reshape(lead + (d,))


def rope_inverse_frequencies(head_dim: int, base: float, proportion: float) -> Float[Array, "h2"]:
    """Per-pair angular frequencies; pairs beyond `int(proportion * head_dim / 2)` get 0 (identity)."""
    half = head_dim // 2
    rotated = int(proportion * head_dim // 2)
    idx = jnp.arange(half, dtype=jnp.float32)
    freqs = base ** (-2.0 * idx / head_dim)
    return jnp.where(idx < rotated, freqs, 0.0)


def apply_rope(
    x: Float[Array, "b l n h"], positions: Int[Array, "b l"], base: float, proportion: float
) -> Float[Array, "b l n h"]:
    """Half-split rotary embedding: rotates pairs (j, j + h/2) by angle position * freq_j (in float32)."""
    head_dim = x.shape[-1]
    freqs = rope_inverse_frequencies(head_dim, base, proportion)
    angles = positions.astype(jnp.float32)[..., None] * freqs  # b l h/2
    sin, cos = jnp.sin(angles)[:, :, None, :], jnp.cos(angles)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    first, second = jnp.split(x32, 2, axis=-1)
    out = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return out.astype(x.dtype)
