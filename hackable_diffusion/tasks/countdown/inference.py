"""Countdown answers from a trained model: the completion canvas after each prompt, in either layout.

* in place: the row [prompt; completion] is one canvas on an empty KV cache, the prompt fixed and the completion
  masked, denoised by the run's `DiffusionSampler` (`builders.build_sampler`, `config.sampler.num_steps` passes at
  most) with `sampling.canvas.denoise_canvas`, as Sudoku is solved in place. The sampler may write PAD (the tail after
  EOS is PAD in training) but never BOS or MASK.
* ar: the prompt prefilled, then C cached decode steps (`generate_ar`) at `config.sampler.ar_temperature` (0:
  greedy), stopping at EOS (PAD after it); PAD, BOS and MASK are never written.

Row i's randomness is fold_in(key(seed), i) (`sampling.canvas.row_keys`), so a problem's answer does not depend on
the batch it is in; the last batch is padded with copies of its last row (inactive in place) so that every batch has
one compiled shape. The sampling functions are jitted; `solve_problems_timed(warm_up=True)` solves the first batch
once before the clock starts, so that problems per second leave compilation out.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

import jax.numpy as jnp
import ml_collections
import numpy as np
from jaxtyping import Int

from hackable_diffusion import builders
from hackable_diffusion.data.tokenizers import BOS_ID, EOS_ID, MASK_ID, PAD_ID
from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.sampling import autoregressive as ar_lib
from hackable_diffusion.sampling.canvas import denoise_canvas
from hackable_diffusion.sampling.keys import row_key_data
from hackable_diffusion.tasks.countdown.layouts import layout_of

if TYPE_CHECKING:
    from hackable_diffusion.experiment import Experiment


@dataclasses.dataclass(frozen=True)
class CountdownSolution:
    """completions: (n, C) int32; forward_passes: each problem's model calls (AR: prefill + decode steps of its
    batch); seconds: wall time of the solving loop after one compile batch."""

    completions: Int[np.ndarray, "n c"]
    forward_passes: Int[np.ndarray, " n"]
    seconds: float


AR_FORBIDDEN = (PAD_ID, BOS_ID, MASK_ID)  # left to right: nothing but answer characters and the EOS that ends them
IN_PLACE_FORBIDDEN = (BOS_ID,)  # in place: the tail after the answer's EOS is written as PAD


def forbidden_tokens(config: ml_collections.ConfigDict) -> tuple[int, ...]:
    """The ids the run's sampler never draws, for its layout (`tasks.capabilities.RestrictsRolloutTokens`)."""
    return AR_FORBIDDEN if layout_of(config) == "ar" else IN_PLACE_FORBIDDEN


def solve_problems(
    exp: Experiment,
    params,
    prompts_tokens: Int[np.ndarray, "n p"],
    *,
    seed: int = 0,
    batch_size: int = 256,
    config: ml_collections.ConfigDict | None = None,
) -> Int[np.ndarray, "n c"]:
    """One sampled completion (C tokens) per prompt row; `config` (default: the run's) holds the sampler settings."""
    return solve_problems_timed(
        exp, params, prompts_tokens, seed=seed, batch_size=batch_size, config=config
    ).completions


def solve_problems_timed(
    exp: Experiment,
    params,
    prompts_tokens: Int[np.ndarray, "n p"],
    *,
    seed: int = 0,
    batch_size: int = 256,
    config: ml_collections.ConfigDict | None = None,
    warm_up: bool = False,
) -> CountdownSolution:
    """`solve_problems` with forward passes and wall time; `warm_up` solves the first batch once before the clock
    starts (so that the time leaves out compilation)."""
    config = config or exp.config
    prompts = np.asarray(prompts_tokens, np.int32)
    prompt_len, completion_len = int(config.data.prompt_len), int(config.data.completion_len)
    if prompts.ndim != 2 or prompts.shape[1] != prompt_len or len(prompts) == 0:
        raise ValueError(f"prompts must be a non-empty (n, {prompt_len}) array of token ids, got {prompts.shape}.")
    n = len(prompts)
    b = max(1, min(int(batch_size), n))
    keys = row_key_data(seed, n)  # on the host: slicing and padding compile nothing, whatever n is
    solve_batch = _batch_solver(exp, params, config, b, prompt_len, completion_len)

    def run(start: int) -> tuple[np.ndarray, np.ndarray]:
        chunk, chunk_keys = prompts[start : start + b], keys[start : start + b]
        real = len(chunk)
        if real < b:  # pad to the compiled shape with copies of the last row
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], b - real, axis=0)])
            chunk_keys = np.concatenate([chunk_keys, np.repeat(chunk_keys[-1:], b - real, axis=0)])
        completions, passes = solve_batch(chunk, chunk_keys, real)
        return completions[:real], passes[:real]

    if warm_up:
        run(0)
    start_time = time.perf_counter()
    parts = [run(start) for start in range(0, n, b)]
    seconds = time.perf_counter() - start_time
    completions = np.concatenate([p[0] for p in parts]).astype(np.int32)
    return CountdownSolution(completions, np.concatenate([p[1] for p in parts]), seconds)


def _batch_solver(exp, params, config, b: int, prompt_len: int, completion_len: int):
    """`solve(prompts (b, P), keys (b,), real rows) -> (completions (b, C), forward passes (b,))` for the layout."""
    if layout_of(config) == "ar":
        sampling = ar_lib.ARSampling(temperature=float(config.sampler.ar_temperature))

        def solve_ar(prompts, keys, real):
            del real
            out = ar_lib.generate_ar(
                exp.model,
                params,
                jnp.asarray(prompts),
                key=keys,
                max_new_tokens=completion_len,
                sampling=sampling,
                stop_tokens=(EOS_ID,),
                forbidden_tokens=forbidden_tokens(config),
            )
            return np.asarray(out.tokens), np.full((b,), out.forward_passes, np.int32)

        return solve_ar

    length = prompt_len + completion_len
    sampler = builders.build_sampler(
        config, exp.process, canvas_length=length, forbidden_tokens=forbidden_tokens(config)
    )
    empty_cache = init_cache(exp.model.cfg, b, 1)  # no prefix: the prompt is part of the canvas
    fixed = jnp.asarray(np.arange(length) < prompt_len)[None].repeat(b, axis=0)

    def solve_in_place(prompts, keys, real):
        given = jnp.concatenate([jnp.asarray(prompts), jnp.full((b, completion_len), MASK_ID, jnp.int32)], axis=1)
        canvas = sampler.initial_canvas(keys, b, fixed=fixed, fixed_tokens=given)
        active = jnp.asarray(np.arange(b) < real)
        result = denoise_canvas(
            exp.model, params, empty_cache, canvas, keys, sampler=sampler, fixed=fixed, active=active
        )
        return np.asarray(result.canvas)[:, prompt_len:], np.asarray(result.steps)

    return solve_in_place
