"""Orbax checkpoints of the train state together with the grain data-iterator state.

Follows the orbax `CheckpointManager` + `Composite` recipe: item "state" is the TrainState pytree
(`StandardSave`/`StandardRestore`, restored directly onto the shardings of an abstract state) and item "data" is the
grain iterator (`grain.checkpoint.CheckpointSave/CheckpointRestore`, one JSON file per process).

Deliberate additions:
  * A state with any non-finite floating-point value is never saved (`NonFiniteStateError`).
  * `restore_latest` walks the steps newest first: an unreadable step (missing or truncated files, a missing item,
    a non-finite restored state) is logged as a warning naming the step and the error, and the previous step is
    tried. With several processes, a step counts as good only if every process restored it.
  * Orbax writes each step into a temporary directory and renames it when complete, so a save interrupted by a crash
    never shows up as a step; the leftovers are removed on the next start (`cleanup_tmp_directories`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from hackable_diffusion.training.train_state import all_finite

PyTree = Any
logger = logging.getLogger(__name__)

_all_finite_jit = jax.jit(all_finite)


class NonFiniteStateError(ValueError):
    """Raised when asked to checkpoint a state that holds NaN or Inf."""


class UnreadableCheckpointsError(ValueError):
    """Checkpoints exist but none can be restored (a ValueError: bad input, reported on one line by the commands)."""


def abstract_like(tree: PyTree) -> PyTree:
    """ShapeDtypeStructs (with each array's sharding) for restoring onto the same layout as `tree`."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)


def _agree_across_processes(ok: bool) -> bool:
    if jax.process_count() == 1:
        return ok
    return bool(np.all(multihost_utils.process_allgather(np.array(ok, np.bool_))))


def _short_reason(error: BaseException) -> str:
    """One readable line for an orbax/tensorstore error: its type and first line, with the reprs of internal objects
    (`<bound method ... of TensorStore({...})>`) that those messages embed left out."""
    import re

    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = re.sub(r"<(bound method|function|built-in)[^\n]*?>(\)+)?", "<...>", text)
    text = re.sub(r"\{[^{}]{200,}\}", "{...}", text)
    return f"{type(error).__name__}: {text[:300]}"


class Checkpointer:
    """Keeps the last `max_to_keep` checkpoints of (train state, data iterator) under `directory`."""

    def __init__(self, directory: str, max_to_keep: int = 3, *, async_save: bool = True):
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}.")
        self.directory = os.path.abspath(directory)
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep,
                enable_async_checkpointing=async_save,
                cleanup_tmp_directories=True,
            ),
        )
        self._unreadable_steps: set[int] = set()

    def all_steps(self) -> list[int]:
        """Completed checkpoint steps, oldest first."""
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def save(self, step: int, state: PyTree, data_iterator: Any | None = None) -> None:
        """Starts an (async) save of `state` and the iterator's position; raises NonFiniteStateError on NaN/Inf."""
        if not bool(_all_finite_jit(state)):
            raise NonFiniteStateError(
                f"refusing to checkpoint step {step}: the train state holds NaN or Inf values; the last good "
                f"checkpoint in {self.directory} is step {self.latest_step()}."
            )
        step = int(step)
        if step in self._unreadable_steps and step in self._manager.all_steps():
            logger.warning("replacing the unreadable checkpoint step %d in %s.", step, self.directory)
            self._manager.delete(step)
        self._unreadable_steps.discard(step)
        items = {"state": ocp.args.StandardSave(state)}
        if data_iterator is not None:
            items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
        self._manager.save(step, args=ocp.args.Composite(**items))

    def restore(self, step: int, abstract_state: PyTree, data_iterator: Any | None = None) -> PyTree:
        """Restores one step onto `abstract_state` (ShapeDtypeStructs with shardings); sets the iterator in place."""
        items = {"state": ocp.args.StandardRestore(abstract_state)}
        if data_iterator is not None:
            items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
        restored = self._manager.restore(int(step), args=ocp.args.Composite(**items))
        state = restored["state"]
        if not bool(_all_finite_jit(state)):
            raise NonFiniteStateError(f"checkpoint step {step} holds NaN or Inf values.")
        return state

    def restore_latest(self, abstract_state: PyTree, data_iterator: Any | None = None) -> tuple[PyTree, int] | None:
        """(state, step) from the newest readable checkpoint, None if there is none.

        Unreadable steps are skipped with a warning (and replaced when that step is saved again). If checkpoints
        exist but none is readable, raises RuntimeError rather than silently starting from scratch.
        """
        steps = self.all_steps()
        for step in reversed(steps):
            error = None
            try:
                state = self.restore(step, abstract_state, data_iterator)
            except Exception as e:  # orbax/tensorstore raise many types for damaged files
                error = e
            if _agree_across_processes(error is None):
                return state, step
            self._unreadable_steps.add(step)
            reason = _short_reason(error) if error is not None else "another process could not read it"
            logger.warning(
                "checkpoint step %d in %s is unreadable or damaged (%s); falling back to the previous checkpoint.",
                step,
                self.directory,
                reason,
            )
        if steps:
            raise UnreadableCheckpointsError(
                f"none of the checkpoints {steps} in {self.directory} could be restored (see the warnings above); "
                "move the directory away to start from scratch."
            )
        return None

    def wait(self) -> None:
        """Blocks until pending async saves are on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
