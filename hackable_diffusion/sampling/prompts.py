"""What the two decoders share: prompt batches in, a `GenerationResult` out, and the causal prefill between them.

Prompts are right-padded into (tokens, token_mask) (`pad_prompts`), so a batch of prompts of different lengths is
exact: pads are invalid cache slots, never attended, and positions count real tokens. An empty prompt (a row with no
real token) is rejected: start every prompt with BOS. `prefill` encodes the prompts causally into a fresh KV cache, the
first step of both the block-diffusion generator (`generate.py`) and the autoregressive decoder (`autoregressive.py`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from hackable_diffusion.data.tokenizers import PAD_ID
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import KVCache, init_cache


@dataclasses.dataclass(frozen=True)
class GenerationResult:
    """tokens: (b, max_new_tokens), PAD after each row's first stop token (kept) and after the generated length.
    lengths: tokens produced per row, up to and including the first stop token.
    steps: (b, num_canvases) denoising steps per canvas and row (0 once a row is done); None for the AR decoder.
    forward_passes: batched model calls (prefill + denoising steps + commits, or prefill + decode steps).
    trajectories: per canvas, the (steps, b, canvas_length) canvases after every step, if asked.
    cache: the final KV cache (prompt and every committed canvas)."""

    tokens: np.ndarray
    lengths: np.ndarray
    forward_passes: int
    steps: np.ndarray | None = None
    trajectories: tuple[np.ndarray, ...] | None = None
    cache: KVCache | None = None

    @property
    def num_canvases(self) -> int:
        return 0 if self.steps is None else self.steps.shape[1]


def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int = PAD_ID) -> tuple[Int[Array, "b p"], Bool[Array, "b p"]]:
    """Right-pads ragged token lists into (tokens, token_mask)."""
    rows = [np.asarray(p, np.int32).reshape(-1) for p in prompts]
    if not rows:
        raise ValueError("prompts is empty; give at least one prompt.")
    width = max(len(r) for r in rows)
    tokens = np.full((len(rows), width), pad_id, np.int32)
    mask = np.zeros((len(rows), width), bool)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
        mask[i, : len(r)] = True
    return jnp.asarray(tokens), jnp.asarray(mask)


def _as_prompt_batch(prompts, prompt_mask) -> tuple[Array, Array]:
    if isinstance(prompts, (list, tuple)) and (not prompts or not np.isscalar(prompts[0])):
        if prompt_mask is not None:
            raise ValueError("prompt_mask is only for a padded (batch, width) array; ragged lists are padded here.")
        tokens, mask = pad_prompts(prompts)
    else:
        tokens = jnp.asarray(prompts, jnp.int32)
        if tokens.ndim == 1:
            tokens = tokens[None]
        mask = (
            jnp.ones(tokens.shape, bool)
            if prompt_mask is None
            else jnp.asarray(prompt_mask, bool).reshape(tokens.shape)
        )
    if tokens.ndim != 2 or tokens.shape[1] == 0:
        raise ValueError(
            f"prompts must be (batch, width >= 1) token ids, got shape {tokens.shape}; an empty prompt "
            f"has nothing to condition on: start it with BOS (tokenizers.BOS_ID)."
        )
    empty = np.flatnonzero(~np.asarray(mask).any(axis=1))
    if empty.size:
        raise ValueError(
            f"prompt rows {empty.tolist()} have no real token; start every prompt with BOS "
            f"(tokenizers.BOS_ID), which is also how to ask for unconditional generation."
        )
    return tokens, mask


def _check_max_new(max_new_tokens: int):
    if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}.")


def _stop_array(stop_tokens: Sequence[int]) -> Array:
    return jnp.asarray(tuple(int(t) for t in stop_tokens) or (-1,), jnp.int32)  # -1 matches no token


def _lengths(tokens: np.ndarray, stop_tokens: Sequence[int], produced: int) -> np.ndarray:
    is_stop = np.isin(tokens, list(stop_tokens))
    has_stop = is_stop.any(axis=1)
    return np.where(has_stop, is_stop.argmax(axis=1) + 1, min(produced, tokens.shape[1])).astype(np.int32)


@functools.partial(jax.jit, static_argnames=("model", "cache_length"))
def prefill(
    model: T.Transformer, params: Any, tokens: Int[Array, "b p"], token_mask: Bool[Array, "b p"], *, cache_length: int
) -> tuple[Float[Array, "b p v"], KVCache]:
    """Encodes right-padded prompts causally into a fresh cache of `cache_length` slots (end_index = p afterwards)."""
    cache = init_cache(model.cfg, tokens.shape[0], cache_length)
    return T.append(model, params, tokens, cache, token_mask=token_mask)
