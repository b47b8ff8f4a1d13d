"""Training metrics: a JSONL file, TensorBoard event files, a one-line progress report, and a peak-FLOP/s probe.

MFU (model FLOPs utilisation) follows PaLM (Chowdhery et al. 2022, appendix B): achieved model FLOP/s divided by the
hardware peak. Here the "peak" can be measured (`measure_peak_matmul_flops`, a large jitted matmul on one device),
which on CPUs is a more honest denominator than a datasheet number; it deliberately differs from PaLM in that.

Only process 0 writes files (every process may call the writer).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pathlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hackable_diffusion.data import safe_files

_RESERVED = ("step", "split", "wall_time")


def _to_float(value: Any) -> float:
    return float(np.asarray(value).item())


class MetricsWriter:
    """Appends `{"step", "split", "wall_time", <metric>: value, ...}` lines to `workdir/metrics.jsonl` and the same
    scalars (tagged `split/name`) to TensorBoard event files under `workdir/tensorboard`."""

    def __init__(self, workdir: str, *, enabled: bool | None = None):
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.tensorboard_dir = os.path.join(workdir, "tensorboard")
        self._file = None
        self._tb = None
        if self.enabled:
            import tensorboardX  # imported lazily: only process 0 pays for it

            os.makedirs(workdir, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
            self._tb = tensorboardX.SummaryWriter(logdir=self.tensorboard_dir)

    def write(self, step: int, values: Mapping[str, Any], *, split: str = "train") -> None:
        """Writes scalar metrics (anything `np.asarray(...).item()` accepts, jax arrays included)."""
        if not self.enabled:
            return
        clash = [k for k in values if k in _RESERVED]
        if clash:
            raise ValueError(f"metric names {clash} are reserved in metrics.jsonl; rename them.")
        floats = {k: _to_float(v) for k, v in jax.device_get(dict(values)).items()}
        record = {"step": int(step), "split": split, "wall_time": time.time()}
        # JSON has no NaN/Inf: write them as strings so every line stays valid JSON.
        record.update({k: (v if math.isfinite(v) else str(v)) for k, v in floats.items()})
        try:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        except OSError as error:
            with contextlib.suppress(OSError):  # closes the file; the record that did not fit is dropped
                self._file.close()
            safe_files.raise_if_disk_full(error, os.path.dirname(self.path), "metrics.jsonl")
            raise
        for k, v in floats.items():
            self._tb.add_scalar(f"{split}/{k}", v, int(step))

    def flush(self) -> None:
        if self.enabled:
            self._file.flush()
            self._tb.flush()

    def close(self) -> None:
        """Closes metrics.jsonl and the TensorBoard writer (both, even if one fails); a full disk raises
        DiskFullError."""
        if not self.enabled or self._file is None:
            return
        file, tb, self._file = self._file, self._tb, None
        try:
            with contextlib.ExitStack() as closing:
                closing.callback(tb.close)
                file.close()
        except OSError as error:
            _abandon_tensorboard(tb)
            what = "metrics.jsonl and the TensorBoard event files"
            safe_files.raise_if_disk_full(error, os.path.dirname(self.path), what)
            raise


def _abandon_tensorboard(tb) -> None:
    """Marks the event-file writers of a tensorboardX writer whose flush failed as closed: tensorboardX would otherwise
    retry the flush at interpreter exit and print its traceback."""
    for writer in (getattr(tb, "all_writers", None) or {}).values():
        event_writer = getattr(writer, "event_writer", None)
        if event_writer is not None and hasattr(event_writer, "_closed"):
            event_writer._closed = True


def read_metrics(workdir: str, split: str | None = None, *, keep_superseded: bool = False) -> list[dict[str, Any]]:
    """The records of `workdir/metrics.jsonl` (optionally only one split), as the run's history reads now.

    A run that stopped after logging steps past its last checkpoint logs those steps again when it resumes; the file
    keeps both (it is only appended to), and by default the later run's records replace the earlier ones: when a
    split's step goes back (to s), every earlier record of any split at step >= s is dropped, and a record logged
    again at the same step of the same split replaces the first. `keep_superseded=True` returns every line as written.
    """
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    if not keep_superseded:
        records = _without_superseded(records)
    return [r for r in records if split is None or r["split"] == split]


def _without_superseded(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    kept: list[dict[str, Any]] = []
    last_step: dict[str, int] = {}  # per split; steps only grow within a split in `kept`
    for record in records:
        step, name = record["step"], record["split"]
        if step < last_step.get(name, step):  # a resumed run: drop everything it is about to redo
            kept = [r for r in kept if r["step"] < step]
            last_step = {r["split"]: r["step"] for r in kept}
        elif last_step.get(name) == step:
            kept = [r for r in kept if not (r["split"] == name and r["step"] == step)]
        kept.append(record)
        last_step[name] = step
    return kept


def format_duration(seconds: float) -> str:
    """3m25s, 1h02m, 45s."""
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def format_count(x: float) -> str:
    """11.0k, 2.5M, 950."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


class ProgressLogger:
    """Formats `step 120/1000 | loss 3.21 | 4.3 steps/s | 11.0k tok/s | MFU 41% | ETA 3m25s`.

    Rates are an exponential moving average (bias-corrected) of steps/s between calls. The first call only starts
    the clock, so compilation time does not pollute the rate.
    """

    def __init__(
        self,
        total_steps: int,
        tokens_per_step: float | None = None,
        flops_per_token: float | None = None,
        peak_flops: float | None = None,
        *,
        smoothing: float = 0.7,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.total_steps = total_steps
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self.smoothing = smoothing
        self.clock = clock
        self._last: tuple[int, float] | None = None
        self._avg = 0.0
        self._weight = 0.0

    @property
    def steps_per_sec(self) -> float | None:
        return self._avg / self._weight if self._weight > 0 else None

    def rates(self) -> dict[str, float]:
        """steps_per_sec, tokens_per_sec and mfu as far as known (for the metrics file)."""
        out = {}
        sps = self.steps_per_sec
        if sps is None:
            return out
        out["steps_per_sec"] = sps
        if self.tokens_per_step:
            out["tokens_per_sec"] = sps * self.tokens_per_step
            if self.flops_per_token and self.peak_flops:
                out["mfu"] = out["tokens_per_sec"] * self.flops_per_token / self.peak_flops
        return out

    def update(self, step: int, loss: float | None = None) -> str:
        """Records that `step` steps are done and returns the progress line."""
        now = self.clock()
        if self._last is not None and step > self._last[0] and now > self._last[1]:
            rate = (step - self._last[0]) / (now - self._last[1])
            self._avg = self.smoothing * self._avg + (1 - self.smoothing) * rate
            self._weight = self.smoothing * self._weight + (1 - self.smoothing)
        self._last = (step, now)
        return self.line(step, loss)

    def line(self, step: int, loss: float | None = None, *, steps_averaged: int = 1) -> str:
        """The progress line at `step`; `loss` labelled as the mean over `steps_averaged` steps when that is > 1."""
        parts = [f"step {step}/{self.total_steps}"]
        if loss is not None:
            averaged = f" (mean of {steps_averaged} steps)" if steps_averaged > 1 else ""
            parts.append(f"loss {loss:.4g}{averaged}")
        r = self.rates()
        if "steps_per_sec" in r:
            parts.append(f"{r['steps_per_sec']:.3g} steps/s")
        if "tokens_per_sec" in r:
            parts.append(f"{format_count(r['tokens_per_sec'])} tok/s")
        if "mfu" in r:
            parts.append(f"MFU {100 * r['mfu']:.0f}%")
        if "steps_per_sec" in r:
            parts.append(f"ETA {format_duration((self.total_steps - step) / r['steps_per_sec'])}")
        return " | ".join(parts)


def measure_peak_matmul_flops(n: int = 2048, dtype: Any = jnp.float32, *, repeats: int = 5) -> float:
    """FLOP/s of a jitted (n x n) @ (n x n) matmul on the default device: the *fastest* of `repeats` timed runs after a
    warm-up (another job on the machine only ever slows a run down, so the best run is the least disturbed one).
    bf16 inputs accumulate in f32 (`preferred_element_type`), the fast path on CPUs (XLA:CPU bf16 matmuls with bf16
    output are several times slower)."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
    matmul = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    matmul(a, b).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2.0 * n**3 / min(times)


PEAK_CACHE_ENV = "HACKABLE_DIFFUSION_CACHE"


def _peak_cache_file() -> pathlib.Path:
    root = os.environ.get(PEAK_CACHE_ENV) or pathlib.Path.home() / ".cache" / "hackable_diffusion"
    return pathlib.Path(root) / "peak_flops.json"


def calibrated_peak_flops(dtype: Any = jnp.float32, *, repeats: int = 5) -> float:
    """The matmul peak of this machine for `dtype`, for MFU: the best ever measured here, kept per machine (device
    kind, CPU count, dtype) in `$HACKABLE_DIFFUSION_CACHE/peak_flops.json` and raised whenever a new measurement beats
    it, so that a measurement taken while other jobs shared the machine never lowers the peak (which would inflate the
    MFU). On a CPU the simulated devices share the host's cores, so the host's peak is the mesh's; on accelerators the
    per-device peak times the number of devices."""
    device = jax.devices()[0]
    key = f"{device.platform}|{device.device_kind}|{os.cpu_count()}|{jnp.dtype(dtype).name}"
    path = _peak_cache_file()
    try:
        stored = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        stored = {}
    best = max(measure_peak_matmul_flops(2048, dtype, repeats=repeats), float(stored.get(key, 0.0)))
    if best > float(stored.get(key, 0.0)):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({**stored, key: best}, indent=1, sort_keys=True))
        except OSError:
            pass  # a read-only home: the measurement still serves this run
    devices = 1 if device.platform == "cpu" else jax.device_count()
    return best * devices
