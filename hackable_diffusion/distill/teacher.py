"""The teacher's trajectories for few-step distillation: generated once with the toolbox's jitted sampler, cached in the
run directory, served to the training loop as the student's rows.

Prompts come from the run's own training stream (`Task.train_iterator`, seeded): for a block-diffusion run the first
l - c tokens of a training sequence are the prefix (encoded causally into the KV cache, as `generate` does) and the
canvas of c tokens after it starts from the prior; for a run trained in place (a Sudoku grid) the whole sequence is the
canvas, its fixed positions (the givens) kept. The teacher (`denoise_canvas(return_trajectory=True)` at
`teacher_steps`, early stopping off so that every trajectory has exactly N steps) writes the canvas before and after
each step. A distillation run uses each trajectory about `steps * batch / pool_size` times; the pool is a pure function
of (teacher weights, sampler, seed), so it is cached (`teacher_pool.npz` beside a JSON of what made it) and a resumed
run reads it instead of generating it again.

`TeacherPool` is the loop's train iterator: batch j holds the rows of trajectories `perm_e[...]` (a seeded permutation
per epoch e over the pool), turned into student rows by the method (`methods.py`); its checkpointed state is the
batch counter, so a resumed run continues with the same batches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hackable_diffusion.models.attention import init_cache
from hackable_diffusion.sampling import canvas as canvas_lib
from hackable_diffusion.sampling.keys import row_keys
from hackable_diffusion.sampling.prompts import prefill

POOL_FILE, POOL_META = "teacher_pool.npz", "teacher_pool.json"


@dataclasses.dataclass(frozen=True)
class CanvasPrompts:
    """What the teacher starts from: a prefix (b, p) with its mask (p = 0: in place), the canvas's tokens (only the
    fixed ones are read) and its fixed positions (b, c)."""

    prefix: np.ndarray
    prefix_mask: np.ndarray
    canvas_tokens: np.ndarray
    fixed: np.ndarray


def split_batch(batch: dict[str, np.ndarray], canvas_len: int) -> CanvasPrompts:
    """A training batch as teacher prompts: in place (`canvas_len` 0) the whole row is the canvas; otherwise the last
    `canvas_len` tokens are the canvas and the rest the prefix."""
    tokens = np.asarray(batch["tokens"], np.int32)
    b, length = tokens.shape
    fixed = np.asarray(batch.get("fixed", np.zeros((b, length), bool)), bool)
    valid = np.asarray(batch["weights"]) > 0 if "weights" in batch else np.ones((b, length), bool)
    if not canvas_len:
        return CanvasPrompts(np.zeros((b, 0), np.int32), np.zeros((b, 0), bool), tokens, fixed)
    if length <= canvas_len:
        raise ValueError(
            f"block distillation needs a prefix: the training sequences ({length} tokens) must be longer than "
            f"diffusion.canvas_len={canvas_len}."
        )
    p = length - canvas_len
    return CanvasPrompts(tokens[:, :p], valid[:, :p], tokens[:, p:], fixed[:, p:])


def teacher_trajectories(model, params, prompts: CanvasPrompts, keys: jax.Array, sampler) -> np.ndarray:
    """The teacher's canvas before and after each of its `sampler.num_steps` steps: (N + 1, b, c) int32."""
    b = prompts.canvas_tokens.shape[0]
    fixed = jnp.asarray(prompts.fixed)
    tokens = jnp.asarray(prompts.canvas_tokens)
    start = sampler.initial_canvas(keys, b, fixed=fixed, fixed_tokens=tokens)
    if prompts.prefix.shape[1]:
        _, cache = prefill(
            model,
            params,
            jnp.asarray(prompts.prefix),
            jnp.asarray(prompts.prefix_mask),
            cache_length=prompts.prefix.shape[1],
        )
    else:
        cache = init_cache(model.cfg, b, 1)  # in place: no prefix, every slot invalid
    result = canvas_lib.denoise_canvas(
        model, params, cache, start, keys, sampler=sampler, fixed=fixed, return_trajectory=True
    )
    return np.concatenate([np.asarray(start)[None], np.asarray(result.trajectory)], axis=0).astype(np.int32)


def _fingerprint(meta: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(meta, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build_pool(
    *,
    model,
    params,
    sampler,
    prompt_batches,
    canvas_len: int,
    pool_size: int,
    seed: int,
    workdir: str | pathlib.Path | None,
    meta: dict[str, Any],
    keep_correct: bool = False,
    max_batches: int = 0,
) -> dict[str, np.ndarray]:
    """`pool_size` teacher trajectories (cached in `workdir` under `meta`'s fingerprint; None: not cached), with
    progress lines. Returns prefix, prefix_mask, fixed and trajectory (n, N + 1, c). `keep_correct`: keep only the
    trajectories that end on the training row's own canvas (a puzzle's solution: the teacher's successes, rejection
    sampling), trying at most `max_batches` batches (0: 50 x the batches the pool needs)."""
    meta = dict(
        meta, pool_size=pool_size, seed=seed, num_steps=sampler.num_steps, sampler=repr(sampler), keep=keep_correct
    )
    key = _fingerprint(meta)
    path = None if workdir is None else pathlib.Path(workdir)
    if path is not None and (path / POOL_FILE).exists() and (path / POOL_META).exists():
        stored = json.loads((path / POOL_META).read_text())
        if stored.get("fingerprint") == key:
            with np.load(path / POOL_FILE) as data:
                pool = {k: data[k] for k in data.files}
            print(f"Teacher trajectories: {len(pool['trajectory']):,} read from {path / POOL_FILE}.", flush=True)
            return pool
        print(f"Teacher trajectories in {path / POOL_FILE} were made with other settings; generating them again.")
    parts: dict[str, list[np.ndarray]] = {"prefix": [], "prefix_mask": [], "fixed": [], "trajectory": []}
    made, tried, batch_index, started = 0, 0, 0, time.perf_counter()
    while made < pool_size:
        prompts = split_batch(next(prompt_batches), canvas_len)
        b = prompts.canvas_tokens.shape[0]
        if max_batches and batch_index >= max_batches or not max_batches and batch_index >= 50 * -(-pool_size // b):
            raise ValueError(
                f"the teacher ended on the training row's own canvas in {made} of {tried} trajectories; "
                f"config.distill.pool_size={pool_size} is out of reach: lower it or set distill.keep='all'."
            )
        keys = row_keys(jax.random.fold_in(jax.random.key(seed), batch_index), b)
        trajectory = teacher_trajectories(model, params, prompts, keys, sampler)
        rows = np.arange(b)
        if keep_correct:
            rows = rows[np.all(trajectory[-1] == prompts.canvas_tokens, axis=1)]
        rows = rows[: pool_size - made]
        parts["prefix"].append(prompts.prefix[rows])
        parts["prefix_mask"].append(prompts.prefix_mask[rows])
        parts["fixed"].append(prompts.fixed[rows])
        parts["trajectory"].append(trajectory[:, rows].transpose(1, 0, 2))
        made, tried, batch_index = made + len(rows), tried + b, batch_index + 1
        rate = made / max(time.perf_counter() - started, 1e-9)
        kept = f", {made / tried:.0%} kept" if keep_correct else ""
        eta = f"{(pool_size - made) / rate:.0f}s" if rate else "?"
        print(f"  teacher trajectories {made:,}/{pool_size:,} ({rate:.1f}/s{kept}, ETA {eta})", flush=True)
    pool = {k: np.concatenate(v) for k, v in parts.items()}
    if path is not None and jax.process_index() == 0:
        path.mkdir(parents=True, exist_ok=True)
        tmp = path / (POOL_FILE + ".tmp.npz")
        np.savez(tmp, **pool)
        tmp.replace(path / POOL_FILE)
        (path / POOL_META).write_text(json.dumps({"fingerprint": key, **meta}, indent=1, default=str))
    return pool


class PromptStream:
    """The on-policy methods' train iterator: the task's training batches as prompts (`split_batch`), no teacher
    trajectories; its checkpointed state is the task iterator's own."""

    def __init__(self, batches, canvas_len: int):
        self.batches, self.canvas_len = batches, canvas_len

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        prompts = split_batch(next(self.batches), self.canvas_len)
        return {
            "prefix": prompts.prefix,
            "prefix_mask": prompts.prefix_mask,
            "canvas_tokens": prompts.canvas_tokens,
            "fixed": prompts.fixed,
        }

    def start_prefetch(self) -> None:
        if hasattr(self.batches, "start_prefetch"):
            self.batches.start_prefetch()

    def get_state(self) -> bytes:  # grain's checkpoint handler takes bytes from an iterator of its own kind only
        state = self.batches.get_state()
        return state if isinstance(state, bytes) else json.dumps({"task_iterator": state}).encode()

    def set_state(self, state: bytes | str) -> None:
        raw = state.encode() if isinstance(state, str) else state
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and set(parsed) == {"task_iterator"}:
            self.batches.set_state(parsed["task_iterator"])
        else:
            self.batches.set_state(raw)


class TeacherPool:
    """The distillation run's train iterator over a pool of teacher trajectories (see the module docstring)."""

    def __init__(
        self,
        pool: dict[str, np.ndarray],
        method,
        *,
        batch_size: int,
        seed: int,
        mask_id: int | None,
        noise_ids: np.ndarray | None = None,
    ):
        n = len(pool["trajectory"])
        if batch_size > n:
            raise ValueError(
                f"config.data.batch_size={batch_size} is larger than the teacher pool ({n}); raise "
                "config.distill.pool_size."
            )
        self.pool, self.method, self.batch_size, self.seed, self.mask_id = pool, method, batch_size, seed, mask_id
        self.noise_ids = None if noise_ids is None else np.asarray(noise_ids, np.int32)
        if getattr(method, "needs_noise", False) and mask_id is None and self.noise_ids is None:
            raise ValueError(f"the {method.name} method on a uniform run needs the prior's token ids (noise_ids).")
        self.batch_index = 0

    def indices(self, batch_index: int) -> np.ndarray:
        n = len(self.pool["trajectory"])
        positions = np.arange(batch_index * self.batch_size, (batch_index + 1) * self.batch_size)
        epochs, offsets = np.divmod(positions, n)
        out = np.empty(self.batch_size, np.int64)
        for epoch in np.unique(epochs):
            here = epochs == epoch
            out[here] = np.random.default_rng([self.seed, int(epoch)]).permutation(n)[offsets[here]]
        return out

    def rows(self, index: np.ndarray, batch_index: int = 0) -> dict[str, np.ndarray]:
        trajectory = self.pool["trajectory"][index].transpose(1, 0, 2)  # (N + 1, b, c)
        fixed = self.pool["fixed"][index]
        if getattr(self.method, "needs_noise", False) and self.mask_id is None:  # seeded by the batch: resumable
            rng = np.random.default_rng([self.seed, 1, batch_index])
            shape = (len(index), self.method.student_steps, trajectory.shape[-1])
            rows = self.method(trajectory, fixed, None, noise=rng.choice(self.noise_ids, size=shape).astype(np.int32))
        else:
            rows = self.method(trajectory, fixed, self.mask_id)
        out = {"states": rows.states, "targets": rows.targets, "weights": rows.weights}
        if self.pool["prefix"].shape[1]:
            out["prefix"] = self.pool["prefix"][index]
            out["prefix_mask"] = self.pool["prefix_mask"][index]
        return out

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = self.rows(self.indices(self.batch_index), self.batch_index)
        self.batch_index += 1
        return batch

    def start_prefetch(self) -> None:  # called by grain's checkpoint handler after a restore
        pass

    def get_state(self) -> bytes:
        return json.dumps({"batch_index": self.batch_index}).encode()

    def set_state(self, state: bytes) -> None:
        self.batch_index = int(json.loads(state.decode() if isinstance(state, bytes) else state)["batch_index"])
