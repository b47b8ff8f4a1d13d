"""The generic training loop: sharded init, resume, jitted steps, logging, eval, checkpoints, NaN stop.

Model-agnostic: the model enters only through `init_fn(key) -> params`, `loss_fn(params, batch, key) -> (loss,
metrics)` and `param_logical_axes_fn(path, shape)`; the data through any iterator of dicts of numpy arrays with
`get_state()/set_state()` (a grain iterator). The structure follows the usual JAX LM loops (big_vision, MaxText,
nanoGPT's train.py for directness).

Deliberate choices:
  * Parameters are created directly on the mesh (`jax.jit(init, out_shardings=...)`), and only when no checkpoint is
    found: a resumed run restores onto the abstract state without materialising a fresh init first.
  * The loss is checked every step (one scalar fetched from the device). A non-finite loss or gradient stops the run
    with `NonFiniteLossError` naming the step and the last good checkpoint; the bad update was never applied (see
    `train_state`) and no checkpoint is written after it.
  * A checkpoint that could not be written stops the run with one error (`checkpointing.CheckpointSaveError`, or
    `DiskFullError` for a full disk) once its partial files are removed, at the first step after its (async) write
    ended, not at the next save; a resume past damaged checkpoints moves them
    to `checkpoints_damaged/` first, so the steps it trains are saved. After a failure the loop closes its writers
    without letting their own errors replace the first one.
  * The data iterator is advanced exactly once per step and checkpointed with the state, so the k-th batch of a
    resumed run is the k-th batch of an uninterrupted one; with the step rng = fold_in(seed key, step) a resumed
    run matches an uninterrupted one bit for bit on the same hardware.
  * Logged train metrics are the mean over the steps since the last log line.
  * With several processes, every process runs this same function on its own shard of the data (`train_iterator`
    yields the process-local rows of each global batch); only process 0 writes metrics and prints.
  * SIGINT (Ctrl-C) and SIGTERM (how schedulers preempt jobs) finish the current step, save a checkpoint of everything
    an exact resume needs (parameters, optimizer, EMA, RNG, data iterator), wait for it, say where it is and raise
    `TrainingInterrupted` (exit status 128 + signal: 130 / 143). A second signal aborts at once. With several
    processes the processes agree after every step (one all-gather of a flag), so all of them save the same step even
    when only one was signalled, as preemption-aware trainers do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh

from hackable_diffusion.training import checkpointing, optimizers, sharding
from hackable_diffusion.training import metrics as metrics_lib
from hackable_diffusion.training.train_state import TrainState, jit_train_step, make_train_step

PyTree = Any
Hook = Callable[[int, TrainState, Mapping[str, float]], None]
BeforeStep = Callable[[int, TrainState], None]
EvalFn = Callable[[PyTree, PyTree | None], Mapping[str, Any]]


class NonFiniteLossError(ValueError):
    """Training produced a NaN/Inf loss or gradient; the state was not updated and no checkpoint was written.

    A ValueError: the cause is the run's settings or data (the learning rate, most often), and the commands report it
    as one `error:` line with exit status 2."""


class TrainingInterrupted(Exception):
    """SIGINT/SIGTERM stopped training after a checkpoint was saved; `exit_code` is 128 + the signal number."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class _StopRequests:
    """SIGINT/SIGTERM handlers for the duration of a training run (main thread only): the first signal asks the loop
    to stop after the current step, a second one aborts at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum: int | None = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _handle(self, signum, frame):
        if self.signum is not None:  # the second signal: no more waiting
            self.__exit__()
            raise KeyboardInterrupt(f"aborted by a second {signal.Signals(signum).name}")
        self.signum = signum
        _say(
            f"{signal.Signals(signum).name} received: finishing this step and saving a checkpoint "
            "(send it again to abort at once)."
        )

    def agreed(self) -> int | None:
        """The signal to stop on if any process received one (every process calls this at every step)."""
        if jax.process_count() == 1:
            return self.signum
        from jax.experimental import multihost_utils

        mine = np.int32(self.signum or 0)
        every = np.asarray(multihost_utils.process_allgather(mine))
        return int(every.max()) or None


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """How long to train and how often to log, evaluate and checkpoint (0 disables eval / checkpoints)."""

    total_steps: int
    seed: int = 0
    grad_accum_steps: int = 1
    ema_decay: float = 0.0
    log_every: int = 10
    checkpoint_every: int = 1000
    keep_checkpoints: int = 3
    eval_every: int = 0
    tokens_per_example: int | None = None
    flops_per_token: float | None = None
    peak_flops: float | None = None

    @classmethod
    def from_config(cls, train: ml_collections.ConfigDict, **extra: Any) -> LoopConfig:
        """The loop settings of a config's `train` section (num_steps, grad_accum_steps, ema_decay, log_every,
        checkpoint_every, keep_checkpoints, eval_every); `extra` sets the rest (seed, tokens_per_example, ...)."""
        return cls(
            total_steps=int(train.num_steps),
            grad_accum_steps=int(train.grad_accum_steps),
            ema_decay=float(train.ema_decay),
            log_every=int(train.log_every),
            checkpoint_every=int(train.checkpoint_every),
            keep_checkpoints=int(train.keep_checkpoints),
            eval_every=int(train.eval_every),
            **extra,
        )

    def __post_init__(self):
        if self.total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {self.total_steps}.")
        for name in ("log_every", "checkpoint_every", "eval_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 disables it), got {getattr(self, name)}.")


def _say(message: str) -> None:
    if jax.process_index() == 0:
        print(message, flush=True)


def _mean_metrics(history: Sequence[Mapping[str, float]]) -> dict[str, float]:
    keys = history[-1].keys()
    return {k: float(np.mean([h[k] for h in history if k in h])) for k in keys}


def train(
    *,
    workdir: str,
    init_fn: Callable[[jax.Array], PyTree],
    loss_fn: Callable[..., Any],
    train_iterator: Iterator[Mapping[str, np.ndarray]],
    loop: LoopConfig,
    optimizer_cfg: ml_collections.ConfigDict,
    mesh: Mesh,
    param_logical_axes_fn: sharding.LogicalAxesFn,
    rules: sharding.Rules = sharding.DEFAULT_RULES,
    eval_fn: EvalFn | None = None,
    trainable_mask: Any = None,
    hooks: Sequence[Hook] = (),
    before_step: Sequence[BeforeStep] = (),
    drop_indivisible: bool = False,
    compiler_options: Mapping[str, Any] | None = None,
) -> TrainState:
    """Trains until `loop.total_steps` (resuming from `workdir/checkpoints` if present) and returns the final state.

    Args:
      workdir: run directory; gets checkpoints/, metrics.jsonl and tensorboard/.
      init_fn: `init_fn(key) -> params` (pure; jitted with the param shardings as out_shardings).
      loss_fn: `loss_fn(params, batch, key) -> (loss, metrics)`, the loss a mean over examples.
      train_iterator: yields this process's rows of each global batch (dict of numpy arrays); checkpointed if it has
        get_state/set_state.
      loop: how long to train, and how often to log, evaluate and checkpoint (`LoopConfig.from_config(config.train,
        ...)` for a config's `train` section).
      optimizer_cfg: see `optimizers.make_optimizer`.
      mesh, param_logical_axes_fn, rules, drop_indivisible: see `sharding.param_shardings`.
      eval_fn: `eval_fn(params, ema_params) -> metrics`, called every `loop.eval_every` steps and at the end.
      trainable_mask: a pytree of bools (LoRA, a frozen router): only True leaves are updated.
      hooks: `hook(step, state, metrics)` after every step (after logging and checkpointing).
      before_step: `before_step(step, state)` before each step's batch is drawn: an iterator whose batches depend on
        the current parameters (RL rollouts, `rl.rollouts`) reads them here, on a resumed run too.
      compiler_options: XLA options for the init and train-step programs (see `train_state.jit_train_step`).

    Raises:
      NonFiniteLossError: the loss or gradients became NaN/Inf (message names the step and last good checkpoint).
      checkpointing.CheckpointSaveError: a checkpoint was not written (`DiskFullError`: the disk is full).
    """
    cfg = loop
    optimizer = optimizers.make_optimizer(optimizer_cfg, trainable_mask)
    schedule = optimizers.make_lr_schedule(optimizer_cfg)
    init_key, train_key = jax.random.split(jax.random.key(cfg.seed))

    def create_state(init_key, train_key):
        return TrainState.create(init_fn(init_key), optimizer, train_key, use_ema=cfg.ema_decay > 0)

    abstract = jax.eval_shape(create_state, init_key, train_key)
    p_shardings = sharding.param_shardings(
        abstract.params, param_logical_axes_fn, mesh, rules, drop_indivisible=drop_indivisible
    )
    s_shardings = sharding.state_shardings(abstract, p_shardings, mesh)
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, s_shardings)

    checkpointer = None
    if cfg.checkpoint_every > 0:
        checkpointer = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"), cfg.keep_checkpoints)
    data_to_checkpoint = train_iterator if hasattr(train_iterator, "get_state") else None
    if checkpointer is not None and data_to_checkpoint is None:
        _say("warning: train_iterator has no get_state()/set_state(); a resumed run will restart the data stream.")
    restored = None
    if checkpointer is not None:  # damaged steps newer than the one restored are moved aside, so new saves happen
        restored = checkpointer.restore_latest(abstract, data_to_checkpoint, move_damaged=True)
    if restored is not None:
        state, restored_step = restored
        _say(f"Restored checkpoint at step {restored_step} from {checkpointer.directory}.")
    else:
        compile_opts = dict(compiler_options) if compiler_options else None
        state = jax.jit(create_state, out_shardings=s_shardings, compiler_options=compile_opts)(init_key, train_key)
        num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract.params))
        _say(f"Initialised a new model (seed {cfg.seed}, {num_params:,} parameters); no checkpoint in {workdir}.")
    start_step = int(state.step)
    last_saved = start_step if restored is not None else None

    train_step = jit_train_step(
        make_train_step(
            loss_fn,
            optimizer,
            lr_schedule=schedule,
            grad_accum_steps=cfg.grad_accum_steps,
            ema_decay=cfg.ema_decay,
            trainable_mask=trainable_mask,
        ),
        mesh=mesh,
        state_shardings=s_shardings,
        batch_sharding=sharding.batch_sharding(mesh),
        compiler_options=compiler_options,
    )
    writer = metrics_lib.MetricsWriter(workdir)
    progress = None
    history: list[dict[str, float]] = []

    def save(step):
        nonlocal last_saved
        if checkpointer is not None and last_saved != step:
            checkpointer.save(step, state, data_to_checkpoint)
            last_saved = step

    def run_eval(step):
        eval_metrics = eval_fn(state.params, state.ema_params)
        writer.write(step, eval_metrics, split="eval")
        shown = ", ".join(f"{k} {float(np.asarray(v)):.4g}" for k, v in eval_metrics.items())
        _say(f"eval at step {step}: {shown}")

    stop = _StopRequests()
    try:
        stop.__enter__()
        for step in range(start_step + 1, cfg.total_steps + 1):
            for prepare in before_step:
                prepare(step, state)
            host_batch = next(train_iterator)
            if progress is None:
                global_batch = next(iter(jax.tree.leaves(host_batch))).shape[0] * jax.process_count()
                tokens_per_step = cfg.tokens_per_example * global_batch if cfg.tokens_per_example else None
                progress = metrics_lib.ProgressLogger(
                    cfg.total_steps, tokens_per_step, cfg.flops_per_token, cfg.peak_flops
                )
                _say(f"Compiling the training step (step {step} includes the compilation)...")
                compile_start = time.perf_counter()
            state, step_metrics = train_step(state, sharding.shard_batch(host_batch, mesh))
            step_metrics = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
            if step == start_step + 1:
                _say(f"First step done in {time.perf_counter() - compile_start:.1f}s (compilation included).")
            if not step_metrics.pop("finite"):
                last_good = "there is no checkpoint (checkpointing is off)"
                if checkpointer is not None:
                    checkpointer.wait()
                    latest = checkpointer.latest_step()
                    last_good = (
                        f"the last good checkpoint is step {latest} in {checkpointer.directory}"
                        if latest is not None
                        else f"there is no checkpoint yet in {checkpointer.directory}"
                    )
                raise NonFiniteLossError(
                    f"loss became non-finite at step {step} (loss={step_metrics['loss']}, "
                    f"grad_norm={step_metrics['grad_norm']}); the update was not applied and no checkpoint was "
                    f"written from it; {last_good}. Lower the learning rate (optimizer.peak_lr), lengthen "
                    "warmup_steps, set clip_norm, or inspect this step's batch."
                )
            history.append(step_metrics)
            progress.update(step)
            if cfg.log_every and (step % cfg.log_every == 0 or step == cfg.total_steps):
                mean = _mean_metrics(history)  # what metrics.jsonl stores, and what the line shows
                writer.write(step, {**mean, **progress.rates()}, split="train")
                _say(progress.line(step, mean["loss"], steps_averaged=len(history)))
                history = []
            if eval_fn is not None and cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.total_steps):
                run_eval(step)
            if cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or step == cfg.total_steps):
                save(step)
            if checkpointer is not None:
                checkpointer.poll()  # a save that failed in the background stops the run now
            for hook in hooks:
                hook(step, state, step_metrics)
            signum = stop.agreed()
            if signum is not None and step < cfg.total_steps:
                _interrupt(signum, step, checkpointer, save, workdir)
        if checkpointer is not None:
            save(int(state.step))
    except BaseException:
        _close(stop, writer, checkpointer, quietly=True)
        raise
    _close(stop, writer, checkpointer, quietly=False)
    return state


def _close(stop: _StopRequests, writer: metrics_lib.MetricsWriter, checkpointer, *, quietly: bool) -> None:
    """Restores the signal handlers, closes the metrics and waits for and closes the checkpoints. `quietly` (the run
    is already failing) drops their own errors, so that the first error is the one reported."""
    stop.__exit__()
    if quietly:
        for close in [writer.close] + ([checkpointer.close] if checkpointer is not None else []):
            with contextlib.suppress(Exception):
                close()
        return
    try:  # both run even if the first raises; a checkpoint's error (the run's state) is the one that surfaces
        writer.close()
    finally:
        if checkpointer is not None:
            checkpointer.close()


def _interrupt(signum: int, step: int, checkpointer, save, workdir: str) -> None:
    name = signal.Signals(signum).name
    if checkpointer is None:
        raise TrainingInterrupted(
            f"{name}: stopped at step {step}; checkpointing is off, so nothing was saved.", signum
        )
    save(step)
    checkpointer.wait()
    raise TrainingInterrupted(
        f"{name}: stopped at step {step} and saved it in {checkpointer.directory}; run the same command again "
        f"(same --workdir {workdir}) to resume from there.",
        signum,
    )
