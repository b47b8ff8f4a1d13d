"""Shared pieces of the training tests: meshes, the toy LM's state, and the subprocess runner of
tests/training/_toy_train_worker.py (runs that file as a script)."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time

import _toy_train_worker as toy
import jax
import pytest
from _xla_flags import with_device_count

from hackable_diffusion.training import distributed, loop, metrics, sharding
from hackable_diffusion.training.train_state import TrainState

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


WORKER = os.path.join(REPO, "tests", "training", "_toy_train_worker.py")


SUBPROCESS_TIMEOUT_S = 90


def _mesh(data=1, fsdp=1, expert=1, tensor=1, devices=None):
    return sharding.make_mesh(dict(data=data, fsdp=fsdp, expert=expert, tensor=tensor), devices)


def _worker_env(num_devices, cache_dir):
    env = dict(os.environ)
    flags = with_device_count(env.get("XLA_FLAGS", ""), num_devices)
    env.update(XLA_FLAGS=flags, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    # A persistent compilation cache shared by the workers of one test: restarted runs skip recompiling.
    env.update(
        JAX_COMPILATION_CACHE_DIR=str(cache_dir),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
    )
    for k in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES, distributed.ENV_PROCESS_ID):
        env.pop(k, None)
    return env


def _launch(args, cache_dir, log_path, num_devices=1):
    """Starts the worker with its output going to `log_path` (a file, so a chatty worker can never block)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, WORKER, *args],
            cwd=REPO,
            env=_worker_env(num_devices, cache_dir),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    proc.log_path = log_path
    return proc


def _finish(proc):
    """(returncode, output) of a worker, killing it after SUBPROCESS_TIMEOUT_S."""
    try:
        proc.wait(timeout=SUBPROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        with open(proc.log_path) as f:
            pytest.fail(f"worker timed out after {SUBPROCESS_TIMEOUT_S}s:\n{f.read()[-3000:]}")
    with open(proc.log_path) as f:
        return proc.returncode, f.read()


def _jit(fn):
    return jax.jit(fn, compiler_options=toy.FAST_COMPILE)


def _create_state(tx, use_ema=False):
    return _jit(lambda: TrainState.create(toy.init_fn(jax.random.key(0)), tx, jax.random.key(1), use_ema=use_ema))()


def _losses(workdir):
    by_step = {}
    for r in metrics.read_metrics(workdir, "train"):
        by_step[r["step"]] = r["loss"]  # a resumed run rewrites the steps after its checkpoint
    return by_step


LOOP_FIELDS = {f.name for f in dataclasses.fields(loop.LoopConfig)}


def _run_toy_loop(workdir, mesh, steps, **kwargs):
    """The toy LM through `loop.train`; keyword arguments that are `LoopConfig` fields go to the loop settings."""
    settings = dict(total_steps=steps, seed=0, log_every=1, checkpoint_every=0)
    settings.update({k: kwargs.pop(k) for k in list(kwargs) if k in LOOP_FIELDS})
    defaults = dict(
        workdir=str(workdir),
        init_fn=toy.init_fn,
        loss_fn=toy.make_loss_fn(),
        train_iterator=toy.make_iterator(),
        loop=loop.LoopConfig(**settings),
        optimizer_cfg=toy.optimizer_cfg(steps),
        mesh=mesh,
        param_logical_axes_fn=toy.logical_axes_fn,
        compiler_options=toy.FAST_COMPILE,
    )
    defaults.update(kwargs)
    return loop.train(**defaults)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_line(proc, text, timeout_s=SUBPROCESS_TIMEOUT_S):
    """Polls the worker's log until `text` appears (or the worker exits)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        with open(proc.log_path) as f:
            if text in f.read():
                return True
        time.sleep(0.05)
    return False
