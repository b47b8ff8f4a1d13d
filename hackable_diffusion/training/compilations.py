"""Counting XLA compilations over a block of code, and where each one came from.

JAX reports every executable it builds through `jax.monitoring`: the event `/jax/core/compile/backend_compile_duration`
is recorded each time a jitted function (or an eager operation) misses the in-memory cache of compiled programs and
a new executable is built, whether XLA compiles it or it is read back from the persistent compilation cache on disk
(`/jax/compilation_cache/cache_hits` then counts the latter). A request path that "compiles once per shape bucket"
builds no executable at all on the second request of a bucket, so the number of these events over a stream of
requests is the property the tests check and the benchmarks report.

    with count_compilations() as log:
        serve_some_requests()
    assert log.count == 0, log.names
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator

import jax

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch.BACKEND_COMPILE_EVENT
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
# Tracing to a jaxpr and lowering it to MLIR: done again on a warm start too (the persistent cache is keyed by the
# lowered program). A jitted function called inside another is traced inside its caller's trace: these overlap.
TRACE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration")


class CompileLog:
    """What `count_compilations` saw: the name of each program built (in order), the seconds spent building each
    (compiling, or reading back from the persistent cache), how many came from the persistent cache, and the seconds
    of tracing and lowering events (`TRACE_EVENTS`; nested ones overlap)."""

    def __init__(self):
        self.names: list[str] = []
        self.seconds: list[float] = []
        self.cache_hits = 0
        self.trace_seconds = 0.0
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        """Executables built (XLA compilations plus persistent-cache reads)."""
        return len(self.names)

    @property
    def compiled(self) -> int:
        """Executables XLA compiled (not read from the persistent cache)."""
        return self.count - self.cache_hits

    @property
    def total_seconds(self) -> float:
        return float(sum(self.seconds))

    def by_name(self) -> dict[str, int]:
        """Programs built per function name, most first (a name seen twice is a recompilation)."""
        return dict(collections.Counter(self.names).most_common())

    def summary(self) -> str:
        return f"{self.count} compilations ({self.cache_hits} from the persistent cache): {self.by_name()}"

    def _on_duration(self, event: str, duration: float, **kwargs) -> None:
        if event == BACKEND_COMPILE_EVENT:
            with self._lock:
                self.names.append(str(kwargs.get("fun_name", "?")))
                self.seconds.append(float(duration))
        elif event in TRACE_EVENTS:
            with self._lock:
                self.trace_seconds += float(duration)

    def _on_event(self, event: str, **kwargs) -> None:
        if event == CACHE_HIT_EVENT:
            with self._lock:
                self.cache_hits += 1


@contextlib.contextmanager
def count_compilations() -> Iterator[CompileLog]:
    """Counts the executables JAX builds inside the block (every thread of the process, as the listeners are global)."""
    log = CompileLog()
    jax.monitoring.register_event_duration_secs_listener(log._on_duration)
    jax.monitoring.register_event_listener(log._on_event)
    try:
        yield log
    finally:
        jax.monitoring.unregister_event_duration_listener(log._on_duration)
        jax.monitoring.unregister_event_listener(log._on_event)
