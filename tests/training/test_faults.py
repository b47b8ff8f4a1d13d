"""Faults a run meets on disk, each reported once and leaving the run resumable: a NaN loss through the train command
(one `error:` line, the last checkpoint untouched), a full disk while writing the token cache, metrics.jsonl or a
checkpoint (`DiskFullError`, nothing partial left behind, earlier checkpoints kept), a damaged newest checkpoint
(moved to `checkpoints_damaged/`, training resumes and saves again), and a save orbax skips (an error, never silent).

The full disk is simulated by raising `OSError(ENOSPC)` from a writer at a chosen save, so no mount is needed.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _commands import run_module
from _training_helpers import _mesh, _run_toy_loop

from hackable_diffusion.data import safe_files, text
from hackable_diffusion.training import checkpointing, metrics

REPO = pathlib.Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _fail_at_call(function, n: int):
    """`function` that raises OSError(ENOSPC) on its n-th call (1-based) instead of running."""
    calls = {"count": 0}

    def wrapper(*args, **kwargs):
        calls["count"] += 1
        if calls["count"] == n:
            _enospc()
        return function(*args, **kwargs)

    return wrapper


def _files_digest(directory: pathlib.Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


# ------------------------------------------------------------------------------------------------------------------
# A NaN loss through the train command
# ------------------------------------------------------------------------------------------------------------------

TINY_CONFIG = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from _tiny_configs import tiny_text_config


def get_config():
    config = tiny_text_config("masking", steps=3, moe=False)
    config.train.eval_every = 0
    return config
"""


def _train_command(config_file, workdir, *overrides):
    args = [f"--config={config_file}", f"--workdir={workdir}", "--sample_at_end=false", *overrides]
    return run_module("hackable_diffusion.train", *args, timeout=240)


@pytest.mark.slow
def test_nan_loss_is_one_error_line_and_leaves_the_last_checkpoint_untouched(tmp_path):
    config_file = tmp_path / "tiny.py"
    config_file.write_text(TINY_CONFIG)
    workdir = tmp_path / "run"
    first = _train_command(config_file, workdir)
    assert first.returncode == 0, first.stderr[-3000:]
    before = _files_digest(workdir / "checkpoints")
    assert sorted(os.listdir(workdir / "checkpoints")) == ["3"]

    lr = ["--config.optimizer.peak_lr=1e30", "--config.optimizer.end_lr=1e30", "--config.train.num_steps=9"]
    out = _train_command(config_file, workdir, *lr)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.startswith("error: loss became non-finite at step "), out.stderr[-3000:]
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr[-3000:]  # no traceback
    assert "the last good checkpoint is step 3" in out.stderr
    assert _files_digest(workdir / "checkpoints") == before


# ------------------------------------------------------------------------------------------------------------------
# A full disk
# ------------------------------------------------------------------------------------------------------------------


def test_full_disk_while_writing_the_token_cache_leaves_no_temporary_file(tmp_path, monkeypatch):
    def save_part_then_fail(handle, array):
        handle.write(b"\0" * 4096)  # what fitted before the disk filled up
        _enospc()

    monkeypatch.setattr(text.np, "save", save_part_then_fail)
    cache = tmp_path / "data_cache"
    with pytest.raises(safe_files.DiskFullError) as failure:
        text._cached_stream(cache, "corpus_train", lambda: np.arange(10_000, dtype=np.int32))
    message = str(failure.value)
    assert isinstance(failure.value, ValueError) and "\n" not in message
    assert str(cache) in message and "the disk is full (errno ENOSPC" in message and "token cache" in message
    assert os.listdir(cache) == []


def test_full_disk_while_writing_metrics_is_a_disk_full_error(tmp_path):
    writer = metrics.MetricsWriter(str(tmp_path))
    writer.write(1, {"loss": 1.0})

    class FullFile:
        """A file on a full disk: writes fail, and so does the flush of the first close (which closes it anyway)."""

        closed = False

        def write(self, data):
            _enospc()

        def close(self):
            if not self.closed:
                self.closed = True
                _enospc()

    writer._file.close()
    writer._file = FullFile()
    with pytest.raises(safe_files.DiskFullError, match=r"metrics.jsonl .*errno ENOSPC"):
        writer.write(2, {"loss": 0.5})
    writer.close()  # the failure was reported once; closing does not raise it again
    assert [r["step"] for r in metrics.read_metrics(str(tmp_path))] == [1]


def _fail_grain_save(monkeypatch, n):
    """The data iterator's file of the n-th checkpoint (step n: one per step) cannot be written; orbax writes it
    within `CheckpointManager.save`."""
    from grain._src.python.checkpoint import handler

    monkeypatch.setattr(handler.CheckpointHandler, "save", _fail_at_call(handler.CheckpointHandler.save, n))


def _fail_finalize(monkeypatch, n):
    """The checkpoint of step n cannot be completed: renaming its temporary directory to `n`, the last thing orbax's
    background thread does for a save, fails."""
    from orbax.checkpoint._src.path import async_path

    original = async_path.rename

    async def rename(source, target, *args, **kwargs):
        if os.path.basename(str(target)) == str(n):
            _enospc()
        return await original(source, target, *args, **kwargs)

    monkeypatch.setattr(async_path, "rename", rename)


@pytest.mark.slow
@pytest.mark.parametrize("fail", [_fail_grain_save, _fail_finalize], ids=["during-save", "in-background"])
def test_full_disk_while_checkpointing_keeps_earlier_checkpoints_and_removes_the_partial_one(
    tmp_path, monkeypatch, caplog, fail
):
    fail(monkeypatch, 3)  # the third checkpoint (step 3) finds the disk full
    with caplog.at_level(logging.INFO), pytest.raises(safe_files.DiskFullError) as failure:
        _run_toy_loop(tmp_path, _mesh(devices=jax.devices()[:1]), 5, checkpoint_every=1)
    message = str(failure.value)
    assert "\n" not in message and isinstance(failure.value, ValueError)
    assert f"checkpoint step 3 in {tmp_path / 'checkpoints'}" in message
    assert "the disk is full (errno ENOSPC" in message and "the newest complete one is step 2" in message
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "2"]  # no "3.orbax-checkpoint-tmp" left
    orbax_errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not orbax_errors, [r.getMessage()[:200] for r in orbax_errors]


# ------------------------------------------------------------------------------------------------------------------
# A damaged newest checkpoint, and a save orbax skips
# ------------------------------------------------------------------------------------------------------------------


def _truncate_array_files(directory: pathlib.Path) -> None:
    """Cuts every array data file (orbax's `d/` folders) of a checkpoint to half its size."""
    for path in directory.rglob("*"):
        if path.is_file() and path.parent.name == "d":
            os.truncate(path, path.stat().st_size // 2)


@pytest.mark.slow
def test_resume_past_a_damaged_checkpoint_moves_it_aside_and_saves_the_new_step(tmp_path, caplog):
    mesh = _mesh(devices=jax.devices()[:1])
    _run_toy_loop(tmp_path, mesh, 4, checkpoint_every=2)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "4"]
    _truncate_array_files(tmp_path / "checkpoints" / "4")
    damaged = _files_digest(tmp_path / "checkpoints" / "4")

    with caplog.at_level(logging.WARNING, logger=checkpointing.logger.name):
        state = _run_toy_loop(tmp_path, mesh, 3, checkpoint_every=2)
    assert int(state.step) == 3
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "3"]
    moved = tmp_path / "checkpoints_damaged" / "4"
    assert _files_digest(moved) == damaged  # moved aside as it was, not deleted
    notices = [r.getMessage() for r in caplog.records if "moved the damaged checkpoint step 4" in r.getMessage()]
    assert len(notices) == 1 and str(moved) in notices[0] and "resumes from step 2" in notices[0]


def test_a_save_orbax_skips_is_an_error(tmp_path):
    ckpt = checkpointing.Checkpointer(str(tmp_path / "ckpt"), async_save=False)
    state = {"w": jnp.arange(4.0)}
    ckpt.save(5, state)
    with pytest.raises(checkpointing.CheckpointSaveError, match=r"checkpoint step 4 was not written .*step 5"):
        ckpt.save(4, state)
    ckpt.close()
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["5"]
