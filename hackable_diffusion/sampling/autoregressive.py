"""The autoregressive baseline decoder: the same backbone run causally with the KV cache.

Prefill, then one jit-compiled one-token decode step inside a `lax.while_loop` (compiled once), with greedy,
temperature, top-k and top-p (nucleus) sampling in float32 and per-row EOS stopping. Row randomness comes from each
row's own key, as in block-diffusion generation (`generate.py`).
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

from hackable_diffusion.data.tokenizers import EOS_ID, PAD_ID
from hackable_diffusion.models import transformer as T
from hackable_diffusion.sampling.keys import row_keys
from hackable_diffusion.sampling.prompts import (
    GenerationResult,
    _as_prompt_batch,
    _check_max_new,
    _lengths,
    _stop_array,
    prefill,
)
from hackable_diffusion.sampling.scores import NEG_LOGIT


@dataclasses.dataclass(frozen=True)
class ARSampling:
    """Next-token sampling: temperature 0 is greedy; top_k 0 and top_p 1 are off. All in float32."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"ARSampling.temperature must be >= 0 (0 = greedy), got {self.temperature}.")
        if not isinstance(self.top_k, (int, np.integer)) or self.top_k < 0:
            raise ValueError(f"ARSampling.top_k must be an int >= 0 (0 = off), got {self.top_k!r}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"ARSampling.top_p must lie in (0, 1] (1 = off), got {self.top_p}.")

    def filter_logits(self, logits: Float[Array, "b v"]) -> Float[Array, "b v"]:
        """Temperature-scaled logits with everything outside the top-k / nucleus set to -1e30 (ties are kept)."""
        logits = logits.astype(jnp.float32) / self.temperature
        if self.top_k:
            kth = jax.lax.top_k(logits, min(self.top_k, logits.shape[-1]))[0][..., -1:]
            logits = jnp.where(logits < kth, NEG_LOGIT, logits)
        if self.top_p < 1:
            sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
            probs = jax.nn.softmax(sorted_logits, axis=-1)
            mass_before = jnp.cumsum(probs, axis=-1) - probs
            kept = jnp.where(mass_before < self.top_p, sorted_logits, jnp.inf)
            threshold = jnp.min(kept, axis=-1, keepdims=True)  # smallest logit of the nucleus (top-1 always kept)
            logits = jnp.where(logits < threshold, NEG_LOGIT, logits)
        return logits

    def __call__(self, keys: Array, logits: Float[Array, "b v"]) -> Int[Array, "b"]:
        if self.temperature == 0:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        filtered = self.filter_logits(logits)
        return jax.vmap(jax.random.categorical)(keys, filtered).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("model", "sampling", "max_new_tokens"))
def _ar_decode(model, params, cache, first_logits, keys, stop, bias, *, sampling, max_new_tokens):
    b = first_logits.shape[0]

    def cond(state):
        return (state["i"] < max_new_tokens) & ~jnp.all(state["done"])

    def body(state):
        i, done = state["i"], state["done"]
        step_keys = jax.vmap(lambda k: jax.random.fold_in(k, i))(keys)
        token = sampling(step_keys, state["logits"] + bias)
        token = jnp.where(done, PAD_ID, token)
        logits, cache = T.append(model, params, token[:, None], state["cache"], token_mask=~done[:, None])
        return dict(
            i=i + 1,
            done=done | jnp.isin(token, stop),
            cache=cache,
            logits=logits[:, 0].astype(jnp.float32),
            tokens=state["tokens"].at[:, i].set(token),
        )

    state = dict(
        i=jnp.zeros((), jnp.int32),
        done=jnp.zeros((b,), bool),
        cache=cache,
        logits=first_logits.astype(jnp.float32),
        tokens=jnp.full((b, max_new_tokens), PAD_ID, jnp.int32),
    )
    state = jax.lax.while_loop(cond, body, state)
    return state["tokens"], state["i"], state["cache"]


def generate_ar(
    model: T.Transformer,
    params: Any,
    prompts: Int[Array, "b p"] | Sequence[Sequence[int]],
    *,
    key: Any,
    max_new_tokens: int,
    sampling: ARSampling = ARSampling(),
    prompt_mask: Bool[Array, "b p"] | None = None,
    stop_tokens: Sequence[int] = (EOS_ID,),
    forbidden_tokens: Sequence[int] = (),
) -> GenerationResult:
    """Autoregressive decoding with the KV cache: prefill, then one token per step until every row hit a stop token
    (kept, PAD after) or `max_new_tokens`. Row randomness comes from the row's own key, as in `generate`."""
    tokens, mask = _as_prompt_batch(prompts, prompt_mask)
    _check_max_new(max_new_tokens)
    b, width = tokens.shape
    logits, cache = prefill(model, params, tokens, mask, cache_length=width + max_new_tokens)
    last_real = width - 1 - jnp.argmax(mask[:, ::-1], axis=1)
    first_logits = jnp.take_along_axis(logits, last_real[:, None, None], axis=1)[:, 0]
    bias = np.zeros(model.cfg.vocab_size, np.float32)
    bias[[int(t) for t in forbidden_tokens]] = NEG_LOGIT
    out, steps, cache = _ar_decode(
        model,
        params,
        cache,
        first_logits,
        row_keys(key, b),
        _stop_array(stop_tokens),
        jnp.asarray(bias),
        sampling=sampling,
        max_new_tokens=max_new_tokens,
    )
    out = np.asarray(out)
    return GenerationResult(
        tokens=out, lengths=_lengths(out, stop_tokens, int(steps)), forward_passes=1 + int(steps), cache=cache
    )
