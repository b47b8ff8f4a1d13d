"""One writer per run directory: an advisory lock on `workdir/.lock` that names who holds it.

Two training commands on one workdir would interleave `metrics.jsonl` and delete each other's checkpoints. The lock
is an exclusive `fcntl.flock` on `workdir/.lock`, which the kernel releases when its process ends however it ends
(SIGKILL and crashes included), so a lock can never go stale on the machine that took it; the file holds the host,
pid, command and start time of the holder, for the message a second writer gets. Readers (`sample`, `evaluate`) do
not take it. Where the file system has no `flock` (some network mounts) the lock is skipped with a warning.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import pathlib
import socket
import sys

LOCK_FILE = ".lock"


class WorkdirLockedError(RuntimeError):
    """Another process is writing this run directory."""


class WorkdirLock:
    """`with WorkdirLock(workdir): ...` holds the workdir's lock for the block (re-entrant within one holder)."""

    def __init__(self, workdir: str | os.PathLike):
        self.path = pathlib.Path(workdir) / LOCK_FILE
        self._file = None

    def acquire(self) -> WorkdirLock:
        if self._file is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip()
            handle.close()
            try:
                info = json.loads(holder)
                who = f"pid {info['pid']} on {info['host']} (started {info['time']}: {info['command']})"
            except (ValueError, KeyError):
                who = "another process"
            raise WorkdirLockedError(
                f"{self.path.parent} is being written by {who}; wait for it to finish or stop it, or use another "
                "--workdir. (The lock is released when that process ends, however it ends.)"
            ) from None
        except OSError as err:  # no flock on this file system
            print(f"warning: cannot lock {self.path} ({err}); make sure no other run writes this workdir.", flush=True)
            handle.close()
            return self
        handle.seek(0)
        handle.truncate()
        handle.write(
            json.dumps(
                {
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "command": " ".join(sys.argv)[:300],
                }
            )
        )
        handle.flush()
        self._file = handle
        return self

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def __enter__(self) -> WorkdirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
