"""What a client hands the serving engine and what the engine counts: a `Request` (its fields and the events it
emits), the per-request `SamplerSettings` (requests with equal settings share one generation), the errors the API
answers 400 and 429 with, `EngineStats` (read by the metrics page), and the helpers that bucket batch sizes and cut
text at stop strings.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any


class QueueFull(RuntimeError):
    """The queue holds `max_queue` requests already."""


class RequestError(ValueError):
    """A request the engine cannot serve as asked (bad field, too long): the API answers 400 with its message."""


@dataclasses.dataclass(frozen=True)
class SamplerSettings:
    """The per-request sampler fields; requests with equal settings share one generation. None = the run's own."""

    num_steps: int | None = None
    selection_rule: str | None = None
    selection_args: tuple[tuple[str, Any], ...] = ()  # the rule's arguments (recipes.SELECTION_ARGUMENTS)
    temperature: float | None = None
    first_canvas: int | None = None


@dataclasses.dataclass
class Request:
    """One completion. `emit(event)` is called from the engine's threads with dicts:
      {"type": "text", "text": delta}: text that became final (a step's decided prefix, or a canvas);
      {"type": "step", "canvas": i, "step": s, "pieces": [text, or None where masked, per position]}: every
        denoising step, when `want_steps`;
      {"type": "done", "finish_reason": "stop" | "length", "text": all of it, "completion_tokens": n,
        "prompt_tokens": p};
      {"type": "error", "message": ..., "code": HTTP status}."""

    prompt_ids: list[int]
    max_tokens: int
    emit: Callable[[dict[str, Any]], None]
    stop: tuple[str, ...] = ()
    seed: int = 0
    settings: SamplerSettings = SamplerSettings()
    want_steps: bool = False
    stream: bool = False  # the client reads text as it comes: worth a host round trip per denoising step
    timeout_s: float = 600.0
    arrived: float = dataclasses.field(default_factory=time.monotonic)
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)
    first_token_s: float | None = None

    def cancel(self) -> None:
        self.cancelled.set()


def next_power_of_two(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """The text before the earliest stop string, and whether one occurred."""
    cut = min((text.index(s) for s in stops if s and s in text), default=None)
    return (text, False) if cut is None else (text[:cut], True)


@dataclasses.dataclass
class EngineStats:
    """Counters the metrics endpoint reads (updated by the worker thread)."""

    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    timed_out: int = 0
    rejected: int = 0
    generated_tokens: int = 0
    batches: int = 0
    batch_rows: int = 0
    batch_slots: int = 0
    busy_s: float = 0.0
    ttft_s: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=10_000))
    latency_s: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=10_000))
