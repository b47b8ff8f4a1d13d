"""Prometheus text exposition (format 0.0.4) of the serving engine's counters, gauges and latency summaries.

Written by hand rather than with `prometheus_client` to keep the serving extra small; the names follow Prometheus
conventions (`_total` counters, `_seconds` units) and the figures vLLM's server exports (TTFT, tokens/s, queue depth).
"""

from __future__ import annotations

import numpy as np

from hackable_diffusion.serve.engine import Engine

QUANTILES = (0.5, 0.9, 0.99)


def _summary(name: str, help_text: str, values) -> list[str]:
    values = np.asarray(list(values), np.float64)
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} summary"]
    for q in QUANTILES:
        value = float(np.quantile(values, q)) if values.size else float("nan")
        lines.append(f'{name}{{quantile="{q}"}} {value:.6g}')
    lines += [f"{name}_sum {float(values.sum()):.6g}", f"{name}_count {values.size}"]
    return lines


def render(engine: Engine) -> str:
    """The /metrics page."""
    s = engine.stats
    out: list[str] = []

    def metric(name: str, kind: str, help_text: str, value: float) -> None:
        out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value:.6g}"])

    metric("hd_requests_total", "counter", "Requests accepted into the queue.", s.requests)
    metric("hd_requests_completed_total", "counter", "Requests answered in full.", s.completed)
    metric("hd_requests_cancelled_total", "counter", "Requests whose client went away before the end.", s.cancelled)
    metric("hd_requests_timed_out_total", "counter", "Requests that ran past their timeout.", s.timed_out)
    metric("hd_requests_rejected_total", "counter", "Requests refused because the queue was full (429).", s.rejected)
    metric("hd_generated_tokens_total", "counter", "Completion tokens returned.", s.generated_tokens)
    metric("hd_queue_depth", "gauge", "Requests waiting for a generation.", engine.queue_depth())
    metric("hd_running_requests", "gauge", "Requests in the running generation.", engine.running())
    occupancy = s.batch_rows / s.batch_slots if s.batch_slots else 0.0
    metric("hd_batch_occupancy", "gauge", "Real rows / compiled batch rows over all generations.", occupancy)
    metric("hd_batches_total", "counter", "Generations run.", s.batches)
    rate = s.generated_tokens / s.busy_s if s.busy_s else 0.0
    metric("hd_tokens_per_second", "gauge", "Completion tokens per second of generation time.", rate)
    out += _summary("hd_time_to_first_token_seconds", "Arrival to the first streamed text.", s.ttft_s)
    out += _summary("hd_request_latency_seconds", "Arrival to the last token.", s.latency_s)
    return "\n".join(out) + "\n"
