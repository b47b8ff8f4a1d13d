"""The serving engine: concurrent requests batched into one compiled generation, streamed canvas by canvas.

Follows what vLLM's OpenAI server does for its users (a bounded queue, per-request sampling fields, streaming,
cancellation when the client goes away, metrics), built on the toolbox's own generation (`sampling.generate`):

  * Requests wait in a bounded queue (`QueueFull` when it is full: the API answers 429). One worker thread takes the
    oldest request and every queued request that shares its sampler settings (steps, selection rule and argument,
    temperature, first-canvas length), up to `max_batch`, into one generation.
  * Shapes are bucketed so a handful of programs serve every request: the batch to a power of two (spare rows are
    inactive from the start), the prompt width to a multiple of `prompt_bucket`, the canvases to a power of two.
    Rows of different prompt lengths are exact (invalid cache slots are never attended, positions count real tokens)
    and each row's randomness comes from its own seed, so a request's tokens do not depend on what it was batched
    with: a request equals `sample --seed S` on its prompt alone. A request's temperature is a traced factor on the
    sampler's, not a constant of the program, so any temperature runs the programs already compiled; the number of
    steps, the selection rule and the first-canvas length are part of the program (one compile per setting).
  * Diffusion runs stream text as it becomes final: with a masking sampler that never re-masks, a decided token never
    changes, so after every denoising step (a host callback inside the compiled loop) each row's newly decided prefix
    of the canvas goes out; otherwise (uniform noise, re-masking rules) a canvas's text goes out when it is committed.
    Opt-in, the canvas after every step is sent too (for visualisation). A request finishes at EOS, at a stop string,
    at `max_tokens`, at its deadline or when cancelled, and its row stops at the next canvas (it no longer holds the
    batch open). Autoregressive runs are served by the
    same queue with cached AR decoding and answer in one event.
  * The first canvas can be shorter than the rest (`first_canvas`): its few cheap steps give the first tokens early.
  * Vocabularies over 16,384 ids are read in chunks of 16,384 by the canvas step (`sampler.vocab_chunk`), so a batch
    holds one float32 [batch, canvas, vocabulary] array, the logits, whatever its size (`vocab_chunk=0` turns it off).

Deliberate differences from vLLM: batches are formed between generations (a request arriving mid-generation waits for
the next one, no continuous batching), and a temperature of 0 is served as a near-greedy draw (1e-4) whose positions
are ranked by the model's own probabilities (score temperature 1), since the diffusion sampler divides by it.

What a request holds, its sampler settings, the errors and the counters are `requests.py`'s.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
import time
from collections.abc import Sequence

import jax
import numpy as np

from hackable_diffusion import builders, recipes
from hackable_diffusion.data.tokenizers import BOS_ID, EOS_ID, MASK_ID, NEVER_GENERATED
from hackable_diffusion.sampling import autoregressive as ar_lib
from hackable_diffusion.sampling import generate as gen_lib
from hackable_diffusion.serve.requests import (
    EngineStats,
    QueueFull,
    Request,
    RequestError,
    SamplerSettings,
    cut_at_stop,
    next_power_of_two,
)

GREEDY_TEMPERATURE = 1e-4  # what temperature 0 becomes in the diffusion sampler
AUTO_VOCAB_CHUNK = 16_384  # vocabularies larger than this are scanned in chunks of it by default (vocab_chunks.py)


@dataclasses.dataclass
class _Row:
    request: Request
    ids: list[int] = dataclasses.field(default_factory=list)
    text: str = ""  # the decoded completion so far (cut at a stop string)
    sent: str = ""  # the part of it already emitted
    done: bool = False


@dataclasses.dataclass
class _Live:
    """The running generation as the per-step callback sees it: its rows, the canvas index, and how many tokens of
    the current canvas each row has already streamed."""

    rows: list[_Row]
    streams_decided_prefix: bool
    canvas: int = 0
    streamed: list[int] = dataclasses.field(default_factory=list)


class Engine:
    """Owns the model, the queue and the worker thread. `submit` is thread-safe; `close` drains."""

    def __init__(
        self,
        exp,
        params,
        *,
        max_batch: int = 8,
        max_queue: int = 64,
        prompt_bucket: int = 32,
        max_context: int | None = None,
        vocab_chunk: int | None = None,
        model_name: str = "hackable-diffusion",
        start: bool = True,
    ):
        if max_batch < 1 or max_queue < 1 or prompt_bucket < 1:
            raise ValueError(
                f"max_batch ({max_batch}), max_queue ({max_queue}) and prompt_bucket ({prompt_bucket}) must be >= 1."
            )
        self.exp = exp
        self.params = params
        self.max_batch = next_power_of_two(max_batch)
        self.max_queue = max_queue
        self.prompt_bucket = prompt_bucket
        trained = int(exp.config.data.get("seq_len") or 0)
        self.max_context = int(max_context or (2 * trained if trained else 4096))
        if vocab_chunk is None:  # large vocabularies: never more than one [batch, canvas, vocab] float32 array
            configured = int(exp.config.sampler.get("vocab_chunk", 0) or 0)
            vocab_chunk = configured or (AUTO_VOCAB_CHUNK if exp.model.cfg.vocab_size > AUTO_VOCAB_CHUNK else 0)
        self.vocab_chunk = int(vocab_chunk)
        self.model_name = model_name
        self.stats = EngineStats()
        self._pending: collections.deque[Request] = collections.deque()
        self._cond = threading.Condition()
        self._closing = False
        self._running = 0
        self._live: _Live | None = None
        # Per-step streaming is an ordered host callback inside the compiled loop; a program over several devices
        # streams per canvas instead (ordered effects are not offered there).
        placed = {d for leaf in jax.tree.leaves(params) if hasattr(leaf, "sharding") for d in leaf.sharding.device_set}
        self.live_steps = len(placed) <= 1
        self._worker = threading.Thread(target=self._loop, name="serve-engine", daemon=True)
        if start:
            self._worker.start()

    def start(self) -> None:
        """Starts the worker (an engine made with start=False queues requests without running them)."""
        if not self._worker.is_alive():
            self._worker.start()

    # ---- the request side ----------------------------------------------------------------------------------------
    @property
    def is_autoregressive(self) -> bool:
        return self.exp.is_autoregressive

    @property
    def canvas_length(self) -> int:
        return 1 if self.is_autoregressive else int(self.exp.config.sampler.canvas_len)

    def encode(self, text: str) -> list[int]:
        return [BOS_ID] + self.exp.tokenizer.encode(text)

    def pieces(self, canvas: np.ndarray) -> list[str | None]:
        """Each canvas position's text, None where it is still masked (for a live view of the denoising)."""
        decode = self.exp.tokenizer.decode
        return [None if int(t) == MASK_ID else decode([int(t)], stop_at_eos=False) for t in canvas]

    def queue_depth(self) -> int:
        with self._cond:
            return len(self._pending)

    def running(self) -> int:
        return self._running

    def check(self, request: Request) -> None:
        """Raises RequestError for what no generation could serve (before the request is queued)."""
        if request.max_tokens < 1:
            raise RequestError(f"max_tokens must be >= 1, got {request.max_tokens}.")
        total = len(request.prompt_ids) + request.max_tokens
        if total > self.max_context:
            raise RequestError(
                f"the prompt ({len(request.prompt_ids)} tokens) plus max_tokens ({request.max_tokens}) is {total} "
                f"tokens, over this server's context of {self.max_context}; shorten the prompt, lower max_tokens, or "
                f"start the server with a larger --max_context."
            )
        s = request.settings
        if s.temperature is not None and not s.temperature >= 0:
            raise RequestError(f"temperature must be >= 0, got {s.temperature}.")
        if s.num_steps is not None and not 1 <= s.num_steps <= 1024:
            raise RequestError(f"steps must be an integer in [1, 1024], got {s.num_steps}.")
        if s.first_canvas is not None and not 1 <= s.first_canvas <= self.canvas_length:
            raise RequestError(f"first_canvas must be in [1, {self.canvas_length}] (the canvas), got {s.first_canvas}.")
        if s.selection_args and s.selection_rule is None:
            raise RequestError("selection arguments were given without a selection rule.")
        if self.is_autoregressive and (s.num_steps, s.selection_rule, s.first_canvas) != (None, None, None):
            raise RequestError("steps, selection and first_canvas are diffusion sampler fields; this run is AR.")
        self.sampler_for(s)  # an unknown rule or a bad argument, by name

    def submit(self, request: Request) -> None:
        """Queues a checked request; raises QueueFull (429) or RuntimeError when the engine is shutting down."""
        self.submit_many([request])

    def submit_many(self, requests: Sequence[Request]) -> None:
        """Queues requests together (all or none), so requests with equal settings can share one generation."""
        for request in requests:
            self.check(request)
        with self._cond:
            if self._closing:
                raise RuntimeError("the server is shutting down.")
            if len(self._pending) + len(requests) > self.max_queue:
                self.stats.rejected += len(requests)
                raise QueueFull(f"the queue holds {len(self._pending)} of {self.max_queue} requests; retry later.")
            self.stats.requests += len(requests)
            self._pending.extend(requests)
            self._cond.notify()

    def close(self, timeout_s: float = 60.0) -> None:
        """Stops taking requests, lets queued and running ones finish (up to `timeout_s`), then stops the worker."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._worker.is_alive():
            self._worker.join(timeout_s)
        with self._cond:  # whatever is left gets a clear error
            while self._pending:
                self._pending.popleft().emit({"type": "error", "message": "the server shut down.", "code": 503})

    # ---- the sampler ---------------------------------------------------------------------------------------------
    def _forbidden(self) -> tuple[int, ...]:
        unused = tuple(range(self.exp.tokenizer.vocab_size, self.exp.model.cfg.vocab_size))
        return NEVER_GENERATED + unused

    def sampler_for(self, s: SamplerSettings):
        if self.is_autoregressive:
            t = self.exp.config.sampler.ar_temperature if s.temperature is None else s.temperature
            return ar_lib.ARSampling(temperature=float(t))
        config = self.exp.config.copy_and_resolve_references()
        sc = config.sampler
        with sc.unlocked():
            sc.vocab_chunk = self.vocab_chunk
            if s.num_steps is not None:
                sc.num_steps = int(s.num_steps)
            if s.selection_rule is not None:
                try:
                    sc.selection = recipes.selection(s.selection_rule, **dict(s.selection_args))
                except (ValueError, TypeError, KeyError) as e:
                    raise RequestError(f"selection {s.selection_rule!r}: {e}") from None
            if s.temperature is not None:  # constant 1 here, times the request's temperature, a traced factor
                sc.min_temperature = sc.max_temperature = 1.0
                if s.temperature == 0:
                    sc.score_temperature = 1.0
        try:
            return builders.build_sampler(config, self.exp.process, forbidden_tokens=self._forbidden())
        except (ValueError, TypeError, KeyError) as e:
            raise RequestError(f"sampler settings {dataclasses.asdict(s)}: {e}") from None

    @staticmethod
    def temperature_scale(s: SamplerSettings) -> float | None:
        """A diffusion request's temperature as the traced factor on its sampler's (constant 1) temperature, so that
        every temperature runs the same compiled programs; None: the run's own schedule."""
        if s.temperature is None:
            return None
        return GREEDY_TEMPERATURE if s.temperature == 0 else float(s.temperature)

    # ---- the worker ----------------------------------------------------------------------------------------------
    def _take_batch(self) -> list[Request] | None:
        with self._cond:
            while True:
                while self._pending and self._pending[0].cancelled.is_set():  # gone before it started: no prefill
                    self._pending.popleft()
                    self.stats.cancelled += 1
                if self._pending:
                    break
                if self._closing:
                    return None
                self._cond.wait(0.5)
            first = self._pending.popleft()
            batch = [first]
            for r in list(self._pending):
                if len(batch) >= self.max_batch:
                    break
                if r.settings == first.settings and not r.cancelled.is_set():
                    self._pending.remove(r)
                    batch.append(r)
            self._running = len(batch)
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            start = time.monotonic()
            try:
                self._run(batch)
            except Exception as e:  # noqa: BLE001 - every request of the batch gets the error, the server lives on
                for r in batch:
                    try:
                        r.emit({"type": "error", "message": f"generation failed: {type(e).__name__}: {e}", "code": 500})
                    except Exception:  # noqa: BLE001 - a client whose event loop is gone; the worker must live on
                        pass
            finally:
                self.stats.busy_s += time.monotonic() - start
                self._running = 0

    def _finish(self, row: _Row, reason: str) -> None:
        row.done = True
        r = row.request
        now = time.monotonic()
        if reason == "cancelled":
            self.stats.cancelled += 1
            return
        if reason == "timeout":
            self.stats.timed_out += 1
            r.emit({"type": "error", "message": f"the request ran past its timeout of {r.timeout_s} s.", "code": 504})
            return
        self._emit_text(row, final=True)  # whatever was held back
        self.stats.completed += 1
        self.stats.generated_tokens += len(row.ids)
        self.stats.latency_s.append(now - r.arrived)
        r.emit(
            {
                "type": "done",
                "finish_reason": reason,
                "text": row.text,
                "completion_tokens": len(row.ids),
                "prompt_tokens": len(r.prompt_ids),
            }
        )

    def _advance(self, row: _Row, new_ids: Sequence[int]) -> None:
        """Appends tokens that became final to a row, emits the text that is safe to send, and finishes the row at EOS
        or a stop string ("stop") or at `max_tokens` ("length")."""
        r = row.request
        ids = [int(t) for t in new_ids if int(t) != 0]  # PAD after a stop token
        room = r.max_tokens - len(row.ids)
        hit_eos = EOS_ID in ids[:room]
        if hit_eos:
            ids = ids[: ids.index(EOS_ID)]  # the stop token is not part of the text
        ids = ids[:room]
        row.ids.extend(ids)
        row.text, hit_stop = cut_at_stop(self.exp.tokenizer.decode(row.ids), r.stop)
        finishing = hit_eos or hit_stop or len(row.ids) >= r.max_tokens
        self._emit_text(row, final=finishing)
        if hit_eos or hit_stop:
            self._finish(row, "stop")
        elif len(row.ids) >= r.max_tokens:
            self._finish(row, "length")

    def _emit_text(self, row: _Row, final: bool) -> None:
        """Sends the part of the row's text not sent yet. Until the row ends, the last len(longest stop) - 1
        characters and a trailing replacement character (a partly decoded character) are held back, so a stop string
        split across chunks is never sent and sent text never changes (as vLLM's detokenizer does)."""
        r = row.request
        safe = row.text
        if not final:
            hold = max((len(stop) for stop in r.stop), default=1) - 1
            safe = safe[: len(safe) - hold] if hold else safe
            safe = safe.rstrip("\ufffd")
        if len(safe) <= len(row.sent) or not safe.startswith(row.sent):
            return  # nothing new, or a decode that changed text already sent (kept as sent; `done` has the final text)
        if r.first_token_s is None:
            r.first_token_s = time.monotonic() - r.arrived
            self.stats.ttft_s.append(r.first_token_s)
        r.emit({"type": "text", "text": safe[len(row.sent) :]})
        row.sent = safe

    def _bucket_prompts(self, rows: list[_Row], slots: int) -> tuple[np.ndarray, np.ndarray]:
        width = max(len(row.request.prompt_ids) for row in rows)
        width = int(math.ceil(width / self.prompt_bucket) * self.prompt_bucket)
        tokens = np.zeros((slots, width), np.int32)
        mask = np.zeros((slots, width), bool)
        tokens[:, 0], mask[:, 0] = BOS_ID, True  # spare rows: a lone BOS, inactive from the start
        for i, row in enumerate(rows):
            ids = row.request.prompt_ids
            tokens[i, : len(ids)], mask[i, : len(ids)] = ids, True
        return tokens, mask

    def _keys(self, rows: list[_Row], slots: int):
        seeds = [row.request.seed for row in rows] + [0] * (slots - len(rows))
        return jax.numpy.stack([jax.random.fold_in(jax.random.key(int(s)), 0) for s in seeds])

    def _run(self, batch: list[Request]) -> None:
        rows = [_Row(r) for r in batch]
        slots = next_power_of_two(len(rows))
        self.stats.batches += 1
        self.stats.batch_rows += len(rows)
        self.stats.batch_slots += slots
        tokens, mask = self._bucket_prompts(rows, slots)
        keys = self._keys(rows, slots)
        settings = batch[0].settings
        sampler = self.sampler_for(settings)
        longest = max(r.max_tokens for r in batch)
        if self.is_autoregressive:
            now = time.monotonic()
            for row in rows:
                if row.request.cancelled.is_set():
                    self._finish(row, "cancelled")
                elif now - row.request.arrived > row.request.timeout_s:
                    self._finish(row, "timeout")
            if all(row.done for row in rows):
                return
            result = ar_lib.generate_ar(
                self.exp.model,
                self.params,
                tokens,
                prompt_mask=mask,
                key=keys,
                max_new_tokens=next_power_of_two(longest),
                sampling=sampler,
                forbidden_tokens=self._forbidden(),
            )
            for i, row in enumerate(rows):
                if row.done:
                    continue
                if row.request.cancelled.is_set():
                    self._finish(row, "cancelled")
                else:
                    self._advance(row, result.tokens[i])
            return
        c = sampler.canvas_length
        region = next_power_of_two(math.ceil(longest / c)) * c  # a few cache lengths: a few compiled programs
        # Masking without re-masking: a decided token is final, so each step's decided prefix can go out at once.
        # Per-step work (a host round trip each step) only for a batch with a client that reads it as it comes.
        per_step = self.live_steps and any(r.stream or r.want_steps for r in batch)
        early = sampler.persistent and not sampler.selection.remasks and per_step
        live = _Live(rows=rows, streams_decided_prefix=early)

        def before_canvas(index: int) -> np.ndarray:
            live.canvas, live.streamed = index, [0] * len(rows)
            out = np.ones((slots,), bool)
            now = time.monotonic()
            for i, row in enumerate(rows):
                if not row.done and row.request.cancelled.is_set():
                    self._finish(row, "cancelled")
                elif not row.done and now - row.request.arrived > row.request.timeout_s:
                    self._finish(row, "timeout")
                out[i] = row.done
            return out

        self._live = live
        try:
            stream = gen_lib.stream_canvases(
                self.exp.model,
                self.params,
                tokens,
                prompt_mask=mask,
                sampler=sampler,
                key=keys,
                max_new_tokens=region,
                first_canvas_length=settings.first_canvas,
                before_canvas=before_canvas,
                on_step=self._on_step if per_step else None,
                temperature_scale=self.temperature_scale(settings),
            )
            for update in stream:
                for i, row in enumerate(rows):
                    if not row.done:
                        rest = update.tokens[i][live.streamed[i] :]
                        self._advance(row, rest)
        finally:
            self._live = None
        for row in rows:  # the region ran out (bucketed canvases cover every max_tokens, so only by cancellation)
            if not row.done:
                self._finish(row, "cancelled" if row.request.cancelled.is_set() else "length")

    def _on_step(self, step: np.ndarray, canvas: np.ndarray, running: np.ndarray) -> None:
        """After every denoising step (on the host, while the loop runs): the per-step events asked for, and with a
        masking sampler that never re-masks, the newly decided prefix of each row's canvas as text."""
        live = self._live
        if live is None:
            return
        canvas = np.asarray(canvas)
        for i, row in enumerate(live.rows):
            if row.done or not running[i]:
                continue
            if row.request.want_steps:
                row.request.emit(
                    {"type": "step", "canvas": live.canvas, "step": int(step), "pieces": self.pieces(canvas[i])}
                )
            if live.streams_decided_prefix:
                masked = np.flatnonzero(canvas[i] == MASK_ID)
                decided = canvas[i][: masked[0] if masked.size else canvas.shape[1]]
                if len(decided) > live.streamed[i]:
                    self._advance(row, decided[live.streamed[i] :])
                    live.streamed[i] = len(decided)
