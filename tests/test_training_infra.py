"""Tests of the model-agnostic training infrastructure (optimizers, train step, sharding, checkpoints, loop).

The model is the toy LM of tests/_toy_train_worker.py; the subprocess tests run that file as a script.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import _toy_train_worker as toy
from hackable_diffusion.training import checkpointing, distributed, loop, metrics, optimizers, sharding
from hackable_diffusion.training.train_state import TrainState, make_train_step, step_key

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "tests", "_toy_train_worker.py")
SUBPROCESS_TIMEOUT_S = 90


def _mesh(data=1, fsdp=1, expert=1, tensor=1, devices=None):
    return sharding.make_mesh(dict(data=data, fsdp=fsdp, expert=expert, tensor=tensor), devices)


def _worker_env(num_devices, cache_dir):
    env = dict(os.environ)
    env.update(
        XLA_FLAGS=f"--xla_force_host_platform_device_count={num_devices}", JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1"
    )
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


# ----------------------------------------------------------------------------------------------------------------
# Optimizers
# ----------------------------------------------------------------------------------------------------------------


def test_unknown_optimizer_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown optimizer name 'sgdd'.*adafactor.*adamw"):
        optimizers.make_optimizer(toy.optimizer_cfg(10, name="sgdd"))


def test_warmup_cosine_schedule_values():
    cfg = toy.optimizer_cfg(110, peak_lr=1.0, end_lr=0.1, warmup_steps=10)
    lr = optimizers.make_lr_schedule(cfg)
    expected = {
        0: 0.0,
        5: 0.5,
        10: 1.0,
        60: 0.1 + 0.9 * 0.5,
        35: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)),
        110: 0.1,
        500: 0.1,
    }
    for step, value in expected.items():
        np.testing.assert_allclose(float(lr(step)), value, rtol=1e-6, atol=1e-7, err_msg=f"step {step}")


@pytest.mark.parametrize("name", ["adamw", "adafactor"])
def test_trainable_mask_keeps_frozen_params_bit_identical(name):
    params = jax.device_get(_jit(toy.init_fn)(jax.random.key(0)))

    def mask_fn(tree):  # frozen: the embedding and the experts' input projection
        mask = jax.tree.map(lambda _: True, tree)
        mask["embed"] = False
        mask["experts"]["w_in"] = False
        return mask

    # adamw gets the mask as a pytree of bools, adafactor as a callable.
    mask = mask_fn(params) if name == "adamw" else mask_fn
    tx = optimizers.make_optimizer(toy.optimizer_cfg(10, name=name, warmup_steps=0), trainable_mask=mask)
    state = _create_state(tx)
    step = _jit(make_train_step(toy.make_loss_fn(), tx, trainable_mask=mask))
    it = toy.make_iterator()
    batch = next(it)
    grads = _jit(jax.grad(lambda p: toy.make_loss_fn()(p, batch, step_key(state.rng, state.step))[0]))(state.params)
    for i in range(3):
        state, m = step(state, batch if i == 0 else next(it))
        assert bool(m["finite"])
        if i == 0:  # grad_norm covers the trainable params only
            trainable = [grads["out"]["kernel"], grads["out"]["bias"], grads["experts"]["w_out"]]
            np.testing.assert_allclose(m["grad_norm"], np.sqrt(sum(np.sum(np.square(g)) for g in trainable)), rtol=1e-5)
    assert np.array_equal(state.params["embed"], params["embed"])
    assert np.array_equal(state.params["experts"]["w_in"], params["experts"]["w_in"])
    assert not np.array_equal(state.params["out"]["kernel"], params["out"]["kernel"])
    assert not np.array_equal(state.params["experts"]["w_out"], params["experts"]["w_out"])


# ----------------------------------------------------------------------------------------------------------------
# Train step
# ----------------------------------------------------------------------------------------------------------------


def test_grad_accumulation_matches_full_batch_and_non_finite_steps_are_skipped():
    tx = optimizers.make_optimizer(toy.optimizer_cfg(10, warmup_steps=0))
    loss_fn = toy.make_loss_fn(noise=0.0)  # rng-free, so micro-batch keys do not matter
    batch = next(toy.make_iterator(global_batch=16))
    state = _create_state(tx, use_ema=True)
    steps = {accum: _jit(make_train_step(loss_fn, tx, grad_accum_steps=accum, ema_decay=0.5)) for accum in (1, 2)}
    (s1, m1), (s2, m2) = steps[1](state, batch), steps[2](state, batch)
    assert bool(m1["finite"]) and bool(m2["finite"])
    np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-6)
    np.testing.assert_allclose(m1["grad_norm"], m2["grad_norm"], rtol=1e-5)
    np.testing.assert_allclose(m1["ce"], m2["ce"], rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), s1.params, s2.params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), s1.ema_params, s2.ema_params)
    assert int(s1.step) == 1 and not np.array_equal(s1.params["embed"], state.params["embed"])
    with pytest.raises(ValueError, match="not divisible by grad_accum_steps=3"):
        _jit(make_train_step(loss_fn, tx, grad_accum_steps=3, ema_decay=0.5))(state, batch)

    # One NaN weight poisons loss and grads: the state comes back unchanged, flagged non-finite.
    poisoned = dict(batch, weight=np.where(np.arange(16) == 3, np.nan, 1.0).astype(np.float32))
    s_bad, m_bad = steps[1](s1, poisoned)
    assert not bool(m_bad["finite"]) and np.isnan(m_bad["loss"])
    jax.tree.map(np.testing.assert_array_equal, s_bad, s1)


# ----------------------------------------------------------------------------------------------------------------
# Sharding
# ----------------------------------------------------------------------------------------------------------------


def test_mesh_errors_and_fill():
    assert dict(_mesh(data=-1, tensor=2).shape) == dict(data=4, fsdp=1, expert=1, tensor=2)
    with pytest.raises(ValueError, match="has 6 devices but there are 8"):
        _mesh(data=3, tensor=2)
    with pytest.raises(ValueError, match=r"at most one mesh axis may be -1.*\['data', 'tensor'\]"):
        _mesh(data=-1, tensor=-1)
    with pytest.raises(ValueError, match="unknown mesh axes"):
        sharding.make_mesh(dict(data=8, model=1))
    mesh = _mesh(fsdp=2, expert=4)
    with pytest.raises(
        ValueError, match="dimension 'experts' of size 6 is not divisible by mesh axis 'expert' of size 4"
    ):
        sharding.logical_to_spec(("experts", "embed"), sharding.DEFAULT_RULES, mesh, (6, 8))
    assert sharding.logical_to_spec(
        ("experts", "embed"), sharding.DEFAULT_RULES, mesh, (6, 8), drop_indivisible=True
    ) == P(None, "fsdp")
    with pytest.raises(ValueError, match="logical axis 'widgets' has no rule"):
        sharding.logical_to_spec(("widgets",), sharding.DEFAULT_RULES, mesh, (8,))
    with pytest.raises(ValueError, match="mesh axis 'fsdp' is used by both"):
        sharding.logical_to_spec(("embed", "embed"), sharding.DEFAULT_RULES, mesh, (8, 8))
    # batch -> (data, fsdp): keeps the prefix that divides when allowed to drop.
    mesh2 = _mesh(data=2, fsdp=2, tensor=2)
    assert sharding.logical_to_spec(("batch", None), sharding.DEFAULT_RULES, mesh2, (8, 3)) == P(("data", "fsdp"), None)
    assert sharding.logical_to_spec(("batch",), sharding.DEFAULT_RULES, mesh2, (2,), drop_indivisible=True) == P("data")


def test_param_shardings_cover_every_param_and_expert_check():
    params = jax.eval_shape(toy.init_fn, jax.random.key(0))
    mesh = _mesh(fsdp=2, expert=2, tensor=2)
    shardings = sharding.param_shardings(params, toy.logical_axes_fn, mesh)
    assert shardings["experts"]["w_in"].spec == P("expert", "fsdp", "tensor")
    assert shardings["embed"].spec == P("tensor", "fsdp")
    assert sharding.replicated_expert_params(params, shardings, toy.logical_axes_fn) == []
    rules = dict(sharding.DEFAULT_RULES, experts=None)
    bad = sharding.param_shardings(params, toy.logical_axes_fn, mesh, rules)
    assert sharding.replicated_expert_params(params, bad, toy.logical_axes_fn) == ["experts/w_in", "experts/w_out"]
    params_extra = dict(params, mystery=jax.ShapeDtypeStruct((4,), jnp.float32))
    with pytest.raises(ValueError, match="no logical axes for parameter 'mystery'"):
        sharding.param_shardings(params_extra, toy.logical_axes_fn, mesh)


def _run_toy_loop(workdir, mesh, steps, **kwargs):
    defaults = dict(
        workdir=str(workdir),
        init_fn=toy.init_fn,
        loss_fn=toy.make_loss_fn(),
        train_iterator=toy.make_iterator(),
        total_steps=steps,
        optimizer_cfg=toy.optimizer_cfg(steps),
        mesh=mesh,
        param_logical_axes_fn=toy.logical_axes_fn,
        seed=0,
        log_every=1,
        checkpoint_every=0,
        compiler_options=toy.FAST_COMPILE,
    )
    defaults.update(kwargs)
    return loop.train(**defaults)


def test_sharded_training_matches_single_device(tmp_path):
    steps = 4
    sharded = _run_toy_loop(tmp_path / "sharded", _mesh(data=2, fsdp=2, tensor=2), steps, ema_decay=0.9)
    eval_batch = next(toy.make_iterator())
    eval_loss = _jit(lambda p: toy.make_loss_fn(noise=0.0)(p, eval_batch, None)[0])

    def eval_fn(params, ema_params):
        return {"loss": eval_loss(params), "ema_loss": eval_loss(ema_params)}

    single = _run_toy_loop(
        tmp_path / "single",
        _mesh(devices=jax.devices()[:1]),
        steps,
        ema_decay=0.9,
        eval_fn=eval_fn,
        eval_every=2,
        tokens_per_example=toy.SEQ,
    )
    assert sharded.params["experts"]["w_in"].sharding.spec == P("expert", "fsdp", "tensor")
    assert len(sharded.params["experts"]["w_in"].sharding.device_set) == 8
    mu = sharded.opt_state[1][0].mu["out"]["kernel"]  # (clip, adamw chain, ...): Adam's first moment
    assert mu.sharding.spec == P("fsdp", "tensor")
    l_sharded, l_single = _losses(tmp_path / "sharded"), _losses(tmp_path / "single")
    assert sorted(l_sharded) == list(range(1, steps + 1))
    np.testing.assert_allclose([l_sharded[s] for s in l_single], list(l_single.values()), rtol=1e-5)
    assert l_single[steps] < l_single[1]
    evals = metrics.read_metrics(str(tmp_path / "single"), "eval")
    assert [r["step"] for r in evals] == [2, 4] and all(np.isfinite(r["ema_loss"]) for r in evals)
    last_train = metrics.read_metrics(str(tmp_path / "single"), "train")[-1]
    assert {"loss", "ce", "grad_norm", "param_norm", "lr", "steps_per_sec", "tokens_per_sec"} <= set(last_train)
    for a, b in zip(jax.tree.leaves(sharded.params), jax.tree.leaves(single.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints, NaN stop, metrics
# ----------------------------------------------------------------------------------------------------------------


def test_corrupt_latest_checkpoint_falls_back_with_warning(tmp_path, caplog):
    mesh = _mesh(data=2, fsdp=2, tensor=2)
    tx = optimizers.make_optimizer(toy.optimizer_cfg(10))
    create = lambda: TrainState.create(toy.init_fn(jax.random.key(0)), tx, jax.random.key(1))  # noqa: E731
    abstract = jax.eval_shape(create)
    p_shard = sharding.param_shardings(abstract.params, toy.logical_axes_fn, mesh)
    s_shard = sharding.state_shardings(abstract, p_shard, mesh)
    state = jax.jit(create, out_shardings=s_shard, compiler_options=toy.FAST_COMPILE)()
    bump = jax.jit(
        lambda s: s.replace(step=s.step + 1, params=jax.tree.map(lambda x: x + 1.0, s.params)),
        out_shardings=s_shard,
        compiler_options=toy.FAST_COMPILE,
    )
    it = toy.make_iterator()
    ckpt = checkpointing.Checkpointer(str(tmp_path / "ckpt"), max_to_keep=3)
    saved = {}
    for step in (1, 2):
        next(it)
        state = bump(state)
        ckpt.save(step, state, it)
        saved[step] = (jax.device_get(state.params), it.get_state())
    bad = state.replace(params=jax.tree.map(lambda x: x * jnp.nan, state.params))
    with pytest.raises(checkpointing.NonFiniteStateError, match="refusing to checkpoint step 3"):
        ckpt.save(3, bad, it)
    ckpt.close()
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["1", "2"]
    # Damage step 2: truncate every array chunk file and delete its data-iterator item.
    for root, _, files in os.walk(tmp_path / "ckpt" / "2" / "state"):
        for f in files:
            if os.path.basename(root) == "d":
                path = os.path.join(root, f)
                os.truncate(path, os.path.getsize(path) // 2)
    shutil.rmtree(tmp_path / "ckpt" / "2" / "data")

    fresh_it = toy.make_iterator()
    ckpt = checkpointing.Checkpointer(str(tmp_path / "ckpt"), max_to_keep=3)
    with caplog.at_level(logging.WARNING, logger=checkpointing.logger.name):
        restored, step = ckpt.restore_latest(checkpointing.abstract_like(state), fresh_it)
    assert step == 1 and int(restored.step) == 1
    assert any("checkpoint step 2" in r.getMessage() and "falling back" in r.getMessage() for r in caplog.records)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored.params), saved[1][0])
    assert restored.params["experts"]["w_in"].sharding == state.params["experts"]["w_in"].sharding
    assert fresh_it.get_state() == saved[1][1]
    # Training on from step 1 and saving step 2 again replaces the damaged step 2.
    next(fresh_it)
    ckpt.save(2, bump(restored), fresh_it)
    ckpt.wait()
    again, step = ckpt.restore_latest(checkpointing.abstract_like(state), toy.make_iterator())
    ckpt.close()
    assert step == 2
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(again.params), saved[2][0])


def test_nan_loss_stops_training_without_bad_checkpoint(tmp_path):
    with pytest.raises(loop.NonFiniteLossError, match=r"non-finite at step 5 .*the last good checkpoint is step 4"):
        _run_toy_loop(
            tmp_path,
            _mesh(devices=jax.devices()[:1]),
            8,
            checkpoint_every=2,
            train_iterator=toy.make_iterator(nan_at_batch=4),
        )
    assert sorted(int(s) for s in os.listdir(tmp_path / "checkpoints")) == [2, 4]
    assert max(_losses(tmp_path)) == 4


def test_metrics_files_and_progress_line(tmp_path):
    writer = metrics.MetricsWriter(str(tmp_path))
    writer.write(3, {"loss": jnp.float32(1.5), "acc": 0.25})
    writer.write(3, {"bpt": np.float64(np.nan)}, split="eval")
    with pytest.raises(ValueError, match="reserved"):
        writer.write(4, {"step": 1.0})
    writer.close()
    records = metrics.read_metrics(str(tmp_path))
    assert records[0]["step"] == 3 and records[0]["split"] == "train" and records[0]["loss"] == 1.5
    assert records[1] == {**records[1], "split": "eval", "bpt": "nan"}
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "tensorboard"))

    clock = iter([0.0, 10.0, 20.0]).__next__
    progress = metrics.ProgressLogger(1000, tokens_per_step=2560, flops_per_token=1e6, peak_flops=1e11, clock=clock)
    assert progress.update(100, 3.5) == "step 100/1000 | loss 3.5"
    progress.update(140, 3.3)  # 4 steps/s
    line = progress.update(180, 3.21)
    assert line == "step 180/1000 | loss 3.21 | 4 steps/s | 10.2k tok/s | MFU 10% | ETA 3m25s"
    peak = metrics.measure_peak_matmul_flops(n=128, repeats=3)
    assert 1e6 < peak < 1e15


def test_read_metrics_lets_a_resumed_run_replace_the_steps_it_redoes(tmp_path):
    """Killed after logging steps 3-4 past its checkpoint at 2, the run resumes at 2 and logs 3-5 again."""
    writer = metrics.MetricsWriter(str(tmp_path))
    for step in (1, 2, 3, 4):
        writer.write(step, {"loss": float(step)})
        if step % 2 == 0:
            writer.write(step, {"bpt": float(step)}, split="eval")
    for step in (3, 4, 5):
        writer.write(step, {"loss": 10.0 + step})
    writer.write(4, {"bpt": 14.0}, split="eval")
    writer.write(4, {"bpt": 24.0}, split="eval")  # the same split and step again: the later record stands
    writer.close()
    train = metrics.read_metrics(str(tmp_path), "train")
    assert [(r["step"], r["loss"]) for r in train] == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0), (5, 15.0)]
    assert [(r["step"], r["bpt"]) for r in metrics.read_metrics(str(tmp_path), "eval")] == [(2, 2.0), (4, 24.0)]
    everything = metrics.read_metrics(str(tmp_path), keep_superseded=True)
    assert [r["step"] for r in everything if r["split"] == "train"] == [1, 2, 3, 4, 3, 4, 5]
    assert len(everything) == 7 + 4  # 7 train lines, 4 eval lines


def test_distributed_config_validation(monkeypatch):
    for k in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES, distributed.ENV_PROCESS_ID):
        monkeypatch.delenv(k, raising=False)
    assert distributed.maybe_initialize_distributed() is False
    monkeypatch.setenv(distributed.ENV_NUM_PROCESSES, "2")
    with pytest.raises(ValueError, match=r"missing \['coordinator_address', 'process_id'\]"):
        distributed.maybe_initialize_distributed()
    monkeypatch.setenv(distributed.ENV_PROCESS_ID, "x")
    with pytest.raises(ValueError, match="JAX_PROCESS_ID='x' is not a valid int"):
        distributed.maybe_initialize_distributed()


# ----------------------------------------------------------------------------------------------------------------
# Subprocess tests: exact resume after SIGKILL, 2 processes == 1 process
# ----------------------------------------------------------------------------------------------------------------


def test_resume_after_sigkill_is_bit_exact(tmp_path):
    steps = 8
    common = ["--total_steps", str(steps), "--checkpoint_every", "3"]
    cache = tmp_path / "jax_cache"
    ref = _launch(
        ["--workdir", str(tmp_path / "ref"), "--out", str(tmp_path / "ref.npz"), *common], cache, tmp_path / "ref.log"
    )
    # Killed at step 6, right after the async save of step 6 started (it may or may not finish).
    killed = _launch(
        ["--workdir", str(tmp_path / "run"), "--kill_at_step", "6", "--kill_after_checkpoint", "3", *common],
        cache,
        tmp_path / "killed.log",
    )
    rc_ref, out_ref = _finish(ref)
    rc_killed, out_killed = _finish(killed)
    assert rc_ref == 0, out_ref[-3000:]
    assert rc_killed == -9 and "killing myself at step 6" in out_killed, out_killed[-3000:]
    rc, out = _finish(
        _launch(
            ["--workdir", str(tmp_path / "run"), "--out", str(tmp_path / "run.npz"), *common],
            cache,
            tmp_path / "resumed.log",
        )
    )
    assert rc == 0, out[-3000:]
    assert "Restored checkpoint at step 3" in out or "Restored checkpoint at step 6" in out, out[-3000:]
    ref_arrays, run_arrays = np.load(tmp_path / "ref.npz"), np.load(tmp_path / "run.npz")
    assert sorted(ref_arrays.files) == sorted(run_arrays.files) and len(ref_arrays.files) == 10
    for name in ref_arrays.files:
        assert np.array_equal(ref_arrays[name], run_arrays[name]), name
    assert _losses(tmp_path / "ref") == _losses(tmp_path / "run")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_one_process(tmp_path):
    """2 processes x 2 CPU devices (each reading its half of every global batch) train like 1 process x 4 devices;
    the 2-process run checkpoints at step 3, then calls train() again, which restores it in both processes."""
    steps, port = 5, _free_port()
    workdir = tmp_path / "mp"
    procs = [
        _launch(
            [
                "--workdir",
                str(workdir),
                "--total_steps",
                "3",
                "--resume_to",
                str(steps),
                "--checkpoint_every",
                "3",
                "--mesh",
                "2,1,1,2",
                "--coordinator",
                f"127.0.0.1:{port}",
                "--num_processes",
                "2",
                "--process_id",
                str(i),
                "--out",
                str(tmp_path / "mp.npz"),
            ],
            tmp_path / "jax_cache",
            tmp_path / f"process{i}.log",
            num_devices=2,
        )
        for i in range(2)
    ]
    try:  # the 1-process x 4-device reference runs in this process meanwhile
        single = _run_toy_loop(
            tmp_path / "sp", _mesh(data=2, tensor=2, devices=jax.devices()[:4]), steps, ema_decay=0.9
        )
        results = [_finish(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rc, out in results:
        assert rc == 0, out[-3000:]
    out = results[0][1]
    assert "Initialised a new model" in out and "Restored checkpoint at step 3" in out, out[-3000:]
    assert sorted(int(s) for s in os.listdir(workdir / "checkpoints")) == [3, 5]

    l_mp, l_sp = _losses(workdir), _losses(tmp_path / "sp")
    assert sorted(l_mp) == sorted(l_sp) == list(range(1, steps + 1))
    np.testing.assert_allclose([l_mp[s] for s in sorted(l_sp)], [l_sp[s] for s in sorted(l_sp)], rtol=1e-5)
    mp_arrays = np.load(tmp_path / "mp.npz")
    flat = {
        "/".join(sharding.path_to_names(p)): np.asarray(x)
        for p, x in jax.tree_util.tree_flatten_with_path({"params": single.params, "ema": single.ema_params})[0]
    }
    assert sorted(flat) == sorted(mp_arrays.files)
    for name, value in flat.items():
        np.testing.assert_allclose(mp_arrays[name], value, rtol=1e-4, atol=1e-6, err_msg=name)


def _wait_for_line(proc, text, timeout_s=SUBPROCESS_TIMEOUT_S):
    """Polls the worker's log until `text` appears (or the worker exits)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        with open(proc.log_path) as f:
            if text in f.read():
                return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_saves_a_checkpoint_and_resume_equals_an_uninterrupted_run(tmp_path, signum, code):
    """SIGINT / SIGTERM mid-run: the step finishes, a checkpoint of that step is saved (not a periodic one: every
    100 steps here), the exit status is 128 + signal; the same command resumes and ends bit-identical to a run that
    was never stopped."""
    steps = 12
    common = ["--total_steps", str(steps), "--checkpoint_every", "100", "--step_sleep", "0.15"]
    cache = tmp_path / "jax_cache"
    ref = _launch(
        ["--workdir", str(tmp_path / "ref"), "--out", str(tmp_path / "ref.npz"), *common], cache, tmp_path / "ref.log"
    )
    run = _launch(["--workdir", str(tmp_path / "run"), *common], cache, tmp_path / "run.log")
    assert _wait_for_line(run, "step 3/"), open(run.log_path).read()[-3000:]
    run.send_signal(signum)
    rc, out = _finish(run)
    assert rc == code, out[-3000:]
    stopped = [int(s) for s in os.listdir(tmp_path / "run" / "checkpoints")]
    assert len(stopped) == 1 and 3 <= stopped[0] < steps, (stopped, out[-2000:])
    assert f"stopped at step {stopped[0]} and saved it" in out and "run the same command again" in out
    rc, out = _finish(
        _launch(
            ["--workdir", str(tmp_path / "run"), "--out", str(tmp_path / "run.npz"), *common],
            cache,
            tmp_path / "resumed.log",
        )
    )
    assert rc == 0 and f"Restored checkpoint at step {stopped[0]}" in out, out[-3000:]
    rc_ref, out_ref = _finish(ref)
    assert rc_ref == 0, out_ref[-3000:]
    ref_arrays, run_arrays = np.load(tmp_path / "ref.npz"), np.load(tmp_path / "run.npz")
    for name in ref_arrays.files:
        assert np.array_equal(ref_arrays[name], run_arrays[name]), name
    assert _losses(tmp_path / "ref") == _losses(tmp_path / "run")


def test_sigterm_to_one_of_two_processes_saves_the_same_step_in_both(tmp_path):
    """Preemption of one process of a 2-process run: both agree on the step, save it together and exit 143; resumed,
    the run ends where a 1-process run of the same steps ends."""
    steps, port = 12, _free_port()
    workdir = tmp_path / "mp"

    def launch(i, out=None, port=port):
        args = [
            "--workdir",
            str(workdir),
            "--total_steps",
            str(steps),
            "--checkpoint_every",
            "100",
            "--mesh",
            "2,1,1,2",
            "--coordinator",
            f"127.0.0.1:{port}",
            "--num_processes",
            "2",
            "--process_id",
            str(i),
            "--step_sleep",
            "0.15",
        ]
        return _launch(
            args + (["--out", out] if out else []), tmp_path / "jax_cache", tmp_path / f"p{i}_{port}.log", num_devices=2
        )

    procs = [launch(i) for i in range(2)]
    try:
        assert _wait_for_line(procs[0], "step 3/"), open(procs[0].log_path).read()[-3000:]
        procs[1].send_signal(signal.SIGTERM)
        results = [_finish(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rc, out in results:
        assert rc == 143, out[-3000:]
    saved = [int(s) for s in os.listdir(workdir / "checkpoints")]
    assert len(saved) == 1 and 3 <= saved[0] < steps, saved
    port2 = _free_port()
    resumed = [launch(i, out=str(tmp_path / "mp.npz"), port=port2) for i in range(2)]
    try:
        single = _run_toy_loop(
            tmp_path / "sp", _mesh(data=2, tensor=2, devices=jax.devices()[:4]), steps, ema_decay=0.9
        )
        results = [_finish(p) for p in resumed]
    finally:
        for p in resumed:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rc, out in results:
        assert rc == 0, out[-3000:]
    assert f"Restored checkpoint at step {saved[0]}" in results[0][1], results[0][1][-3000:]  # process 0 prints
    mp_arrays = np.load(tmp_path / "mp.npz")
    flat = {
        "/".join(sharding.path_to_names(p)): np.asarray(x)
        for p, x in jax.tree_util.tree_flatten_with_path({"params": single.params, "ema": single.ema_params})[0]
    }
    for name, value in flat.items():
        np.testing.assert_allclose(mp_arrays[name], value, rtol=1e-4, atol=1e-6, err_msg=name)


def test_a_second_writer_is_refused_while_the_lock_is_held(tmp_path):
    from hackable_diffusion.training.workdir_lock import WorkdirLock, WorkdirLockedError

    with WorkdirLock(tmp_path / "run") as held:
        with pytest.raises(WorkdirLockedError, match=rf"being written by pid {os.getpid()}"):
            WorkdirLock(tmp_path / "run").acquire()
        assert held.acquire() is held  # the holder may take it again
    WorkdirLock(tmp_path / "run").acquire().release()  # released: free again
    # A holder that died (SIGKILL) leaves the file but not the lock: the kernel released it.
    code = f"from hackable_diffusion.training.workdir_lock import WorkdirLock; import os; WorkdirLock({str(tmp_path / 'gone')!r}).acquire(); os.kill(os.getpid(), 9)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == -9
    assert (tmp_path / "gone" / ".lock").is_file()
    WorkdirLock(tmp_path / "gone").acquire().release()


def test_mfu_counts_the_compiled_programs_flops_and_stays_below_the_measured_peak(tmp_path):
    """The analytic FLOPs per token that the MFU divides equal XLA's count of the compiled forward and backward pass
    (layers unrolled so XLA sees each one; looped depth too) within 6%; a run measured against this machine's
    calibrated peak never reports an MFU above 1."""
    from hackable_diffusion import experiment
    from hackable_diffusion.diffusion.objectives import AutoregressiveObjective
    from hackable_diffusion.models import presets
    from hackable_diffusion.models import transformer as T
    from hackable_diffusion.models.config import TransformerConfig

    for loops in (1, 2):
        shape = presets.derived(
            vocab_size=256,
            embed_dim=128,
            num_layers=4,
            num_heads=4,
            head_dim=32,
            num_kv_heads=2,
            ffw_hidden=512,
            moe=None,
            layer_pattern=("local", "global"),
            sliding_window=16,
            global_head_dim=32,
            global_num_kv_heads=2,
            param_dtype="float32",
            compute_dtype="float32",
            depth_loops=loops,
            scan_unroll=2,
        )
        model = T.Transformer(TransformerConfig.from_dict(shape))
        objective = AutoregressiveObjective(model)
        params = T.init_params(model, jax.random.key(0))
        b, l = 4, 64
        batch = {"tokens": jnp.ones((b, l), jnp.int32)}
        grad = jax.jit(jax.value_and_grad(lambda p: objective(p, batch, jax.random.key(0))[0]))
        cost = grad.lower(params).compile().cost_analysis()
        compiled = (cost[0] if isinstance(cost, list) else cost)["flops"] / (b * l)
        assert abs(compiled / experiment.flops_per_token(model, l) - 1) < 0.06, (loops, compiled)

    peak = metrics.calibrated_peak_flops()
    flops_per_token = 6 * sum(int(np.prod(x.shape)) for x in jax.tree.leaves(toy.init_fn(jax.random.key(0))))
    _run_toy_loop(
        tmp_path / "mfu",
        _mesh(devices=jax.devices()[:1]),
        6,
        tokens_per_example=toy.SEQ,
        flops_per_token=flops_per_token,
        peak_flops=peak,
    )
    mfus = [r["mfu"] for r in metrics.read_metrics(tmp_path / "mfu", "train") if "mfu" in r]
    assert mfus and all(0 < m <= 1 for m in mfus)
