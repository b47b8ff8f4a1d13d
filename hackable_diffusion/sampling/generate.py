"""Block-autoregressive diffusion generation with an exact KV cache.

Reference: DiffusionGemma's `DiffusionSampler._sample_step` and `SamplerLoop` (google-deepmind/gemma;
docs/reference.md §2.2-2.3 and §5):

    prefill the prompt causally                     -> the first canvas starts at slot end_index = prompt width
    repeat: denoise a canvas in decoder mode         (canvas.py; the cache is read, never written)
            truncate it at the first stop token      (kept; PAD after; rows already done get all PAD)
            commit it causally with `append`          (token_mask = non-PAD, so PAD slots are never attended)
    until every row has stopped, max_new_tokens are produced, or the next canvas would not fit the cache.

The outer loop is a Python loop over canvases (one host sync per canvas to test whether every row is done); each
piece is jit-compiled once per shape: prefill, `denoise_canvas` (a `lax.while_loop`), truncation, commit.
`on_device=True` compiles the loop over canvases too, as one `lax.while_loop` around the same pieces that takes the
prefill's cache donated: no host round trip between canvases (tested equal to the host loop).

Differences from the reference, on purpose:
  * Never wraps around the cache (the reference's `is_full` test lets a canvas cross the end and overwrite the prefix):
    a ValueError is raised up front when the prompt plus one canvas does not fit, and generation stops before a canvas
    that would not fit. The default cache holds the prompt plus every canvas needed for `max_new_tokens`.
  * Batches of right-padded prompts of different lengths are exact: pads are invalid cache slots, never attended, and
    positions count real tokens (the hackable_diffusion adapter's bookkeeping; the reference's gemma path exposes pad
    KV and leaves RoPE gaps, docs/reference.md §5). Every random draw comes from the row's own key, so the same prompt and row key
    give the same tokens alone or inside any batch.
  * An empty prompt (a row with no real token) is rejected: start every prompt with BOS.
  * Fixed positions over the generated region (`fixed`, `fixed_tokens`: infilling, a forced suffix, a puzzle's givens)
    are passed to every canvas. Truncation still cuts at the first stop token, fixed or not; pass `stop_tokens=()` to
    keep a fixed suffix after a generated EOS.
  * `max_new_tokens` need not be a multiple of the canvas length: whole canvases are generated and the output is cut.

Prompt batches, the prefill and `GenerationResult` are `prompts.py`'s, shared with the autoregressive baseline
(`autoregressive.py`: `generate_ar`, the same backbone decoded causally one token at a time).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from hackable_diffusion.data.tokenizers import EOS_ID, PAD_ID
from hackable_diffusion.diffusion import token_shift as shift_lib
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import KVCache
from hackable_diffusion.sampling.canvas import _denoise, denoise_canvas
from hackable_diffusion.sampling.keys import row_keys
from hackable_diffusion.sampling.prompts import (
    GenerationResult,
    _as_prompt_batch,
    _check_max_new,
    _lengths,
    _stop_array,
    prefill,
)
from hackable_diffusion.sampling.sampler import DiffusionSampler


@functools.partial(jax.jit, static_argnames=("model",))
def commit_canvas(model: T.Transformer, params: Any, cache: KVCache, canvas: Int[Array, "b c"]) -> KVCache:
    """Encodes a (truncated) canvas causally into the cache; PAD positions become invalid, never-attended slots."""
    return T.append(model, params, canvas, cache, token_mask=canvas != PAD_ID)[1]


@functools.partial(jax.jit, static_argnames=("model",))
def commit_canvas_keeping_logits(
    model: T.Transformer, params: Any, cache: KVCache, canvas: Int[Array, "b c"], before: Float[Array, "b v"]
) -> tuple[KVCache, Float[Array, "b v"]]:
    """`commit_canvas`, and the logits of each row's last real token of the canvas (`before` for an all-PAD row):
    what the next canvas's first position reads under the token shift (diffusion/token_shift.py)."""
    mask = canvas != PAD_ID
    logits, cache = T.append(model, params, canvas, cache, token_mask=mask)
    return cache, shift_lib.last_real_logits(logits, mask, before)


def _prefill(model, params, tokens, mask, cache_length: int, shift: bool):
    """The prompts' cache; under the token shift also the logits of each row's last prompt token (else None)."""
    logits, cache = prefill(model, params, tokens, mask, cache_length=cache_length)
    return cache, shift_lib.last_real_logits(logits, mask) if shift else None


def _commit(model, params, cache, canvas, before, shift: bool):
    """Commits a canvas; under the token shift also the logits the next canvas starts from (else `before`, None)."""
    if shift:
        return commit_canvas_keeping_logits(model, params, cache, canvas, before)
    return commit_canvas(model, params, cache, canvas), before


@functools.partial(jax.jit, static_argnames=("model", "sampler", "num_canvases"), donate_argnames=("cache",))
def _canvases_on_device(
    model, params, cache, keys, fixed_all, given_all, stop, before_logits, *, sampler, num_canvases
):
    """The loop over canvases as one compiled `lax.while_loop` (no host sync between canvases): each iteration is the
    host loop's body (start, denoise, truncate, commit), and it ends when every row has stopped or all are done."""
    b = keys.shape[0]
    c = sampler.canvas_length

    def cond(state):
        return (state["index"] < num_canvases) & jnp.any(state["active"])

    def body(state):
        index, active = state["index"], state["active"]
        canvas_fixed = jax.lax.dynamic_slice_in_dim(fixed_all, index * c, c, axis=1)
        canvas_given = jax.lax.dynamic_slice_in_dim(given_all, index * c, c, axis=1)
        init, canvas_keys = _start_canvas(keys, index, canvas_fixed, canvas_given, sampler=sampler)
        result = _denoise(
            model,
            params,
            state["cache"],
            init,
            canvas_keys,
            canvas_fixed,
            active,
            sampler=sampler,
            return_trajectory=False,
            before_logits=state.get("before"),
        )
        canvas, stopped = truncate_at_stop(result.canvas, stop, active)
        cache, before = _commit(model, params, state["cache"], canvas, state.get("before"), sampler.token_shift)
        new_state = dict(
            index=index + 1,
            active=active & ~stopped,
            cache=cache,
            tokens=jax.lax.dynamic_update_slice_in_dim(state["tokens"], canvas, index * c, axis=1),
            steps=state["steps"].at[:, index].set(result.steps),
            passes=state["passes"] + result.forward_passes + 1,
        )
        if before is not None:
            new_state["before"] = before
        return new_state

    state = dict(
        index=jnp.zeros((), jnp.int32),
        active=jnp.ones((b,), bool),
        cache=cache,
        tokens=jnp.full((b, num_canvases * c), PAD_ID, jnp.int32),
        steps=jnp.zeros((b, num_canvases), jnp.int32),
        passes=jnp.ones((), jnp.int32),  # the prefill
    )
    if before_logits is not None:
        state["before"] = before_logits
    state = jax.lax.while_loop(cond, body, state)
    return state["index"], state["tokens"], state["steps"], state["passes"], state["cache"]


@jax.jit
def truncate_at_stop(
    canvas: Int[Array, "b c"], stop_tokens: Int[Array, "n"], active: Bool[Array, "b"]
) -> tuple[Int[Array, "b c"], Bool[Array, "b"]]:
    """Keeps each active row up to and including its first stop token, PAD after; inactive rows become all PAD.

    Returns (canvas, stopped): stopped marks the active rows that contained a stop token.
    """
    is_stop = jnp.isin(canvas, stop_tokens)
    before_or_at_first_stop = jnp.cumsum(is_stop, axis=1) - is_stop == 0
    keep = before_or_at_first_stop & active[:, None]
    return jnp.where(keep, canvas, PAD_ID), active & jnp.any(is_stop, axis=1)


@functools.partial(jax.jit, static_argnames=("sampler",))
def _start_canvas(keys, index, fixed, fixed_tokens, *, sampler):
    """Canvas `index`: its starting tokens and its denoising keys, both derived from each row's own key."""
    canvas_keys = jax.vmap(lambda k: jax.random.split(jax.random.fold_in(k, index)))(keys)
    init = sampler.initial_canvas(canvas_keys[:, 0], keys.shape[0], fixed=fixed, fixed_tokens=fixed_tokens)
    return init, canvas_keys[:, 1]


@dataclasses.dataclass(frozen=True)
class CanvasUpdate:
    """One committed canvas of a streamed generation (`stream_canvases`).

    index: the canvas number; start: where its tokens begin in the generated region; tokens: (b, length) the committed
    canvas (truncated at each row's first stop token, PAD after; all PAD for rows already finished); finished: (b,)
    rows that are done after this canvas (a stop token, or `cancelled`); steps: (b,) denoising steps each row used;
    forward_passes: batched model calls so far (prefill included); trajectory: (steps, b, length) or None."""

    index: int
    start: int
    tokens: np.ndarray
    finished: np.ndarray
    steps: np.ndarray
    forward_passes: int
    trajectory: np.ndarray | None = None


def canvas_spans(max_new_tokens: int, canvas_length: int, first_canvas_length: int | None = None) -> list[int]:
    """The lengths of the canvases that cover `max_new_tokens`: whole canvases; with a shorter first canvas of F
    tokens, the same region (a whole number of canvases) as [F, canvas, ..., canvas, canvas - F], so the short first
    canvas costs no extra tokens, only one more (small) canvas."""
    _check_max_new(max_new_tokens)
    whole = math.ceil(max_new_tokens / canvas_length)
    if first_canvas_length is None or first_canvas_length == canvas_length:
        return [canvas_length] * whole
    if not isinstance(first_canvas_length, (int, np.integer)) or not 1 <= first_canvas_length <= canvas_length:
        raise ValueError(
            f"first_canvas_length must be an int in [1, canvas_length={canvas_length}] or None, got "
            f"{first_canvas_length!r}."
        )
    if max_new_tokens <= first_canvas_length:
        return [int(first_canvas_length)]
    rest = whole * canvas_length - first_canvas_length
    return [int(first_canvas_length)] + [canvas_length] * (rest // canvas_length) + [rest % canvas_length] * bool(
        rest % canvas_length
    )


def _check_sampler(model: T.Transformer, sampler: DiffusionSampler) -> None:
    sampler.uses_self_conditioning(model)
    if sampler.process.vocab_size != model.cfg.vocab_size:
        raise ValueError(
            f"the sampler's process has vocab_size {sampler.process.vocab_size} but the model has "
            f"{model.cfg.vocab_size}."
        )


def _fixed_region(b: int, region: int, max_new_tokens: int, fixed, fixed_tokens) -> tuple[np.ndarray, np.ndarray]:
    """(fixed, given) over the whole generated region (False / 0 beyond what the caller fixed)."""
    fixed_all = np.zeros((b, max(region, max_new_tokens)), bool)
    given_all = np.zeros(fixed_all.shape, np.int32)
    if fixed is not None:
        fixed = np.asarray(fixed, bool)
        if fixed_tokens is None:
            raise ValueError("fixed was given without fixed_tokens (the tokens to hold at those positions).")
        fixed_tokens = np.asarray(fixed_tokens, np.int32)
        if (
            fixed.ndim != 2
            or fixed.shape[0] != b
            or fixed.shape[1] > max_new_tokens
            or fixed_tokens.shape != fixed.shape
        ):
            raise ValueError(
                f"fixed and fixed_tokens must both have shape ({b}, n <= max_new_tokens="
                f"{max_new_tokens}), got {fixed.shape} and {fixed_tokens.shape}."
            )
        fixed_all[:, : fixed.shape[1]] = fixed
        given_all[:, : fixed.shape[1]] = fixed_tokens
    return fixed_all, given_all


def stream_canvases(
    model: T.Transformer,
    params: Any,
    prompts: Int[Array, "b p"] | Sequence[Sequence[int]],
    *,
    sampler: DiffusionSampler,
    key: Any,
    max_new_tokens: int,
    prompt_mask: Bool[Array, "b p"] | None = None,
    stop_tokens: Sequence[int] = (EOS_ID,),
    cache_length: int | None = None,
    fixed: Bool[Array, "b n"] | None = None,
    fixed_tokens: Int[Array, "b n"] | None = None,
    return_trajectory: bool = False,
    first_canvas_length: int | None = None,
    first_canvas_steps: int | None = None,
    before_canvas: Any = None,
    on_step: Any = None,
    on_cache: Any = None,
    temperature_scale: float | None = None,
):
    """`generate`'s host loop as an iterator: yields a `CanvasUpdate` as each canvas is committed.

    first_canvas_length: the first canvas is this long, then whole canvases of `sampler.canvas_length`, the last one
      shorter by as much (`canvas_spans`): a short first canvas gives the first tokens after a few cheap steps (time to
      first token) at the price of one more, small, canvas.
    first_canvas_steps: its denoising steps; None = as many tokens per step as the full canvases decide,
      ceil(num_steps * first_canvas_length / canvas_length) (1 step for 16 tokens of a 256-token, 16-step sampler).
    before_canvas: optional callable given the canvas index before every canvas and returning a (b,) bool array of
      rows to stop there (their tokens from then on are PAD and they no longer hold the loop open), e.g. a client that
      went away.
    on_step: optional hashable callable run on the host after every denoising step (`denoise_canvas`'s): a live view.
    on_cache: optional callable given the final KV cache.
    temperature_scale: optional factor on the sampler's temperature, traced (`denoise_canvas`): every temperature
      runs the same compiled programs.
    The rest are `generate`'s arguments. Row randomness is per row as in `generate`; with the default canvas lengths
    the tokens equal `generate`'s.
    """
    tokens, mask = _as_prompt_batch(prompts, prompt_mask)
    b, width = tokens.shape
    c = sampler.canvas_length
    spans = canvas_spans(max_new_tokens, c, first_canvas_length)
    if cache_length is None:
        cache_length = width + sum(spans)
    if width + spans[0] > cache_length:
        raise ValueError(
            f"the prompt ({width} slots) plus one canvas ({spans[0]} tokens) needs {width + spans[0]} cache slots but "
            f"cache_length={cache_length}; shorten the prompt, use a shorter canvas or a longer cache."
        )
    while width + sum(spans) > cache_length:
        spans.pop()
    _check_sampler(model, sampler)
    fixed_all, given_all = _fixed_region(b, sum(spans), max_new_tokens, fixed, fixed_tokens)
    samplers = {length: sampler.replace(canvas_length=length) for length in set(spans) if length != c}
    samplers[c] = sampler
    if spans[0] != c:  # the short first canvas decides as many tokens per step as a whole one (unless told)
        steps = first_canvas_steps or max(1, math.ceil(sampler.num_steps * spans[0] / c))
        samplers[spans[0]] = sampler.replace(canvas_length=spans[0], num_steps=int(steps))

    keys = row_keys(key, b)
    cache, before = _prefill(model, params, tokens, mask, cache_length, sampler.token_shift)
    stop = _stop_array(stop_tokens)
    # Kept on the host: a device array here would come back from `truncate_at_stop` with the mesh's sharding, and
    # that changed input type would compile the denoising loop a second time for the second canvas.
    active = np.ones((b,), bool)
    forward_passes = 1
    start = 0
    for index, length in enumerate(spans):
        if before_canvas is not None:
            active = active & ~np.asarray(before_canvas(index), bool).reshape(b)
        if not active.any():
            break
        span = slice(start, start + length)
        canvas_fixed, canvas_given = fixed_all[:, span], given_all[:, span]
        init, canvas_keys = _start_canvas(keys, index, canvas_fixed, canvas_given, sampler=samplers[length])
        result = denoise_canvas(
            model,
            params,
            cache,
            init,
            canvas_keys,
            sampler=samplers[length],
            fixed=canvas_fixed,
            active=active,
            return_trajectory=return_trajectory,
            on_step=on_step,
            before_logits=before,
            temperature_scale=temperature_scale,
        )
        canvas, stopped = truncate_at_stop(result.canvas, stop, active)
        cache, before = _commit(model, params, cache, canvas, before, sampler.token_shift)
        forward_passes += int(result.forward_passes) + 1
        active = active & ~np.asarray(stopped)
        yield CanvasUpdate(
            index=index,
            start=start,
            tokens=np.asarray(canvas),
            finished=~active,
            steps=np.asarray(result.steps),
            forward_passes=forward_passes,
            trajectory=np.asarray(result.trajectory) if return_trajectory else None,
        )
        start += length
    if on_cache is not None:
        on_cache(cache)


def generate(
    model: T.Transformer,
    params: Any,
    prompts: Int[Array, "b p"] | Sequence[Sequence[int]],
    *,
    sampler: DiffusionSampler,
    key: Any,
    max_new_tokens: int,
    prompt_mask: Bool[Array, "b p"] | None = None,
    stop_tokens: Sequence[int] = (EOS_ID,),
    cache_length: int | None = None,
    fixed: Bool[Array, "b n"] | None = None,
    fixed_tokens: Int[Array, "b n"] | None = None,
    return_trajectory: bool = False,
    on_device: bool = False,
    first_canvas_length: int | None = None,
    first_canvas_steps: int | None = None,
) -> GenerationResult:
    """Generates up to `max_new_tokens` after each prompt, one canvas of `sampler.canvas_length` at a time.

    prompts: a (b, p) array (right-padded, with `prompt_mask`) or ragged lists of token ids (padded here).
    key: an int seed, a single key (row i uses fold_in(key, i)) or one key per row; row i's tokens depend only on its
      own key and prompt, so `keys[i:i+1]` with prompt i alone reproduces row i of a batch.
    cache_length: slots in the KV cache (default: prompt width + every canvas needed); a shorter cache stops early.
    fixed, fixed_tokens: (b, n <= max_new_tokens) positions of the generated region held to given tokens.
    on_device: run the loop over canvases as one compiled `lax.while_loop` (no host sync between canvases; the same
      tokens, steps and forward passes as the host loop); not with `return_trajectory`.
    first_canvas_length, first_canvas_steps: a shorter first canvas (see `stream_canvases`); host loop only.
    """
    if on_device:
        if return_trajectory:
            raise ValueError("return_trajectory needs the host loop over canvases: pass on_device=False.")
        if first_canvas_length not in (None, sampler.canvas_length):
            raise ValueError("first_canvas_length needs the host loop over canvases: pass on_device=False.")
        return _generate_on_device(
            model,
            params,
            prompts,
            sampler=sampler,
            key=key,
            max_new_tokens=max_new_tokens,
            prompt_mask=prompt_mask,
            stop_tokens=stop_tokens,
            cache_length=cache_length,
            fixed=fixed,
            fixed_tokens=fixed_tokens,
        )
    final = {}
    updates = list(
        stream_canvases(
            model,
            params,
            prompts,
            sampler=sampler,
            key=key,
            max_new_tokens=max_new_tokens,
            prompt_mask=prompt_mask,
            stop_tokens=stop_tokens,
            cache_length=cache_length,
            fixed=fixed,
            fixed_tokens=fixed_tokens,
            return_trajectory=return_trajectory,
            first_canvas_length=first_canvas_length,
            first_canvas_steps=first_canvas_steps,
            on_cache=lambda cache: final.update(cache=cache),
        )
    )
    b = _as_prompt_batch(prompts, prompt_mask)[0].shape[0]
    if updates:
        generated = np.concatenate([u.tokens for u in updates], axis=1)
        steps = np.stack([u.steps for u in updates], axis=1)
        forward_passes = updates[-1].forward_passes
    else:
        generated, steps, forward_passes = np.zeros((b, 0), np.int32), np.zeros((b, 0), np.int32), 1
    return _result(
        generated,
        max_new_tokens,
        stop_tokens,
        forward_passes=forward_passes,
        steps=steps,
        trajectories=tuple(u.trajectory for u in updates) if return_trajectory else None,
        cache=final.get("cache"),
    )


def _result(generated, max_new_tokens, stop_tokens, **fields) -> GenerationResult:
    b, produced = generated.shape
    out = np.full((b, max_new_tokens), PAD_ID, np.int32)
    kept = generated[:, :max_new_tokens]
    out[:, : kept.shape[1]] = kept
    return GenerationResult(tokens=out, lengths=_lengths(out, stop_tokens, produced), **fields)


def _generate_on_device(
    model, params, prompts, *, sampler, key, max_new_tokens, prompt_mask, stop_tokens, cache_length, fixed, fixed_tokens
) -> GenerationResult:
    tokens, mask = _as_prompt_batch(prompts, prompt_mask)
    _check_max_new(max_new_tokens)
    b, width = tokens.shape
    c = sampler.canvas_length
    num_canvases = math.ceil(max_new_tokens / c)
    if cache_length is None:
        cache_length = width + num_canvases * c
    if width + c > cache_length:
        raise ValueError(
            f"the prompt ({width} slots) plus one canvas ({c} tokens) needs {width + c} cache slots but "
            f"cache_length={cache_length}; shorten the prompt, use a shorter canvas or a longer cache."
        )
    num_canvases = min(num_canvases, (cache_length - width) // c)
    _check_sampler(model, sampler)
    region = num_canvases * c
    fixed_all, given_all = _fixed_region(b, region, max_new_tokens, fixed, fixed_tokens)
    keys = row_keys(key, b)
    cache, before = _prefill(model, params, tokens, mask, cache_length, sampler.token_shift)
    done, all_tokens, all_steps, passes, cache = _canvases_on_device(
        model,
        params,
        cache,
        keys,
        jnp.asarray(fixed_all[:, :region]),
        jnp.asarray(given_all[:, :region]),
        _stop_array(stop_tokens),
        before,
        sampler=sampler,
        num_canvases=num_canvases,
    )
    done = int(done)
    return _result(
        np.asarray(all_tokens)[:, : done * c],
        max_new_tokens,
        stop_tokens,
        forward_passes=int(passes),
        steps=np.asarray(all_steps)[:, :done],
        cache=cache,
    )
