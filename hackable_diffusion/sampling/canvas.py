"""Denoising one canvas against a prefix KV cache: a pure, jit-compiled `lax.while_loop`.

Reference: DiffusionGemma `sample_next_canvas` (google-deepmind/gemma `gemma/diffusion/_sampler.py`;
docs/reference.md §2.4-2.7). Step i of S runs at noise level t_i = 1 - i/S:

    logits  = decode_block(canvas, cache, sc_signal)          # decoder mode: reads the cache, never writes it
    shaped  = logits / T(t_i)                                 # float32
    cand    ~ categorical(shaped)                             # float32 Gumbel-max, per-row keys (draws.py)
    scored  = shaped, or logits / score_temperature if set    # what the rule ranks (see DiffusionSampler)
    accept, remask = selection(scored, cand, undecided)       # selection.py
    uniform process: new = accept ? cand : fresh uniform token (every free position; no persistent commit); at the
                     budget's last step every free position takes its candidate (deliberate: no noise left);
                     with `commit` an accepted token stays and only the undecided positions are re-noised
    masking process: new = accept ? cand : (remask ? MASK : canvas)   (committed tokens stay, except ReMDM)
    sc      = sqrt(d) softmax(shaped) @ E                     # self-conditioning for the next step
    done   |= early_stopping(shaped, canvas, new)             # per row; the triggering step is kept
    canvas  = done_before ? canvas : new                      # a finished row never changes again

Step 0 uses the null self-conditioning signal (`null_signal="zeros"` as gemma.diffusion, or "mean_embedding" as the
hackable_diffusion adapter). The sampler pieces (`DiffusionSampler`, `sampler.py`) are small frozen dataclasses
passed as static jit arguments, so one config line swaps any of them.

Differences from the reference, on purpose:
  * Fixed positions (`fixed`: a puzzle's givens, infill context) are never changed and are left out of selection and
    early stopping; the reference has none.
  * `forbidden_tokens` get a -1e30 logit (the reference accepts `forbidden_tokens` and ignores them); with a masking
    process the mask token is always forbidden (MDLM's SUBS parameterisation).
  * With a masking process and a rule that never re-masks, a row also stops once nothing is masked (nothing left to do).
  * Canvas positions count each row's real tokens (the hackable_diffusion adapter's bookkeeping), not cache slots, so
    batches of prompts of different lengths are exact (docs/reference.md §5).
  * Every random draw comes from the row's own key, folded with the step index, so a row samples the same tokens
    alone or inside any batch.
  * No trajectory is kept unless `return_trajectory=True`.
  * `constraint` (off by default): a task's rules exclude tokens before the step samples and ranks
    (`constraints.py`, e.g. a puzzle's rules, supplied by its task).
  * `draw=BlockedInverseCdf()` (off by default) draws the same categorical by a two-level inverse CDF, without
    Gumbel-max's random number per vocabulary entry (draws.py).
  * `commit` (off by default, as the reference): a uniform-process sampler keeps what it accepted, as a masking one
    does, and re-noises only the positions not yet decided, so a later step reads its earlier decisions instead of
    re-drawing them jointly with the new ones (what a fixed-order rule such as `dilated` relies on).
  * `score_temperature` (off by default, as the reference) lets the rule rank positions by logits at another
    temperature than the tokens are drawn at; early stopping and self-conditioning always use `shaped`.
  * `vocab_chunk` (off by default) computes what the step reads of the logits (candidate, maxima, normalisers,
    entropies, the self-conditioning signal) in one scan over chunks of the vocabulary, so that no float32
    [b, c, v] array other than the model's logits is held (vocab_chunks.py): the same candidates for the same keys,
    the same scores up to float32 summation order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from jaxtyping import Array, Bool, Float, Int

from hackable_diffusion.diffusion import token_shift as shift_lib
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import KVCache
from hackable_diffusion.models.config import resolve_dtype
from hackable_diffusion.sampling import vocab_chunks
from hackable_diffusion.sampling.draws import GumbelMax
from hackable_diffusion.sampling.keys import row_keys
from hackable_diffusion.sampling.sampler import DiffusionSampler
from hackable_diffusion.sampling.scores import NEG_LOGIT, LogitSummary
from hackable_diffusion.sampling.selection_base import StepInfo


@flax.struct.dataclass
class CanvasResult:
    """canvas: the denoised tokens; steps: denoising steps each row used (0 for inactive rows); forward_passes: model
    calls made (each over the whole batch); trajectory: the canvas after every step (steps, b, c), or None. Entries
    after the last executed step repeat the final canvas."""

    canvas: Int[Array, "b c"]
    steps: Int[Array, "b"]
    forward_passes: Int[Array, ""]
    trajectory: Int[Array, "s b c"] | None = None


def commit_passes(trajectory: Int[np.ndarray, "s b c"], fixed: Bool[np.ndarray, "b c"], mask_id: int) -> np.ndarray:
    """(b, c) int32 from a masking sampler's `trajectory`: the step (from 0) after which each position first held a
    token; -1 for fixed positions and for positions still masked at the end (what RL's trajectory scorer reads)."""
    written = np.asarray(trajectory) != mask_id
    first = np.argmax(written, axis=0).astype(np.int32)
    return np.where(written.any(axis=0) & ~np.asarray(fixed, bool), first, -1).astype(np.int32)


@functools.partial(jax.jit, static_argnames=("model",))
def canvas_logits(
    model: T.Transformer,
    params: Any,
    cache: KVCache,
    canvas: Int[Array, "b c"],
    sc_signal: Float[Array, "b c d"] | None = None,
) -> Float[Array, "b c v"]:
    """The model call of one denoising step: decoder mode over the cached prefix, bidirectional over the canvas."""
    logits, _ = T.decode_block(model, params, canvas, cache, sc_signal=sc_signal)
    return logits


def tile_cache(cache: KVCache, copies: int) -> KVCache:
    """The cache repeated `copies` times along the batch, copy-major (rows k*b .. (k+1)*b - 1 are copy k)."""
    if copies == 1:
        return cache

    def tile(x, axis):
        reps = [1] * x.ndim
        reps[axis] = copies
        return jnp.tile(x, reps)

    layers = tuple({name: tile(x, 1) for name, x in layer.items()} for layer in cache.layers)
    return cache.replace(layers=layers, positions=tile(cache.positions, 0), valid=tile(cache.valid, 0))


def _denoise(
    model,
    params,
    cache,
    canvas,
    keys,
    fixed,
    active,
    *,
    sampler: DiffusionSampler,
    return_trajectory: bool,
    on_step: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None,
    before_logits: Float[Array, "b v"] | None = None,
    temperature_scale: Float[Array, ""] | None = None,
) -> CanvasResult:
    b, c = canvas.shape
    num_steps = sampler.num_steps
    process = sampler.process
    persistent = sampler.persistent
    free = ~fixed
    bias = sampler.logit_bias()
    has_sc = model.cfg.self_conditioning
    use_sc = sampler.uses_self_conditioning(model)
    null_sc = T.model_method(model, params, "null_sc_signal", (b, c), kind=sampler.null_signal) if has_sc else None
    if sampler.token_shift:
        if use_sc:
            raise ValueError(
                "DiffusionSampler.token_shift: a self-conditioning signal is fed back per position, unshifted; sample "
                "a token-shift model with self_conditioning=False."
            )
        if before_logits is None:
            raise ValueError(
                "DiffusionSampler.token_shift needs the logits of the last real token before the canvas "
                "(before_logits, (batch, vocab)): the canvas's first position reads them. generate() keeps them."
            )
    if sampler.views is not None:
        if use_sc:
            raise ValueError(
                "DiffusionSampler.views averages the model over relabelled canvases; a self-conditioning signal is not "
                "relabelled with them. Use self_conditioning=False or no views."
            )
        view_cache = tile_cache(cache, sampler.views.num_views)  # every view sees the same prefix

    def cond(state):
        return (state["step"] < num_steps) & ~jnp.all(state["done"])

    def body(state):
        step, old = state["step"], state["canvas"]
        info = StepInfo.at(step, num_steps, process.schedule, free, sampler.keeps_decisions)
        if sampler.views is None:
            logits = canvas_logits(model, params, cache, old, state.get("sc"))
            if sampler.token_shift:  # position j reads the logits at j - 1 (diffusion/token_shift.py)
                logits = shift_lib.shift_canvas_logits(logits, before_logits)
        else:  # the mean log-probabilities of K relabelled copies, one batched call (views.py)
            logits = sampler.views(lambda v: canvas_logits(model, params, view_cache, v, None), old)
        excluded = None
        if sampler.constraint is not None:  # the task's rules, given what is decided so far (constraints.py)
            decided = (fixed | (old != process.mask_id)) if persistent else fixed
            excluded = sampler.constraint(old, decided, logits.shape[-1])
        step_keys = jax.vmap(lambda k: jax.random.split(jax.random.fold_in(k, step), 3))(keys)
        temperature = sampler.temperature(info.t)
        if temperature_scale is not None:  # a traced factor: one compiled loop for every temperature
            temperature = temperature * temperature_scale
        if sampler.vocab_chunk:  # the same quantities, scanned over chunks of the vocabulary (vocab_chunks.py)
            candidates, shaped, scored, sc = _summarised_step(
                sampler, model, params, logits, excluded, temperature, step_keys[:, 0], use_sc
            )
            argmax = shaped.argmax
        else:
            biased = logits.astype(jnp.float32) + bias
            if excluded is not None:
                biased = jnp.where(excluded, NEG_LOGIT, biased)
            shaped = biased / temperature
            candidates = sampler.draw(step_keys[:, 0], shaped)
            scored = shaped if sampler.score_temperature is None else biased / sampler.score_temperature
            argmax = jnp.argmax(shaped, axis=-1).astype(jnp.int32)
            sc = None
            if use_sc:
                fed_back = shaped if sampler.sc_temperature is None else biased / sampler.sc_temperature
                sc = T.model_method(model, params, "sc_signal", fed_back)
        if persistent:
            undecided = free & (old == process.mask_id)
        else:
            undecided = free & ~state["decided"] if sampler.commit else free
        accept, remask = sampler.selection(step_keys[:, 1], scored, candidates, undecided, info)
        accept, remask = accept & undecided, remask & free & ~undecided
        # The last step of the budget leaves no noise behind: whatever the rule did not accept takes its candidate
        # (masking: nothing stays masked, as MD4's last step; uniform: no position keeps a fresh noise token).
        last = step == num_steps - 1
        accept, remask = accept | (undecided & last), remask & ~last
        if persistent:
            new = jnp.where(accept, candidates, jnp.where(remask, process.mask_id, old))
        else:
            noise = jax.vmap(lambda k: process.prior_sample(k, (c,)))(step_keys[:, 2]).astype(jnp.int32)
            new = jnp.where(undecided, jnp.where(accept, candidates, noise), old)
        if sampler.commit:  # a committing uniform row stops exactly when nothing is left undecided (no noise left)
            stop = ~jnp.any(undecided & ~accept, axis=-1)
        else:
            stop = sampler.early_stopping(shaped, old, new, free, state["argmax"])
        if persistent:  # a masking row never stops with masks left; without remasking it stops when none are
            unmasked = ~jnp.any(free & (new == process.mask_id), axis=-1)
            stop = (stop & unmasked) | (unmasked & (not sampler.selection.remasks))
        running = ~state["done"]
        new_state = dict(
            step=step + 1,
            canvas=jnp.where(running[:, None], new, old),
            steps=jnp.where(running, step + 1, state["steps"]),
            done=state["done"] | stop,
            argmax=jnp.where(running[:, None], argmax, state["argmax"]),
        )
        if has_sc:
            new_state["sc"] = sc.astype(null_sc.dtype) if use_sc else null_sc
        if sampler.commit:
            new_state["decided"] = state["decided"] | (accept & running[:, None])
        if return_trajectory:
            new_state["trajectory"] = state["trajectory"].at[step].set(new_state["canvas"])
        if on_step is not None:  # the host sees every step as it happens (a live view, tokens streamed early)
            io_callback(on_step, None, step + 1, new_state["canvas"], running, ordered=True)
        return new_state

    state = dict(
        step=jnp.zeros((), jnp.int32),
        canvas=canvas,
        steps=jnp.zeros((b,), jnp.int32),
        done=~active,
        argmax=jnp.full((b, c), -1, jnp.int32),  # the previous step's argmax, for stability rules that compare to it
    )
    if has_sc:
        state["sc"] = null_sc
    if sampler.commit:
        state["decided"] = jnp.zeros((b, c), bool)
    if return_trajectory:
        state["trajectory"] = jnp.zeros((num_steps, b, c), jnp.int32)
    state = jax.lax.while_loop(cond, body, state)
    trajectory = None
    if return_trajectory:
        executed = (jnp.arange(num_steps) < state["step"])[:, None, None]
        trajectory = jnp.where(executed, state["trajectory"], state["canvas"][None])
    return CanvasResult(
        canvas=state["canvas"], steps=state["steps"], forward_passes=state["step"], trajectory=trajectory
    )


def _summarised_step(
    sampler: DiffusionSampler,
    model: T.Transformer,
    params: Any,
    logits: Float[Array, "b c v"],
    excluded: Bool[Array, "b c v"] | None,
    temperature: Float[Array, ""],
    draw_keys: Array,
    use_sc: bool,
) -> tuple[Int[Array, "b c"], LogitSummary, LogitSummary, Float[Array, "b c d"] | None]:
    """(candidates, shaped, scored, sc) of one step with `vocab_chunk` set: what the unchunked step computes from
    the whole-vocabulary arrays, here from one chunked scan (summaries in place of the shaped and scored logits)."""
    biased = vocab_chunks.BiasedLogits(logits, sampler.logit_bias(), excluded)
    divisors: list[Any] = [temperature]
    score_view = sc_view = 0
    if sampler.score_temperature is not None:
        divisors.append(sampler.score_temperature)
        score_view = len(divisors) - 1
    if use_sc and sampler.sc_temperature is not None:
        divisors.append(sampler.sc_temperature)
        sc_view = len(divisors) - 1
    gumbel = isinstance(sampler.draw, GumbelMax)
    compute_dtype = resolve_dtype(model.cfg.compute_dtype)
    scan = vocab_chunks.summarise(
        biased,
        tuple(divisors),
        sampler.vocab_chunk,
        gumbel_keys=draw_keys if gumbel else None,
        embedding=vocab_chunks.embedding_table(model, params) if use_sc else None,
        sc_view=sc_view,
        matmul_dtype=compute_dtype,
    )
    if gumbel:
        candidates = scan.candidates
    else:
        candidates = vocab_chunks.blocked_inverse_cdf(
            draw_keys, biased, temperature, scan.summaries[0].max, sampler.vocab_chunk, sampler.draw.block
        )
    shaped = vocab_chunks.with_candidates(scan.summaries[0], biased, temperature, candidates)
    scored = shaped
    if score_view:
        scored = vocab_chunks.with_candidates(scan.summaries[score_view], biased, divisors[score_view], candidates)
    sc = None
    if use_sc:
        sc = vocab_chunks.sc_signal(scan.expected_embedding, model.cfg.embed_dim, compute_dtype)
    return candidates, shaped, scored, sc


_denoise_jit = jax.jit(_denoise, static_argnames=("model", "sampler", "return_trajectory", "on_step"))


def denoise_canvas(
    model: T.Transformer,
    params: Any,
    cache: KVCache,
    canvas_init: Int[Array, "b c"],
    key: Any,
    *,
    sampler: DiffusionSampler,
    fixed: Bool[Array, "b c"] | None = None,
    active: Bool[Array, "b"] | None = None,
    return_trajectory: bool = False,
    on_step: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None,
    before_logits: Float[Array, "b v"] | None = None,
    temperature_scale: float | Float[Array, ""] | None = None,
) -> CanvasResult:
    """Denoises `canvas_init` (its free positions are the starting noise, its fixed positions the given tokens).

    key: an int seed, a single key (rows get fold_in(key, row)) or one key per row (batch-independent randomness).
    fixed: positions never changed. active: rows to denoise (inactive rows are returned unchanged with 0 steps).
    The canvas length is free here (it need not equal `sampler.canvas_length`); the cache is only read.
    on_step: called on the host after every step with (step number from 1, the (b, c) canvas, the (b,) rows that ran
      this step), in order, while the loop runs (an ordered `io_callback`: one host round trip per step). It must be
      hashable (it is a static argument: a module-level function or a bound method compiles once); it changes no value.
    before_logits: (b, v) the logits of each row's last real token before the canvas; needed by a
      `sampler.token_shift` sampler only.
    temperature_scale: None, or a factor (> 0) on `sampler.temperature` passed as a traced value, so that requests
      at different temperatures share one compiled loop (a server: `sampler.temperature` 1, the request's as the
      factor); the same tokens as the sampler with its temperature multiplied by it, up to float32 rounding.
    """
    canvas_init = jnp.asarray(canvas_init, jnp.int32)
    if canvas_init.ndim != 2 or canvas_init.shape[1] < 1:
        raise ValueError(f"canvas_init must have shape (batch, canvas_length >= 1), got {canvas_init.shape}.")
    b, c = canvas_init.shape
    if cache.batch_size != b:
        raise ValueError(f"the cache holds {cache.batch_size} rows but the canvas has {b}.")
    if sampler.process.vocab_size != model.cfg.vocab_size:
        raise ValueError(
            f"the sampler's process has vocab_size {sampler.process.vocab_size} but the model has "
            f"{model.cfg.vocab_size}."
        )
    sampler.uses_self_conditioning(model)
    fixed = jnp.zeros((b, c), bool) if fixed is None else jnp.asarray(fixed, bool)
    if fixed.shape != (b, c):
        raise ValueError(f"fixed must have the canvas shape {(b, c)}, got {fixed.shape}.")
    active = jnp.ones((b,), bool) if active is None else jnp.asarray(active, bool)
    if active.shape != (b,):
        raise ValueError(f"active must have shape ({b},), got {active.shape}.")
    if isinstance(temperature_scale, (int, float)) and not temperature_scale > 0:
        raise ValueError(f"temperature_scale must be > 0 (None: the sampler's own temperature), got {temperature_scale}.")
    return _denoise_jit(
        model,
        params,
        cache,
        canvas_init,
        row_keys(key, b),
        fixed,
        active,
        sampler=sampler,
        return_trajectory=return_trajectory,
        on_step=on_step,
        before_logits=before_logits,
        temperature_scale=None if temperature_scale is None else jnp.asarray(temperature_scale, jnp.float32),
    )
