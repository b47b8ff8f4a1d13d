"""Several processes (`training/distributed.py`, real `jax.distributed` on localhost): config validation, two
processes equal one, a SIGTERM to one process saves the same step in both."""

from __future__ import annotations

import os
import signal

import jax
import numpy as np
import pytest
from _training_helpers import (
    _finish,
    _free_port,
    _launch,
    _losses,
    _mesh,
    _run_toy_loop,
    _wait_for_line,
)

from hackable_diffusion.training import distributed, sharding


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


@pytest.mark.slow
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


@pytest.mark.slow
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
