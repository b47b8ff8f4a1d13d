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


@pytest.mark.slow
def test_train_on_a_locked_workdir_is_one_error_line(tmp_path):
    """The command line reports a busy workdir as bad input: one `error:` line naming the holder, exit 2."""
    from hackable_diffusion.training.workdir_lock import WorkdirLock

    with WorkdirLock(tmp_path / "run"):
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "hackable_diffusion.train",
                "--config",
                "configs/quickstart.py",
                "--workdir",
                str(tmp_path / "run"),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            env=dict(os.environ, JAX_PLATFORMS="cpu"),
        )
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.startswith("error: ") and f"being written by pid {os.getpid()}" in run.stderr
    assert "Traceback" not in run.stderr
