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
hackable_diffusion adapter). The sampler pieces (`DiffusionSampler`) are small frozen dataclasses passed as static
jit arguments, so one config line swaps any of them.

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

import dataclasses
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
from hackable_diffusion.diffusion.processes import MaskingProcess, NoiseProcess, UniformProcess
from hackable_diffusion.diffusion.schedules import LinearSchedule
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.attention import KVCache
from hackable_diffusion.models.config import resolve_dtype
from hackable_diffusion.models.self_conditioning import NULL_SIGNALS
from hackable_diffusion.sampling import vocab_chunks
from hackable_diffusion.sampling.constraints import LogitConstraint
from hackable_diffusion.sampling.draws import BlockedInverseCdf, GumbelMax
from hackable_diffusion.sampling.early_stopping import EarlyStopping, diffusiongemma_early_stopping
from hackable_diffusion.sampling.selection import NEG_LOGIT, EntropyBound, LogitSummary, SelectionRule, StepInfo
from hackable_diffusion.sampling.temperature import AnnealedTemperature, Temperature
from hackable_diffusion.sampling.views import PermutationViews


@dataclasses.dataclass(frozen=True)
class DiffusionSampler:
    """Everything that defines how a canvas is denoised; defaults are DiffusionGemma's (docs/reference.md §2.1) except the process.

    self_conditioning: None = use it iff the model has a self-conditioner; True = require it; False = feed the null
      signal at every step (a model without a self-conditioner gets plain token embeddings).
    score_temperature: None = the selection rule scores the temperature-shaped logits the tokens are drawn from
      (DiffusionGemma: entropies of the annealed distribution); a float = it scores logits / score_temperature
      instead (1.0: the model's own probabilities, as Kim et al. 2025 rank by, while tokens are drawn near-greedily).
      A near-zero sampling temperature saturates every confidence at 1 and every entropy at 0, so the ranking then
      degenerates to ties broken by position (left to right); scoring at 1.0 keeps the model's ranking.
    sc_temperature: None = the self-conditioning signal fed to the next step is the expected embedding under the
      temperature-shaped logits (docs/reference.md §1.6); a float = under `biased logits / sc_temperature` instead (the
      logit bias and any constraint applied; 1.0 = the model's own probabilities, which is what training feeds back:
      the first pass's raw logits). Only matters for a model with a self-conditioner; a near-zero sampling temperature
      (a puzzle task drawing at 0.1) otherwise feeds back near one-hot beliefs the model never saw in training.
    views: None = one model call per step; PermutationViews = the step's logits are the mean log-probabilities of the
      model over K relabelled copies of the canvas, batched (views.py; K x the FLOPs, the same number of passes). The
      cached prefix is shared, not relabelled: meant for a task solved in place on an empty cache (a grid puzzle).
    draw: how each position's candidate is drawn from the shaped logits (draws.py): `GumbelMax()` as the reference,
      or `BlockedInverseCdf()`, the same distribution at a fraction of the cost (other tokens for the same key).
    vocab_chunk: 0 = the step computes on whole-vocabulary arrays (several float32 [b, c, v] temporaries at once);
      N > 0 = it scans the vocabulary in chunks of N ids (vocab_chunks.py), holding [b, c, N] ones: the same
      candidates for the same keys, scores and self-conditioning equal to float32 rounding. Needs a selection rule and
      early stopping that read the logits only through entropies, confidences, margins and argmaxes (`chunkable()`,
      every built-in one), no `views`, and with `BlockedInverseCdf` a multiple of its block.
    commit: uniform process only: accepted tokens stay decided (as under a masking process) and each step re-noises
      only the free positions not yet decided; False = the reference, every free position re-decided at every step.
    token_shift: the model was trained with the token shift (diffusion/token_shift.py, `diffusion.token_shift`):
      position j of the canvas reads the model's logits at j - 1 and position 0 the logits of the last real token
      before the canvas, which `denoise_canvas` then needs (`before_logits`; `generate` keeps them). Not with `views`
      or self-conditioning.
    """

    process: NoiseProcess
    selection: SelectionRule = EntropyBound(0.1)
    temperature: Temperature = AnnealedTemperature()
    early_stopping: EarlyStopping = diffusiongemma_early_stopping()
    num_steps: int = 48
    canvas_length: int = 256
    self_conditioning: bool | None = None
    null_signal: str = "zeros"
    forbidden_tokens: tuple[int, ...] = ()
    score_temperature: float | None = None
    sc_temperature: float | None = None
    constraint: LogitConstraint | None = None
    views: PermutationViews | None = None
    draw: GumbelMax | BlockedInverseCdf = GumbelMax()
    vocab_chunk: int = 0
    token_shift: bool = False
    commit: bool = False

    def __post_init__(self):
        checks = (
            ("process", NoiseProcess),
            ("selection", SelectionRule),
            ("temperature", Temperature),
            ("early_stopping", EarlyStopping),
        )
        for name, kind in checks:
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"DiffusionSampler.{name} must be a {kind.__name__}, got {getattr(self, name)!r}.")
        for name in ("num_steps", "canvas_length"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"DiffusionSampler.{name} must be an int >= 1, got {value!r}.")
        if self.null_signal not in NULL_SIGNALS:
            raise ValueError(f"DiffusionSampler.null_signal must be one of {NULL_SIGNALS}, got {self.null_signal!r}.")
        if not isinstance(self.draw, (GumbelMax, BlockedInverseCdf)):
            raise ValueError(f"DiffusionSampler.draw must be GumbelMax() or BlockedInverseCdf(), got {self.draw!r}.")
        if self.selection.remasks and not self.persistent:
            raise ValueError(
                f"{type(self.selection).__name__} re-masks committed tokens and needs a MaskingProcess, "
                f"got {type(self.process).__name__}."
            )
        forbidden = tuple(int(i) for i in self.forbidden_tokens)
        bad = [i for i in forbidden if not 0 <= i < self.process.vocab_size]
        if bad:
            raise ValueError(f"DiffusionSampler.forbidden_tokens {bad} are outside [0, {self.process.vocab_size}).")
        object.__setattr__(self, "forbidden_tokens", forbidden)
        if self.constraint is not None and not isinstance(self.constraint, LogitConstraint):
            raise ValueError(f"DiffusionSampler.constraint must be a LogitConstraint or None, got {self.constraint!r}.")
        if self.views is not None:
            if not isinstance(self.views, PermutationViews):
                raise ValueError(f"DiffusionSampler.views must be PermutationViews or None, got {self.views!r}.")
            if self.views.vocab_size != self.process.vocab_size:
                raise ValueError(
                    f"DiffusionSampler.views relabel {self.views.vocab_size} token ids, the process has "
                    f"{self.process.vocab_size}."
                )
        if self.sc_temperature is not None and not self.sc_temperature > 0:
            raise ValueError(
                f"DiffusionSampler.sc_temperature must be None (feed back the sampling distribution) or > 0, got "
                f"{self.sc_temperature!r}."
            )
        if self.score_temperature is not None and not self.score_temperature > 0:
            raise ValueError(
                f"DiffusionSampler.score_temperature must be None (score the sampling distribution) or > 0, got "
                f"{self.score_temperature!r}."
            )
        if self.commit and self.persistent:
            raise ValueError(
                "DiffusionSampler.commit keeps a uniform sampler's accepted tokens; a masking process always keeps "
                "them: leave commit=False."
            )
        if self.token_shift and self.views is not None:
            raise ValueError(
                "DiffusionSampler.token_shift reads each position's logits from its left neighbour; relabelled views "
                "(a grid puzzle solved in place) have no such order. Use views=None or token_shift=False."
            )
        self._check_vocab_chunk()

    def _check_vocab_chunk(self):
        chunk = self.vocab_chunk
        if not isinstance(chunk, (int, np.integer)) or isinstance(chunk, bool) or chunk < 0:
            raise ValueError(f"DiffusionSampler.vocab_chunk must be an int >= 0 (0 = off), got {chunk!r}.")
        object.__setattr__(self, "vocab_chunk", int(chunk))
        if not chunk:
            return
        if not self.selection.chunkable():
            raise ValueError(
                f"DiffusionSampler.vocab_chunk: the selection rule {self.selection!r} may read the whole distribution "
                f"and cannot be computed in vocabulary chunks; use vocab_chunk=0."
            )
        if not self.early_stopping.chunkable():
            raise ValueError(
                f"DiffusionSampler.vocab_chunk: the early-stopping rule {self.early_stopping!r} may read the whole "
                f"distribution and cannot be computed in vocabulary chunks; use vocab_chunk=0."
            )
        if self.views is not None:
            raise ValueError(
                "DiffusionSampler.vocab_chunk cannot be combined with views (each view's log-probabilities are a "
                "[b, c, v] array of their own); use vocab_chunk=0."
            )
        v = self.process.vocab_size
        if isinstance(self.draw, BlockedInverseCdf) and chunk < v and chunk % min(self.draw.block, v):
            raise ValueError(
                f"DiffusionSampler.vocab_chunk {chunk} must be a multiple of BlockedInverseCdf.block "
                f"{self.draw.block} (or >= the vocabulary, {v})."
            )

    @classmethod
    def diffusiongemma(cls, vocab_size: int, **overrides: Any) -> DiffusionSampler:
        """The reference sampler: uniform process over the whole vocabulary, entropy bound 0.1, annealed 0.8 -> 0.4,
        stability AND entropy <= 0.005, 48 steps, canvases of 256."""
        return cls(process=UniformProcess(vocab_size, LinearSchedule()), **overrides)

    def replace(self, **changes: Any) -> DiffusionSampler:
        return dataclasses.replace(self, **changes)

    @property
    def persistent(self) -> bool:
        """True for a masking process: decided tokens stay decided."""
        return isinstance(self.process, MaskingProcess)

    @property
    def keeps_decisions(self) -> bool:
        """True when accepted tokens stay: a masking process, or a uniform one with `commit`."""
        return self.persistent or self.commit

    def uses_self_conditioning(self, model: T.Transformer) -> bool:
        if self.self_conditioning and not model.cfg.self_conditioning:
            raise ValueError(
                "DiffusionSampler.self_conditioning=True but the model has no self-conditioner "
                "(model.self_conditioning=False); set it to None or False."
            )
        return model.cfg.self_conditioning if self.self_conditioning is None else self.self_conditioning

    def logit_bias(self) -> Float[Array, "v"]:
        """0 for allowed tokens, -1e30 for forbidden ones (and the mask token of a masking process)."""
        bias = np.zeros(self.process.vocab_size, np.float32)
        bias[list(self.forbidden_tokens)] = NEG_LOGIT
        if self.persistent:
            bias[self.process.mask_id] = NEG_LOGIT
        return jnp.asarray(bias)

    def initial_canvas(
        self,
        keys: Array,
        batch_size: int,
        *,
        fixed: Bool[Array, "b c"] | None = None,
        fixed_tokens: Int[Array, "b c"] | None = None,
    ) -> Int[Array, "b c"]:
        """A canvas drawn from the prior (one key per row), with `fixed_tokens` written where `fixed`."""
        keys = row_keys(keys, batch_size)
        canvas = jax.vmap(lambda k: self.process.prior_sample(k, (self.canvas_length,)))(keys).astype(jnp.int32)
        if fixed is not None:
            if fixed_tokens is None:
                raise ValueError("fixed was given without fixed_tokens (the tokens to keep at those positions).")
            canvas = jnp.where(fixed, jnp.asarray(fixed_tokens, jnp.int32), canvas)
        return canvas


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
