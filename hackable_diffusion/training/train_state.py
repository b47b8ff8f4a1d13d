"""Train state pytree and a model-agnostic train step (gradient accumulation, EMA, non-finite guard).

Follows the functional pattern of `flax.training.train_state` / big_vision / MaxText: the whole state is one pytree
and `train_step(state, batch) -> (state, metrics)` is a pure function jitted at the boundary.

Deliberate differences:
  * The per-step randomness is `fold_in(state.rng, state.step)` (then `fold_in(., micro_batch)`), with `state.rng`
    never advanced: the key of step k depends only on the seed and k, so a resumed run is bit-identical.
  * `state.rng` holds raw uint32 key data (not a typed key) so checkpoints store a plain integer array; `loss_fn`
    receives a typed key (`jax.random.wrap_key_data`).
  * A step whose loss or gradients are not all finite is not applied: the returned state is the input state and
    `metrics["finite"]` is False. Nothing non-finite can reach the parameters, the EMA or a checkpoint.
  * Gradient accumulation splits the batch's leading axis strided (micro-batch i takes rows i, i+A, i+2A, ...), so
    every micro-batch keeps the batch's (data, fsdp) sharding instead of living on a subset of devices.
  * EMA uses a constant decay (no warmup correction): ema <- decay * ema + (1 - decay) * params.
  * A loss may veto its step: when its metrics hold `APPLY_UPDATE` ("apply_update", averaged over micro-batches)
    and it is 0, the params, optimizer state and EMA stay exactly as they were and only the step counter advances
    (RL's `rl.skip_uninformative_steps`: a batch without an informative group, for expert iteration without an
    accepted completion). Without it every finite step is applied, a zero gradient included: Adam's momentum still
    moves the weights then.
  * A loss whose `uses_step` attribute is True (an objective with adaptation schedules, `diffusion.adaptation`) is
    called as `loss_fn(params, batch, key, step=state.step)`: the step is a traced scalar, so one compiled step
    serves every step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec
from jaxtyping import Array, Bool, Float, Int, UInt32

PyTree = Any
Batch = Mapping[str, Array]
APPLY_UPDATE = "apply_update"  # a loss metric: 0 skips the step's update (module docstring)
LossFn = Callable[[PyTree, Batch, Array], tuple[Float[Array, ""], Mapping[str, Array]]]


@flax.struct.dataclass
class TrainState:
    """Everything a training run needs to continue exactly: the step, params, optimizer state, EMA and rng."""

    step: Int[Array, ""]
    params: PyTree
    opt_state: PyTree
    ema_params: PyTree | None
    rng: UInt32[Array, "2"]

    @classmethod
    def create(
        cls, params: PyTree, optimizer: optax.GradientTransformation, rng: Array, *, use_ema: bool = False
    ) -> "TrainState":
        """A step-0 state. `rng` may be a typed key or raw uint32 key data."""
        if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
            rng = jax.random.key_data(rng)
        return cls(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=optimizer.init(params),
            ema_params=jax.tree.map(jnp.copy, params) if use_ema else None,
            rng=jnp.asarray(rng, jnp.uint32),
        )


def step_key(state_rng: UInt32[Array, "2"], step: Int[Array, ""]) -> Array:
    """The typed key used by train step `step` (a pure function of the seed key and the step)."""
    return jax.random.fold_in(jax.random.wrap_key_data(state_rng), step)


def all_finite(tree: PyTree) -> Bool[Array, ""]:
    """True iff every floating-point leaf of `tree` is finite."""
    checks = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(checks)) if checks else jnp.array(True)


def _split_micro_batches(batch: Batch, num: int) -> Batch:
    """(B, ...) -> (num, B // num, ...) with micro-batch i = rows i, i+num, ... (keeps the batch sharding local)."""

    def split(x):
        if x.shape[0] % num:
            raise ValueError(
                f"batch leading size {x.shape[0]} is not divisible by grad_accum_steps={num}; "
                "make the global batch a multiple of grad_accum_steps."
            )
        return jnp.swapaxes(x.reshape(x.shape[0] // num, num, *x.shape[1:]), 0, 1)

    return jax.tree.map(split, batch)


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    lr_schedule: optax.Schedule | None = None,
    grad_accum_steps: int = 1,
    ema_decay: float = 0.0,
    trainable_mask: Any = None,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, Array]]]:
    """Builds `train_step(state, batch) -> (state, metrics)`.

    Args:
      loss_fn: `loss_fn(params, batch, key) -> (scalar loss, dict of scalar metrics)`; the loss must be a mean over
        examples so that averaging micro-batch gradients equals the full-batch gradient. With `loss_fn.uses_step`
        True it also gets `step=` (the step being taken).
      optimizer: the optax transformation (from `optimizers.make_optimizer`).
      lr_schedule: reported as `metrics["lr"]` at the step being taken (optional). A vetoed step (`APPLY_UPDATE` = 0)
        does not advance the optimizer's own count, so after k vetoed steps the optimizer uses the schedule's value
        at `step - k`, and `metrics["lr"]` (read at `state.step`) runs ahead of it by k steps.
      grad_accum_steps: split the batch's leading axis into this many micro-batches, scanned sequentially.
      ema_decay: 0 disables the EMA (then `state.ema_params` must be None).
      trainable_mask: the mask given to `make_optimizer` (pytree of bools or callable params -> bools). Gradients of
        frozen params are replaced by zeros, so XLA drops their computation and they do not enter `grad_norm` or
        the finiteness check.

    Metrics: the loss_fn metrics (micro-batch mean), `loss`, `grad_norm` (before clipping), `param_norm`, `lr`,
    and `finite` (bool). When `finite` is False the returned state is the input state.
    """
    if grad_accum_steps < 1:
        raise ValueError(f"grad_accum_steps must be >= 1, got {grad_accum_steps}.")
    if not 0.0 <= ema_decay < 1.0:
        raise ValueError(f"ema_decay must be in [0, 1), got {ema_decay}; use 0 to disable the EMA.")
    uses_step = bool(getattr(loss_fn, "uses_step", False))

    def loss_at(params, batch, key, step):
        return loss_fn(params, batch, key, step=step) if uses_step else loss_fn(params, batch, key)

    value_and_grad = jax.value_and_grad(loss_at, has_aux=True)

    def grad_fn(params, batch, key, step):
        (loss, aux), grads = value_and_grad(params, batch, key, step)
        if trainable_mask is not None:  # zeros for frozen params: their backward pass becomes dead code
            mask = trainable_mask(params) if callable(trainable_mask) else trainable_mask
            grads = jax.tree.map(lambda g, m: g if m else jnp.zeros_like(g), grads, mask)
        return (loss, aux), grads

    def loss_and_grads(params, batch, key, step):
        if grad_accum_steps == 1:
            (loss, aux), grads = grad_fn(params, batch, key, step)
            return loss, dict(aux), grads
        micro = _split_micro_batches(batch, grad_accum_steps)

        def body(carry, xs):
            index, micro_batch = xs
            (loss, aux), grads = grad_fn(params, micro_batch, jax.random.fold_in(key, index), step)
            grad_sum, loss_sum, aux_sum = carry
            grad_sum = jax.tree.map(lambda s, g: s + g.astype(s.dtype), grad_sum, grads)
            aux_sum = jax.tree.map(lambda s, a: s + a, aux_sum, dict(aux))
            return (grad_sum, loss_sum + loss, aux_sum), None

        first_micro = jax.tree.map(lambda x: x[0], micro)
        aux_shape = jax.eval_shape(lambda p, b: loss_at(p, b, key, step)[1], params, first_micro)
        init = (
            jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.promote_types(p.dtype, jnp.float32)), params),
            jnp.zeros((), jnp.float32),
            jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), dict(aux_shape)),
        )
        (grad_sum, loss_sum, aux_sum), _ = jax.lax.scan(body, init, (jnp.arange(grad_accum_steps), micro))
        scale = 1.0 / grad_accum_steps
        grads = jax.tree.map(lambda g, p: (g * scale).astype(p.dtype), grad_sum, params)
        aux = jax.tree.map(lambda a: a * scale, aux_sum)
        return loss_sum * scale, aux, grads

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, Array]]:
        if (state.ema_params is None) != (ema_decay == 0.0):
            raise ValueError("ema_decay and state.ema_params disagree: create the state with use_ema=(ema_decay > 0).")
        key = step_key(state.rng, state.step)
        loss, aux, grads = loss_and_grads(state.params, batch, key, state.step)
        finite = jnp.isfinite(loss) & all_finite(grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        ema = state.ema_params
        if ema is not None:
            ema = jax.tree.map(lambda e, p: (ema_decay * e + (1.0 - ema_decay) * p).astype(e.dtype), ema, params)
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, ema_params=ema)
        # Keep the old state when anything is non-finite (a select, so the shapes and shardings stay put).
        new_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_state, state)
        if APPLY_UPDATE in aux:  # the loss vetoed the update: everything but the step counter stays
            skipped = state.replace(step=state.step + 1)
            keep = (aux[APPLY_UPDATE] > 0) | ~finite  # a non-finite step keeps the input state, step included
            new_state = jax.tree.map(lambda new, old: jnp.where(keep, new, old), new_state, skipped)
        metrics = dict(aux)
        metrics.update(
            loss=loss,
            grad_norm=optax.global_norm(grads),
            param_norm=optax.global_norm(state.params),
            finite=finite,
        )
        if lr_schedule is not None:
            metrics["lr"] = jnp.asarray(lr_schedule(state.step), jnp.float32)
        return new_state, metrics

    return train_step


def jit_train_step(
    train_step: Callable[[TrainState, Batch], tuple[TrainState, dict[str, Array]]],
    *,
    mesh: jax.sharding.Mesh,
    state_shardings: PyTree,
    batch_sharding: NamedSharding,
    donate: bool = True,
    compiler_options: Mapping[str, Any] | None = None,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, Array]]]:
    """`jax.jit` with the state's shardings in and out, the batch sharding in, replicated metrics out.

    With `donate=True` the input state's buffers are reused for the output (do not touch the old state after).
    `compiler_options` go to XLA for this program (e.g. `{"xla_backend_optimization_level": 0}` compiles a CPU
    test model ~2.5x faster).
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.jit(
        train_step,
        in_shardings=(state_shardings, batch_sharding),
        out_shardings=(state_shardings, replicated),
        donate_argnums=(0,) if donate else (),
        compiler_options=dict(compiler_options) if compiler_options else None,
    )
