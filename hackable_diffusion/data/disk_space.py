"""A full disk, reported on one line: `DiskFullError` and the test that tells a full disk from other write errors.

A write to a full filesystem fails with `OSError(ENOSPC)` (or `EDQUOT` over a quota) when Python writes the file, but
orbax and tensorstore report the same condition as a `ValueError("RESOURCE_EXHAUSTED: ... No space left on device
[os_error_code='28']")`, sometimes only in a log record while the exception that reaches the caller is a consequence
("handle is closed"). `disk_full_errno` looks for either form along an exception's cause/context chain.
"""

from __future__ import annotations

import errno
import os

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


def disk_full_errno(error: BaseException | str | None) -> str | None:
    """The errno's name, "ENOSPC" or "EDQUOT", if `error` (an exception and its chain, or a message) says the disk is
    full; None otherwise."""
    if error is None:
        return None
    errors = [error] if isinstance(error, str) else list(_chain(error))
    for item in errors:
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
