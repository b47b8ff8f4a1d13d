"""XLA_FLAGS for a subprocess of the suite: tests/conftest.py's flags (8 simulated CPU devices and the fast-compiling
settings) with only the simulated device count changed."""

import re

_DEVICE_COUNT = re.compile(r"--xla_force_host_platform_device_count=\d+")


def with_device_count(flags: str, count: int | None) -> str:
    """`flags` with the simulated CPU device count set to `count` (None: the flag removed, one device as a user has)."""
    kept = _DEVICE_COUNT.sub("", flags).split()
    if count is not None:
        kept.append(f"--xla_force_host_platform_device_count={count}")
    return " ".join(kept)
