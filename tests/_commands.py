"""The toolbox's commands run as a user runs them (`python -m hackable_diffusion.X ...` from the repository root), and
the one `error:` line a command ends with on bad input."""

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def run_module(module: str, *args, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` in the repository, HD_TRACEBACK unset (tracebacks off, as for a user)."""
    environment = {k: v for k, v in os.environ.items() if k != "HD_TRACEBACK"}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
        check=False,
    )


def one_error_line(out: subprocess.CompletedProcess, *, alone: bool = True) -> str:
    """The `error:` line of a command that failed on bad input: exit status 2, no traceback, the error the last line
    of stderr (`alone`: the only line; else a library may have logged before it)."""
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], out.stderr[-3000:]
    assert not alone or len(lines) == 1, out.stderr[-3000:]
    return errors[0]
