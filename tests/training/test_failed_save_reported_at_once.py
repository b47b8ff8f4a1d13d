"""A checkpoint whose background write fails stops training at the next step (`Checkpointer.poll` after every step),
not one checkpoint interval later at the next save. The full disk is simulated by failing the rename that completes
orbax's write of step 4 with ENOSPC; a hook waits at step 4 until that write has ended, so the test does not depend on
how long the write takes."""

from __future__ import annotations

import errno
import os
import time

import jax
import pytest
from _training_helpers import _mesh, _run_toy_loop

from hackable_diffusion.data import safe_files
from hackable_diffusion.training import checkpointing


@pytest.mark.slow
def test_a_failed_background_save_stops_the_run_at_the_next_step(tmp_path, monkeypatch):
    from orbax.checkpoint._src.path import async_path

    original_rename = async_path.rename

    async def rename(source, target, *args, **kwargs):
        if os.path.basename(str(target)) == "4":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return await original_rename(source, target, *args, **kwargs)

    monkeypatch.setattr(async_path, "rename", rename)
    checkpointers = []
    original_save = checkpointing.Checkpointer.save

    def save(self, *args, **kwargs):
        checkpointers.append(self)
        return original_save(self, *args, **kwargs)

    monkeypatch.setattr(checkpointing.Checkpointer, "save", save)
    steps = []

    def hook(step, state, metrics):
        steps.append(step)
        if step == 4:  # the save of step 4 has started: let its background write end (and fail) before step 5
            deadline = time.monotonic() + 60
            while checkpointers[-1]._manager.is_saving_in_progress() and time.monotonic() < deadline:
                time.sleep(0.01)

    with pytest.raises(safe_files.DiskFullError) as failure:
        _run_toy_loop(tmp_path, _mesh(devices=jax.devices()[:1]), 12, checkpoint_every=4, hooks=(hook,))
    assert steps == [1, 2, 3, 4]  # step 5 reported it; before, step 8's save did, after steps 5-7
    message = str(failure.value)
    assert "checkpoint step 4" in message and "the disk is full (errno ENOSPC" in message, message
    assert "there is no complete checkpoint yet" in message
    assert not [name for name in os.listdir(tmp_path / "checkpoints") if name.startswith("4")]
