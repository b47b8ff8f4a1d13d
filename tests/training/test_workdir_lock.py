"""The workdir lock (`training/workdir_lock.py`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from _training_helpers import (
    REPO,
)


def test_a_second_writer_is_refused_while_the_lock_is_held(tmp_path):
    from hackable_diffusion.training.workdir_lock import WorkdirLock, WorkdirLockedError

    with WorkdirLock(tmp_path / "run") as held:
        with pytest.raises(WorkdirLockedError, match=rf"being written by pid {os.getpid()}"):
            WorkdirLock(tmp_path / "run").acquire()
        assert held.acquire() is held  # the holder may take it again
    WorkdirLock(tmp_path / "run").acquire().release()  # released: free again
    # A holder that died (SIGKILL) leaves the file but not the lock: the kernel released it.
    code = f"from hackable_diffusion.training.workdir_lock import WorkdirLock; import os; WorkdirLock({str(tmp_path / 'gone')!r}).acquire(); os.kill(os.getpid(), 9)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == -9
    assert (tmp_path / "gone" / ".lock").is_file()
    WorkdirLock(tmp_path / "gone").acquire().release()
