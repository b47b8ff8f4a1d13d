"""The training loop (`training/loop.py`) on the toy LM: sharded equals single-device, a NaN loss stops without a
bad checkpoint, resume after SIGKILL and after SIGINT/SIGTERM equals an uninterrupted run."""

from __future__ import annotations

import os
import signal

import _toy_train_worker as toy
import jax
import numpy as np
import pytest
from _training_helpers import (
    _finish,
    _jit,
    _launch,
    _losses,
    _mesh,
    _run_toy_loop,
    _wait_for_line,
)
from jax.sharding import PartitionSpec as P

from hackable_diffusion.training import loop, metrics


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
