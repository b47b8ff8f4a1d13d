"""Files written so that a failure loses nothing and says what went wrong on one line; JSON read with its name.

`write_atomic` (a file) and `replacing_directory` (a whole directory) write beside the target and swap it in at the
end, so a failed write leaves the target as it was and no partial file behind. `read_json` names the file it could not
parse. A full disk is reported as `DiskFullError`:

A write to a full filesystem fails with `OSError(ENOSPC)` (or `EDQUOT` over a quota) when Python writes the file, but
orbax and tensorstore report the same condition as a `ValueError("RESOURCE_EXHAUSTED: ... No space left on device
[os_error_code='28']")`, sometimes only in a log record while the exception that reaches the caller is a consequence
("handle is closed"). `disk_full_errno` looks for either form along an exception's cause/context chain.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any, Callable

#: errno values that mean "no room to write": the filesystem is full, or the user's quota on it is.
FULL_ERRNOS = {errno.ENOSPC: "ENOSPC", errno.EDQUOT: "EDQUOT"}
_FULL_MARKERS = {
    "ENOSPC": ("No space left on device", f"os_error_code='{errno.ENOSPC}'"),
    "EDQUOT": ("Disk quota exceeded", f"os_error_code='{errno.EDQUOT}'"),
}


class DiskFullError(ValueError):
    """A write failed because the disk is full (a ValueError, so the commands report it as one `error:` line)."""


def _chain(error: BaseException):
    """`error` and the exceptions it was raised from or during, once each."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def disk_full_errno(*errors: BaseException | str | None) -> str | None:
    """The errno's name, "ENOSPC" or "EDQUOT", if one of `errors` (an exception and its chain, or a message, e.g. one
    orbax logged from its threads) says the disk is full; None otherwise."""
    chains = [[e] if isinstance(e, str) else list(_chain(e)) for e in errors if e is not None]
    for item in (x for chain in chains for x in chain):
        if isinstance(item, OSError) and item.errno in FULL_ERRNOS:
            return FULL_ERRNOS[item.errno]
        text = str(item)
        for name, markers in _FULL_MARKERS.items():
            if any(marker in text for marker in markers):
                return name
    return None


def disk_full_error(
    directory: str | os.PathLike, writing: str, errno_name: str = "ENOSPC", then: str = ""
) -> DiskFullError:
    """The one-line error for a write into `directory` that found the disk full; `then` tells what was kept/removed."""
    cause = "the disk quota is used up" if errno_name == "EDQUOT" else "the disk is full"
    return DiskFullError(
        f"could not write {writing} in {directory}: {cause} (errno {errno_name}: {_FULL_MARKERS[errno_name][0]})"
        f"{'; ' + then if then else ''}. Free some space on that disk (or pass a --workdir on a disk with more room) "
        "and run the same command again."
    )


def raise_if_disk_full(
    error: BaseException, directory: str | os.PathLike, writing: str, then: str = "", logged: tuple[str, ...] = ()
) -> None:
    """Raises `disk_full_error` from `error` when it (or a `logged` message) says the disk is full; else returns."""
    errno_name = disk_full_errno(error, *logged)
    if errno_name is not None:
        raise disk_full_error(directory, writing, errno_name, then) from error


def read_json(path: str | os.PathLike, fix: str = "repair or restore it") -> Any:
    """A JSON file; a malformed one is a ValueError that names it and says how to fix it (`fix`)."""
    path = pathlib.Path(path)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}): {fix}.") from None


def write_atomic(path: pathlib.Path, write: Callable[[Any], None], what: str) -> None:
    """Writes `path` through a temporary file beside it (`write(handle)`); a failed write removes the temporary file,
    and a full disk raises DiskFullError naming `what` was being written."""
    handle = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as handle:
            write(handle)
        os.replace(handle.name, path)
    except BaseException as error:
        if handle is not None and os.path.exists(handle.name):
            os.unlink(handle.name)
        raise_if_disk_full(error, path.parent, what, "nothing partial was left there")
        raise


def check_target(directory: str | os.PathLike, *, overwrite: bool, hint: str = "overwrite=True") -> None:
    """Refuses to write over something: a path that is not a directory, or (unless `overwrite`) a non-empty one."""
    directory = pathlib.Path(directory)
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"{directory} exists and is not a directory: choose a new or empty directory.")
    if not overwrite and directory.is_dir():
        entries = sorted(p.name for p in directory.iterdir())
        if entries:
            shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
            raise ValueError(
                f"{directory} is not empty (it holds {shown}): pass {hint} to replace it whole, or choose a new or "
                "empty directory."
            )


@contextlib.contextmanager
def replacing_directory(directory: str | os.PathLike, *, overwrite: bool = True, what: str = "the directory"):
    """Yields a fresh path beside `directory` (in a hidden `.NAME.partial-*` sibling) to write a whole directory into.
    When the block succeeds the written directory takes the place of `directory`, which is replaced whole (never
    mixed with what it held); when it fails, or `directory` is refused by `check_target`, `directory` is left as it
    was and nothing written stays behind (a full disk: DiskFullError naming `what`)."""
    directory = pathlib.Path(directory)
    check_target(directory, overwrite=overwrite)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{directory.name}.partial-", dir=directory.parent))
    try:
        written = staging / directory.name
        yield written
        if not written.is_dir():
            raise RuntimeError(f"nothing was written to {written}")
        old = staging / ".replaced"
        if directory.is_dir():
            os.rename(directory, old)
        try:
            os.rename(written, directory)
        except BaseException:
            if old.is_dir():
                os.rename(old, directory)
            raise
    except OSError as error:
        raise_if_disk_full(error, directory.parent, what, f"{directory} was left as it was")
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
