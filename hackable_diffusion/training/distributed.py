"""Multi-process (multi-host) start-up through `jax.distributed.initialize`.

Follows the JAX multi-process guide (https://docs.jax.dev/en/latest/multi_process.html): every process calls
`jax.distributed.initialize(coordinator_address, num_processes, process_id)` before touching any device, and then
`jax.devices()` lists the devices of all processes.

Deliberate differences: settings come from arguments or, failing that, from the environment variables
JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID; nothing configured means a single-process run (no
call at all), and a partial configuration is a ValueError rather than a hang. `initialization_timeout` defaults to
60 s instead of JAX's 300 s, because a missing peer makes the others abort (SIGABRT) only after that timeout.
"""

from __future__ import annotations

import os

import jax

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


def _from_env(value, name, cast):
    if value is not None:
        return value
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return cast(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a valid {cast.__name__}.") from None


def maybe_initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    timeout_s: int = 60,
) -> bool:
    """Initialises jax.distributed when a multi-process run is configured; returns whether it did.

    Must run before any other JAX call that touches devices. Calling it again after a successful initialisation is
    a no-op that returns True.
    """
    coordinator_address = _from_env(coordinator_address, ENV_COORDINATOR, str)
    num_processes = _from_env(num_processes, ENV_NUM_PROCESSES, int)
    process_id = _from_env(process_id, ENV_PROCESS_ID, int)
    given = {
        "coordinator_address": coordinator_address,
        "num_processes": num_processes,
        "process_id": process_id,
    }
    if all(v is None for v in given.values()):
        return False
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise ValueError(
            f"multi-process run is partly configured: missing {missing} (flags or {ENV_COORDINATOR}, "
            f"{ENV_NUM_PROCESSES}, {ENV_PROCESS_ID}); set all three or none."
        )
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise ValueError(f"need num_processes >= 1 and 0 <= process_id < num_processes, got {given}.")
    if ":" not in coordinator_address:
        raise ValueError(f"coordinator_address must be host:port, got {coordinator_address!r}.")
    if jax.distributed.is_initialized():
        return True
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=int(timeout_s),
    )
    return True
