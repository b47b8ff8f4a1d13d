"""The one fine-tuning runner: what `sft`, `rl` and `distill` share between "these starting weights, this objective,
this data stream" and the trained state, and the loop entry `train` uses too.

A fine-tuning command differs from the others only in its objective and its data stream (SFT: canvas cross-entropy on
prompt -> response rows; RL: a policy-gradient loss on rollouts; distillation: a student loss on teacher trajectories
or the student's own samples). The rest is here, once:

- `locked_start(workdir, body)`: the workdir lock against a second writer, and the undo of a start that fails before
  training begins (`WorkdirLock`'s undo_failed_start); `body(started)` calls `started()` once training begins.
- `Trainable`: the starting weights made trainable, fully (`lora.rank = 0`; `lora.freeze_router` keeps the MoE router
  as pretrained) or as LoRA adapters over frozen base weights (Hu et al. 2021; the run's checkpoints hold
  `{"base", "lora"}`, the base frozen by the optimizer's mask). It gives the loop's init, loss wrapper, mask and
  logical axes, the weights the model computes with (`weights`: LoRA merged) and the frozen starting weights
  (`reference`: what a KL term is measured against).
- `train_loop(config, workdir, ...)`: `training.loop.train` with the config's `train`, `optimizer` and `mesh`
  sections; `finetune(...)` is that loop for a `Trainable`, with the task's evaluation run on the merged weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from hackable_diffusion import builders
from hackable_diffusion.models import lora as lora_lib
from hackable_diffusion.models import partitioning
from hackable_diffusion.training import loop, sharding
from hackable_diffusion.training.workdir_lock import WorkdirLock

T = TypeVar("T")
PyTree = Any


def locked_start(workdir: str, body: Callable[[Callable[[], None]], T]) -> T:
    """`body(started)` holding `workdir`'s lock (process 0; the other processes of a multi-process run do not lock):
    until `started()` is called a failure removes what the start wrote, after it the run's files are kept."""
    lock = WorkdirLock(workdir, undo_failed_start=True) if jax.process_index() == 0 else None
    with lock if lock is not None else contextlib.nullcontext():
        return body(lock.started if lock is not None else lambda: None)


@dataclasses.dataclass(frozen=True)
class Trainable:
    """Starting weights made trainable: fully (`adapter` None) or as LoRA adapters over the frozen `base_params`."""

    base_params: PyTree
    adapter: lora_lib.LoRA | None = None
    freeze_router: bool = False  # full fine-tuning only: the MoE router keeps its pretrained weights

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict, base_params: PyTree) -> Trainable:
        """The config's `lora` section (rank 0 or absent: full fine-tuning)."""
        adapter = builders.build_adapter(config)
        freeze = adapter is None and bool(config.get("lora", {}).get("freeze_router", False))
        return cls(base_params=base_params, adapter=adapter, freeze_router=freeze)

    def init_fn(self, key: jax.Array) -> PyTree:
        """The first state's parameters: the starting weights, or `{"base", "lora"}` with fresh adapters."""
        if self.adapter is None:
            return jax.tree.map(jnp.asarray, self.base_params)
        return lora_lib.init_state(self.adapter, self.base_params, key)

    def loss_fn(self, objective: Callable[..., Any]) -> Callable[..., Any]:
        """`objective(weights, batch, key)` as a loss of the state's parameters (LoRA: of the adapters, merged)."""
        return objective if self.adapter is None else lora_lib.lora_loss_fn(self.adapter, objective)

    @property
    def trainable_mask(self) -> Callable[[PyTree], PyTree] | None:
        if self.adapter is not None:
            return lora_lib.trainable_mask
        return lora_lib.router_frozen_mask if self.freeze_router else None

    @property
    def logical_axes(self) -> Callable[[PyTree], PyTree]:
        return partitioning.logical_axes if self.adapter is None else lora_lib.logical_axes

    @functools.cached_property
    def _merge(self) -> Callable[[PyTree, PyTree], PyTree]:
        return jax.jit(self.adapter.merge)

    def weights(self, params: PyTree) -> PyTree:
        """The weights the model computes with, from the state's parameters (LoRA: base + adapters merged)."""
        if self.adapter is None:
            return params
        return self._merge(params[lora_lib.BASE_KEY], params[lora_lib.LORA_KEY])

    def reference(self, params: PyTree) -> PyTree:
        """The frozen starting weights (LoRA: the state's own frozen base; full: the weights the run started from)."""
        return self._held_base if self.adapter is None else params[lora_lib.BASE_KEY]

    @functools.cached_property
    def _held_base(self) -> PyTree:
        return jax.tree.map(jnp.asarray, self.base_params)

    def adapters(self, params: PyTree) -> PyTree | None:
        """The LoRA adapters of the state's parameters (None for full fine-tuning)."""
        return None if self.adapter is None else params[lora_lib.LORA_KEY]

    def describe(self) -> str:
        """One phrase for a run's start-up line: "full" or "LoRA rank r, alpha a (N trainable)"."""
        if self.adapter is None:
            return "full" + (" (router frozen)" if self.freeze_router else "")
        shapes = jax.eval_shape(self.adapter.init, self.base_params, jax.random.key(0))
        count = lora_lib.num_params(shapes)
        return f"LoRA rank {self.adapter.rank}, alpha {self.adapter.alpha} ({count:,} trainable)"


def train_loop(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    init_fn: Callable[[jax.Array], PyTree],
    loss_fn: Callable[..., Any],
    train_iterator: Iterator[Mapping[str, np.ndarray]],
    logical_axes: Callable[[PyTree], PyTree] = partitioning.logical_axes,
    trainable_mask: Any = None,
    eval_fn: Callable[[PyTree, PyTree | None], Mapping[str, float]] | None = None,
    loop_settings: loop.LoopConfig | None = None,
    mesh: Any = None,
    hooks: Sequence[loop.Hook] = (),
    before_step: Sequence[loop.BeforeStep] = (),
) -> Any:
    """`training.loop.train` with the config's sections: `train` (steps, logging, checkpoints; `loop_settings`
    replaces it when the caller adds throughput figures), `optimizer`, `mesh` (or the given mesh) and
    `train.fast_compile` (XLA optimisation level 0: faster compiles, slower steps)."""
    fast = config.train.get("fast_compile", False)
    return loop.train(
        workdir=workdir,
        init_fn=init_fn,
        loss_fn=loss_fn,
        train_iterator=train_iterator,
        loop=loop_settings or loop.LoopConfig.from_config(config.train, seed=config.seed),
        optimizer_cfg=builders.optimizer_config(config),
        mesh=mesh if mesh is not None else sharding.make_mesh(config.mesh),
        param_logical_axes_fn=logical_axes,
        eval_fn=eval_fn,
        trainable_mask=trainable_mask,
        hooks=hooks,
        before_step=before_step,
        compiler_options={"xla_backend_optimization_level": 0} if fast else None,
    )


def finetune(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    trainable: Trainable,
    loss_fn: Callable[..., Any],
    train_iterator: Iterator[Mapping[str, np.ndarray]],
    started: Callable[[], None],
    task_eval: Callable[[PyTree, PyTree | None], Mapping[str, float]] | None = None,
    param_eval: Callable[[PyTree, PyTree | None], Mapping[str, float]] | None = None,
    **loop_options: Any,
) -> Any:
    """Trains `trainable` on `loss_fn` (already `trainable.loss_fn(objective)`, with any metric wrappers) over
    `train_iterator`; returns the final TrainState. `task_eval(weights, ema_weights)` is the task's evaluation of
    merged weights (run every `train.eval_every` steps when that is set); `param_eval(params, ema_params)` one that
    reads the state's parameters as they are (SFT's held-out loss). `started()` is called just before the loop."""
    eval_fn = param_eval
    if task_eval is not None and config.train.get("eval_every"):

        def eval_fn(params, ema_params):
            ema = None if ema_params is None else trainable.weights(ema_params)
            return task_eval(trainable.weights(params), ema)

    started()  # from here a failure keeps what the run wrote
    return train_loop(
        config,
        workdir,
        init_fn=trainable.init_fn,
        loss_fn=loss_fn,
        train_iterator=train_iterator,
        logical_axes=trainable.logical_axes,
        trainable_mask=trainable.trainable_mask,
        eval_fn=eval_fn,
        **loop_options,
    )


def final_weights(trainable: Trainable, state: Any) -> PyTree:
    """The trained weights on the host, LoRA merged: the EMA's when the run keeps one."""
    params = state.ema_params if state.ema_params is not None else state.params
    return jax.device_get(trainable.weights(params))
