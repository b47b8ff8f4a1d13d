"""Shared pieces of the sampling tests: a tiny random model's shapes, samplers and prompts; shapes are shared
between tests so each jit compiles once."""

import jax
import jax.numpy as jnp

from hackable_diffusion.data.tokenizers import BOS_ID, MASK_ID
from hackable_diffusion.diffusion.processes import MaskingProcess
from hackable_diffusion.diffusion.schedules import LinearSchedule
from hackable_diffusion.models import transformer as T
from hackable_diffusion.sampling import selection_base as SB
from hackable_diffusion.sampling.prompts import (
    pad_prompts,
    prefill,
)
from hackable_diffusion.sampling.sampler import DiffusionSampler

# Jitted model calls (an eager linen pass over a scanned model is far slower than compiling it once).
forward = jax.jit(T.forward, static_argnums=0, static_argnames=("causal",))


VOCAB = 64


CANVAS = 4


STEPS = 6


def uniform_sampler(**changes):
    return DiffusionSampler.diffusiongemma(VOCAB, num_steps=STEPS, canvas_length=CANVAS).replace(**changes)


def masking_sampler(selection, **changes):
    options = dict(num_steps=STEPS, canvas_length=CANVAS) | changes
    return DiffusionSampler(MaskingProcess(VOCAB, LinearSchedule(), MASK_ID), selection=selection, **options)


PROMPTS = [[BOS_ID, 5, 6, 7], [BOS_ID, 9, 10, 11, 12, 13]]  # different lengths: row 0 is right-padded in a batch


WIDTH = 6


CACHE = WIDTH + 3 * CANVAS  # every two-row test uses this cache, so each jitted function compiles once


def prefilled_prompts(model, params):
    prompt, prompt_mask = pad_prompts(PROMPTS)
    _, cache = prefill(model, params, prompt, prompt_mask, cache_length=CACHE)
    return prompt, prompt_mask, cache


def some_sc_signal(model, params, seed):
    logits = jax.random.normal(jax.random.key(seed), (2, CANVAS, VOCAB))
    return jax.jit(lambda x: T.model_method(model, params, "sc_signal", x))(logits)


def logits_from_probs(probs):
    return jnp.log(jnp.asarray(probs, jnp.float32))


def info(step=0, num_steps=4, free=None, persistent=True, shape=(1, 4)):
    free = jnp.ones(shape, bool) if free is None else jnp.asarray(free)
    return SB.StepInfo.at(step, num_steps, LinearSchedule(), free, persistent)
