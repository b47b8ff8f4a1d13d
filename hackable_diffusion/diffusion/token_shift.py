"""Token shift: a diffusion model that reads each position's prediction from the logits one position to its left.

Follows Fast-dLLM v2 (Wu et al. 2025, "Fast-dLLM v2: efficient block-diffusion LLM", arXiv 2509.26328) and
DiffuLLaMA (Gong et al. 2024, arXiv 2410.17891), which adapt an autoregressive (AR) model into a diffusion model
without changing what its output head means: the logits at position i - 1 predict the token at i, as in the AR
model. Inside a canvas the decoder's logits at i - 1 predict position i; the first position of a canvas reads the
logits of the last clean token before it (the encoder's logits at that slot in training, the prefill's or the last
committed canvas's last real token when sampling), which see only the clean prefix.

Where this differs from Fast-dLLM v2: there the first position of a block reads the clean stream's logits through a
concatenated clean + noisy sequence; here the encoder pass of block diffusion already computes them (it gives the
encoder's AR loss), so the shift costs no extra forward pass in training and one unembedding of the committed canvas
per canvas when sampling. The first token of a training sequence has no token before it and is not scored.

A masking or uniform ELBO stays a bound under the shift: every prediction is still a function of the noisy canvas
and the clean prefix only.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float


def shift_sequence_logits(
    decoder_logits: Float[Array, "b l v"], before_logits: Float[Array, "b l v"] | None, canvas_len: int
) -> Float[Array, "b l v"]:
    """Training: the prediction for position i of a sequence cut into canvases of `canvas_len`.

    Inside a canvas it is `decoder_logits[:, i - 1]`; at a canvas start i > 0 it is `before_logits[:, i - 1]` (the
    encoder's logits of the clean token before the canvas; None: one canvas per sequence, so only i = 0 is a start).
    Position 0 gets zeros: it has no token before it, and callers leave it out of the loss."""
    b, l, v = decoder_logits.shape
    if l % canvas_len:
        raise ValueError(f"sequence length {l} is not a multiple of canvas_len={canvas_len}.")
    pad = ((0, 0), (1, 0), (0, 0))
    shifted = jnp.pad(decoder_logits[:, :-1], pad)
    if before_logits is None or canvas_len == l:
        return shifted
    if before_logits.shape != decoder_logits.shape:
        raise ValueError(f"before_logits {before_logits.shape} must match decoder_logits {decoder_logits.shape}.")
    starts = (jnp.arange(l) % canvas_len == 0)[None, :, None]
    return jnp.where(starts, jnp.pad(before_logits[:, :-1], pad).astype(shifted.dtype), shifted)


def first_scored(length: int) -> Bool[Array, " l"]:
    """False at position 0 (no token before it), True after: the positions a shifted prediction exists for."""
    return jnp.arange(length) > 0


def shift_canvas_logits(canvas_logits: Float[Array, "b c v"], before: Float[Array, "b v"]) -> Float[Array, "b c v"]:
    """Sampling: position j of the canvas reads the canvas logits at j - 1, position 0 the logits `before` of the
    last real token before the canvas."""
    if before.shape != (canvas_logits.shape[0], canvas_logits.shape[-1]):
        raise ValueError(
            f"the logits before the canvas must have shape {(canvas_logits.shape[0], canvas_logits.shape[-1])}, got "
            f"{before.shape}."
        )
    return jnp.concatenate([before[:, None].astype(canvas_logits.dtype), canvas_logits[:, :-1]], axis=1)


def last_real_logits(
    logits: Float[Array, "b p v"], token_mask: Bool[Array, "b p"], previous: Float[Array, "b v"] | None = None
) -> Float[Array, "b v"]:
    """The logits at each row's last real (mask True) position of right-padded tokens; a row with none keeps
    `previous` (a row that committed an all-PAD canvas)."""
    count = jnp.sum(token_mask, axis=-1)
    index = jnp.maximum(count - 1, 0)
    last = jnp.take_along_axis(logits, index[:, None, None], axis=1)[:, 0].astype(jnp.float32)
    if previous is None:
        return last
    return jnp.where((count > 0)[:, None], last, previous.astype(jnp.float32))
