"""DiffusionGemma's self-conditioning of the canvas embeddings (docs/reference.md §1.6).

The previous step's prediction is fed back as its expected embedding `signal = sqrt(d) * softmax(logits) @ E`
(`Transformer.encode_probs`), and the canvas input embeddings become

    post_norm(E[tok] * sqrt(d) + ffw(pre_norm(signal)))

with `pre_norm` an RMSNorm with scale, `ffw` a gated-GELU FFN and `post_norm` a scale-free RMSNorm. Parameter
names match the reference (`self_conditioner/{pre_norm/scale, ffw/gating_einsum, ffw/linear}`).

"No signal" is a choice of the caller, not of this module (`null_signal`): exact zeros as gemma.diffusion does at
inference (zero through the bias-free FFN adds exactly 0, so the canvas embedding is just the normalised token
embedding), or the mean embedding (`encode_probs` of a uniform distribution) as the hackable_diffusion adapter
does in training. In both cases the canvas embeddings pass through the scale-free post-norm.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from jaxtyping import Array, Float

from hackable_diffusion.models.layers import FeedForward, RMSNorm, rms_normalize

NULL_SIGNALS = ("zeros", "mean_embedding")


class SelfConditioning(nn.Module):
    hidden_dim: int
    eps: float = 1e-6
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, token_embeddings: Float[Array, "b l d"], signal: Float[Array, "b l d"]) -> Float[Array, "b l d"]:
        h = RMSNorm(eps=self.eps, param_dtype=self.param_dtype, name="pre_norm")(signal.astype(self.dtype))
        h = FeedForward(self.hidden_dim, dtype=self.dtype, param_dtype=self.param_dtype, name="ffw")(h)
        return rms_normalize(token_embeddings + h, self.eps)
