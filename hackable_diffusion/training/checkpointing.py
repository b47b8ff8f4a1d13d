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
  * When `restore_latest` falls back past damaged steps, it moves them out of orbax's sight into `<directory>_damaged/`
    (kept for inspection, never deleted) and logs a warning saying where: the run then saves its next steps normally,
    whereas orbax would skip every save of a step older than a damaged newer one.
  * A save that does not happen is never silent. An async save is confirmed as soon as it has finished (`poll`, which
    the training loop calls after every step), before the next one starts and in `wait` / `close`; a save orbax skips
    or fails to finish raises `CheckpointSaveError` (a full disk: `DiskFullError`) after
    removing the partial step directory, with the earlier checkpoints left as they were. Orbax's own error logs and
    the tracebacks of its write threads are held back (a failed save is reported once, with its cause).
"""

from __future__ import annotations

import collections
import glob
import logging
import os
import shutil
import sys
import traceback
from typing import Any, NoReturn

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from hackable_diffusion.data import safe_files
from hackable_diffusion.training.train_state import all_finite

PyTree = Any
logger = logging.getLogger(__name__)

_all_finite_jit = jax.jit(all_finite)
TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax writes step N into "N.orbax-checkpoint-tmp" and renames it when complete
DAMAGED_SUFFIX = "_damaged"  # damaged steps of <directory> move to <directory>_damaged/<step>


class NonFiniteStateError(ValueError):
    """Raised when asked to checkpoint a state that holds NaN or Inf."""


class UnreadableCheckpointsError(ValueError):
    """Checkpoints exist but none can be restored (a ValueError: bad input, reported on one line by the commands)."""


class CheckpointSaveError(ValueError):
    """A requested checkpoint was not written (skipped by orbax, or its write failed); reported on one line."""


class _OrbaxErrorLog(logging.Filter):
    """While a save is in flight (`saving` > 0), holds back orbax's ERROR log records (every background thread of a
    failed save logs its own traceback, and asyncio logs the failed writes nobody awaited) and keeps the latest
    messages, so that `Checkpointer` reports a failed save once, with its cause. Outside saves they pass."""

    LOGGERS = ("absl", "asyncio")  # orbax logs through absl.logging; asyncio logs "exception was never retrieved"

    def __init__(self):
        super().__init__()
        self.count = 0
        self.saving = 0  # saves started and not yet confirmed, over every Checkpointer of the process
        self.messages: collections.deque[tuple[int, str]] = collections.deque(maxlen=16)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.saving or record.levelno < logging.ERROR or not _from_orbax(record):
            return True
        self.count += 1
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
        self.messages.append((self.count, text))
        return False

    def since(self, mark: int) -> list[str]:
        """The messages held back after the `mark`-th one."""
        return [text for count, text in self.messages if count > mark]


_ORBAX_ERRORS = _OrbaxErrorLog()


def _from_orbax(record: logging.LogRecord) -> bool:
    """Whether orbax logged `record`, or the exception it carries was raised in orbax's code."""
    marker = f"{os.sep}orbax{os.sep}"
    if marker in record.pathname:
        return True
    tb = record.exc_info[2] if record.exc_info else None
    return tb is not None and any(marker in frame.filename for frame in traceback.extract_tb(tb))


def _is_closed_loop_callback(unraisable) -> bool:
    """tensorstore's completion callbacks of a failed save's other writes, arriving after orbax closed their event
    loop: harmless, printed as unraisable `RuntimeError: Event loop is closed` tracebacks."""
    error = unraisable.exc_value
    return unraisable.object is None and isinstance(error, RuntimeError) and str(error) == "Event loop is closed"


def _quiet_orbax_errors() -> None:
    """Installs (once) the filter of orbax's error logs and the hook that drops the closed-event-loop tracebacks."""
    if _ORBAX_ERRORS in logging.getLogger(_OrbaxErrorLog.LOGGERS[0]).filters:
        return
    for name in _OrbaxErrorLog.LOGGERS:
        logging.getLogger(name).addFilter(_ORBAX_ERRORS)
    previous = sys.unraisablehook

    def hook(unraisable):
        if not _is_closed_loop_callback(unraisable):
            previous(unraisable)

    sys.unraisablehook = hook


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
    text = re.sub(r"\s*See full TensorStore details:.*", "", text)  # a repr that runs on past the first line
    return f"{type(error).__name__}: {text[:300]}"


class Checkpointer:
    """Keeps the last `max_to_keep` checkpoints of (train state, data iterator) under `directory`."""

    def __init__(self, directory: str, max_to_keep: int = 3, *, async_save: bool = True):
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}.")
        self.directory = os.path.abspath(directory)
        _quiet_orbax_errors()
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep,
                enable_async_checkpointing=async_save,
                cleanup_tmp_directories=True,
            ),
        )
        self._pending: int | None = None  # the step of a started save not yet confirmed on disk
        self._log_mark = _ORBAX_ERRORS.count

    def all_steps(self) -> list[int]:
        """Completed checkpoint steps, oldest first."""
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def save(self, step: int, state: PyTree, data_iterator: Any | None = None) -> None:
        """Starts an (async) save of `state` and the iterator's position, after confirming the previous save.

        Raises NonFiniteStateError on NaN/Inf, CheckpointSaveError if orbax skips the step (a newer step exists) or a
        save fails, DiskFullError if a save fails for lack of space.
        """
        if not bool(_all_finite_jit(state)):
            raise NonFiniteStateError(
                f"refusing to checkpoint step {step}: the train state holds NaN or Inf values; the last good "
                f"checkpoint in {self.directory} is step {self.latest_step()}."
            )
        self._confirm_pending()
        step = int(step)
        items = {"state": ocp.args.StandardSave(state)}
        if data_iterator is not None:
            items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
        self._log_mark = _ORBAX_ERRORS.count
        self._pending = step
        _ORBAX_ERRORS.saving += 1
        try:
            saved = self._manager.save(step, args=ocp.args.Composite(**items))
        except Exception as error:  # orbax/tensorstore raise many types for a failed write
            self._pending = None
            _ORBAX_ERRORS.saving -= 1
            self._failed_save(step, error)
        if not saved:
            self._pending = None
            _ORBAX_ERRORS.saving -= 1
            raise CheckpointSaveError(
                f"checkpoint step {step} was not written to {self.directory}: orbax skips a step unless it is newer "
                f"than the newest one there (step {self.latest_step()}); move the newer step folders out of "
                f"{self.directory} (or use a new --workdir) and run again."
            )

    def poll(self) -> None:
        """Confirms the started save if it has finished, raising as `wait` does when it failed, so that a failed save
        is reported when it ends rather than at the next save; returns at once while it is still being written. With
        several processes every process calls it at the same steps (they agree on whether the save has finished)."""
        if self._pending is None:
            return
        finished = not self._manager.is_saving_in_progress()
        if _agree_across_processes(finished):
            self._confirm_pending()

    def _confirm_pending(self) -> None:
        """Waits for the started save; if it did not complete, cleans up after it and raises (see `_failed_save`)."""
        step, self._pending = self._pending, None
        error = None
        try:
            self._manager.wait_until_finished()
        except Exception as e:  # the error of the save's background threads
            error = e
        finally:
            if step is not None:
                _ORBAX_ERRORS.saving -= 1
        complete = error is None and (step is None or os.path.isdir(self._step_dir(step)))
        if not _agree_across_processes(complete):
            self._failed_save(step, error)

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _failed_save(self, step: int | None, error: BaseException | None) -> NoReturn:
        """Removes what the failed save of `step` left, forgets the step, and raises one error naming the cause."""
        if jax.process_index() == 0 and step is not None:
            for leftover in glob.glob(glob.escape(self._step_dir(step) + TMP_SUFFIX) + "*"):
                shutil.rmtree(leftover, ignore_errors=True)
        self._manager.reload()
        logged = _ORBAX_ERRORS.since(self._log_mark)
        name = f"checkpoint step {step}" if step is not None else "a checkpoint"
        latest = self.latest_step()
        kept = "there is no complete checkpoint yet" if latest is None else f"the newest complete one is step {latest}"
        then = f"removed the partial {name}; {kept}"
        errno_name = safe_files.disk_full_errno(error, *logged)
        if errno_name is not None:
            raise safe_files.disk_full_error(self.directory, name, errno_name, then) from error
        if error is not None:
            reason = _short_reason(error)
        else:
            reason = logged[0].splitlines()[0][:300] if logged else "orbax did not finish writing it"
        raise CheckpointSaveError(f"could not write {name} in {self.directory} ({reason}); {then}.") from error

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

    def restore_latest(
        self, abstract_state: PyTree, data_iterator: Any | None = None, *, move_damaged: bool = False
    ) -> tuple[PyTree, int] | None:
        """(state, step) from the newest readable checkpoint, None if there is none.

        Unreadable steps are skipped with a warning; with `move_damaged` (a run that goes on training from here) those
        newer than the step restored are then moved to `<directory>_damaged/` (see `move_aside`). If checkpoints exist
        but none is readable, raises UnreadableCheckpointsError rather than silently starting from scratch (and moves
        nothing).
        """
        steps = self.all_steps()
        damaged = []
        for step in reversed(steps):
            error = None
            try:
                state = self.restore(step, abstract_state, data_iterator)
            except Exception as e:  # orbax/tensorstore raise many types for damaged files
                error = e
            if _agree_across_processes(error is None):
                if move_damaged:
                    self.move_aside(damaged, step)
                return state, step
            damaged.append(step)
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

    def move_aside(self, steps: list[int], resumed_step: int) -> None:
        """Moves the step folders `steps` to `<directory>_damaged/<step>` (out of orbax's sight; nothing is deleted)
        and logs a warning for each, so that a run resumed from `resumed_step` saves its next steps."""
        if not steps:
            return
        if jax.process_index() == 0:
            for step in steps:
                target = _free_path(os.path.join(self.directory + DAMAGED_SUFFIX, str(step)))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.rename(self._step_dir(step), target)
                logger.warning(
                    "moved the damaged checkpoint step %d to %s (kept for inspection, out of the way of the new "
                    "checkpoints): training resumes from step %d.",
                    step,
                    target,
                    resumed_step,
                )
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("checkpointing.move_aside")
        self._manager.reload()

    def wait(self) -> None:
        """Blocks until pending async saves are on disk; raises CheckpointSaveError / DiskFullError if one failed."""
        self._confirm_pending()

    def close(self) -> None:
        """Confirms the pending save (raising as `wait` does) and releases orbax's threads."""
        try:
            self._confirm_pending()
        finally:
            self._manager.close()


def _free_path(path: str) -> str:
    """`path`, or `path-2`, `path-3`, ... if it exists."""
    candidate, n = path, 1
    while os.path.exists(candidate):
        n += 1
        candidate = f"{path}-{n}"
    return candidate
