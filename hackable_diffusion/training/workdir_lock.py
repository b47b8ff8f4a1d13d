"""One writer per run directory: an advisory lock on `workdir/.lock` that names who holds it.

Two training commands on one workdir would interleave `metrics.jsonl` and delete each other's checkpoints. The lock
is an exclusive `fcntl.flock` on `workdir/.lock`, which the kernel releases when its process ends however it ends
(SIGKILL and crashes included), so a lock can never go stale on the machine that took it; the file holds the host,
pid, command and start time of the holder, for the message a second writer gets. Readers (`sample`, `evaluate`) do
not take it. Where the file system has no `flock` (some network mounts) the lock is skipped with a warning.

A workdir that cannot hold a run (a file, a directory this user cannot write) is refused with `WorkdirUnusableError`
before anything is written. With `undo_failed_start=True`, a command whose start fails (an exception before it calls
`started()`, i.e. before training begins) leaves the workdir as it found it: the entries the failed start created are
removed, the lock file and the workdir itself included when they are new, and the small files it rewrote (config.json,
config_changes.jsonl, the lock file) get their bytes back; nothing else that was there before is touched. The lock
file is removed while it is still held; `acquire` checks that the file it locked is the one at the
path, so a process that opened the removed file meanwhile takes the new one instead.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import pathlib
import shutil
import socket
import sys
from typing import NoReturn

LOCK_FILE = ".lock"
RESTORED_MAX_BYTES = 1 << 20  # top-level files up to this size get their bytes back when a start fails


class WorkdirLockedError(RuntimeError):
    """Another process is writing this run directory."""


class WorkdirUnusableError(ValueError):
    """The workdir cannot hold a run: it is a file, or this user cannot create or write it (bad input, one line)."""


def check_usable(workdir: str | os.PathLike) -> None:
    """Raises WorkdirUnusableError when `workdir` is a file (or lies under one) or exists and is not writable."""
    path = pathlib.Path(workdir)
    for parent in (path, *path.parents):
        if parent.exists():
            if not parent.is_dir():
                what = "is a file" if parent == path else f"lies under {parent}, which is a file"
                raise WorkdirUnusableError(f"--workdir {path} {what}: give a directory (a new one starts a new run).")
            if parent == path and not os.access(parent, os.W_OK | os.X_OK):
                raise WorkdirUnusableError(
                    f"--workdir {path} is not writable by this user: fix its permissions, or use another --workdir."
                )
            return


def _unusable(path: pathlib.Path, error: OSError) -> WorkdirUnusableError:
    reason = os.strerror(error.errno) if error.errno else str(error)
    return WorkdirUnusableError(
        f"cannot write the run directory {path} ({reason}): use a directory this user can write, or another --workdir."
    )


class WorkdirLock:
    """`with WorkdirLock(workdir): ...` holds the workdir's lock for the block (re-entrant within one holder).

    undo_failed_start: if the block raises before `started()` is called, remove what it created (module docstring)."""

    def __init__(self, workdir: str | os.PathLike, *, undo_failed_start: bool = False):
        self.path = pathlib.Path(workdir) / LOCK_FILE
        self._file = None
        self._undo = undo_failed_start
        self._started = False
        self._taken = False
        self._created: pathlib.Path | None = None  # the outermost directory the lock's mkdir created
        self._entries_before: frozenset[str] = frozenset()
        self._saved_bytes: dict[str, bytes] = {}

    def started(self) -> None:
        """The command's start succeeded (training begins): from here on a failure keeps what the run wrote."""
        self._started = True

    def acquire(self) -> WorkdirLock:
        if self._file is not None:
            return self
        workdir = self.path.parent
        check_usable(workdir)
        missing = [d for d in (workdir, *workdir.parents) if not d.exists()]
        self._created = missing[-1] if missing else None
        self._entries_before = frozenset(os.listdir(workdir)) if not missing else frozenset()
        self._saved_bytes = {}
        if self._undo:
            for name in self._entries_before:
                entry = workdir / name
                if entry.is_file() and not entry.is_symlink() and entry.stat().st_size <= RESTORED_MAX_BYTES:
                    self._saved_bytes[name] = entry.read_bytes()
        try:
            workdir.mkdir(parents=True, exist_ok=True)
            handle = self._open_locked()
        except WorkdirLockedError:
            raise
        except (PermissionError, FileExistsError, NotADirectoryError, IsADirectoryError) as err:
            raise _unusable(workdir, err) from None
        except OSError as err:
            if err.errno not in (errno.EROFS, errno.EACCES, errno.ENOSPC, errno.EDQUOT):
                raise
            raise _unusable(workdir, err) from None
        self._taken = True
        if handle is None:  # no flock on this file system
            return self
        try:
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
        except OSError as err:
            handle.close()
            raise _unusable(workdir, err) from None
        self._file = handle
        return self

    def _open_locked(self):
        """The lock file, opened and locked (None where the file system has no flock); retries when the file it
        locked was removed from the path meanwhile (by a holder whose start failed)."""
        while True:
            handle = open(self.path, "a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._raise_locked(handle)
            except OSError as err:  # no flock on this file system
                print(
                    f"warning: cannot lock {self.path} ({err}); make sure no other run writes this workdir.", flush=True
                )
                handle.close()
                return None
            try:
                same = os.fstat(handle.fileno()).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return handle
            handle.close()

    def _raise_locked(self, handle) -> NoReturn:
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
        )

    def undo_start(self) -> None:
        """Removes the entries of the workdir that were not there when the lock was taken (the lock file among them,
        while it is held), and the workdir itself when the start created it and it is left empty; the small files it
        rewrote get their bytes back."""
        workdir = self.path.parent
        if not workdir.is_dir():
            return
        for name, data in self._saved_bytes.items():
            entry = workdir / name
            try:
                if entry.is_file() and entry.read_bytes() != data:
                    entry.write_bytes(data)
            except OSError:
                pass
        for name in sorted(set(os.listdir(workdir)) - self._entries_before):
            entry = workdir / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                try:
                    entry.unlink()
                except OSError:
                    pass
        if self._created is not None:  # the directories mkdir made, innermost first, while they are empty
            for directory in (workdir, *workdir.parents):
                try:
                    directory.rmdir()
                except OSError:
                    break
                if directory == self._created:
                    break

    def release(self) -> None:
        self._taken = False
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def __enter__(self) -> WorkdirLock:
        return self.acquire()

    def __exit__(self, exc_type, *exc) -> None:
        try:
            if exc_type is not None and self._undo and not self._started and self._taken:
                self.undo_start()
        finally:
            self.release()
