"""How a model behaves as a function of the noise level, measured on validation batches corrupted at fixed levels.

`routing_at_levels`: an MoE run's capacity-limited routing. With token-choice top-k routing (Switch / GShard), inputs
that look alike go to the same experts; under masking noise a sizeable share of a batch is the same [MASK] token, so
the fraction of token->expert assignments dropped over capacity can grow with t however well balanced the router is
on clean text. The capacity is shared by all b x l tokens of a forward pass: training draws one t per sequence, so its
batches mix levels, while a sampler's batch holds one level at a time. `experiments/training/moe_routing.py` is the command.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from hackable_diffusion.data import text as text_lib


def routing_at_levels(exp, params, levels, num_batches: int, seed: int = 0) -> list[dict]:
    """One record per noise level (a single `None` level for an autoregressive run): the MoE statistics of
    `exp.objective` on `num_batches` validation batches corrupted at exactly that level, averaged over batches."""
    bad = [level for level in levels if not 0.0 <= level <= 1.0]
    if bad:
        raise ValueError(f"noise levels must lie in [0, 1], got {bad}.")
    batch_size = exp.config.data.batch_size
    batches = text_lib.make_eval_batches(exp.data.eval_sequences[: num_batches * batch_size], batch_size)
    records = []
    for level in [None] if exp.is_autoregressive else levels:
        objective = exp.objective
        if level is not None:
            objective = dataclasses.replace(objective, time_sampler=lambda key, b, t=level: jnp.full((b,), t))
        step_fn = jax.jit(objective)
        loss_key = "loss" if level is None else "diffusion_loss"
        totals = {}
        for i, batch in enumerate(batches):
            _, metrics = step_fn(params, batch, jax.random.key(seed + i))
            for key in ("moe_dropped_fraction", "moe_load_balance_loss", "moe_router_z_loss", loss_key):
                totals.setdefault(key, []).append(float(metrics[key]))
        record = {"noise_level": level, "batches": len(batches)}
        records.append(record | {k: float(np.mean(v)) for k, v in totals.items()})
    return records
