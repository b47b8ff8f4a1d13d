"""Shared pytest setup: 8 simulated CPU devices for mesh tests, deterministic seeds, the hypothesis profiles, the
`slow` marker, and tiny text runs trained once per test run and shared by the end-to-end tests."""

import contextlib
import fcntl
import io
import os
import pathlib
import shutil

import pytest

# Must be set before jax initialises its backend: lets sharding tests build an 8-device mesh on a CPU. The tests run
# tiny programs, so most of their time is XLA compiling them; without LLVM's optimisation passes (level 0) the suite
# ran in 914 s on two xdist workers of a 2-core CPU, against 1,377 s at the default level.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import _hypothesis_profiles  # noqa: E402,F401  (registers and loads the `ci` / `thorough` profiles)
from _tiny_configs import TRAIN_OUTPUT  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: trains, compiles large programs or runs subprocesses (deselect with -m 'not slow')"
    )


def _train_shared_runs(root: pathlib.Path) -> None:
    from _tiny_configs import tiny_text_config

    from hackable_diffusion import train

    runs = {
        "uniform": tiny_text_config("uniform", steps=6),  # DiffusionGemma's recipe, MoE; checkpoints at 3 and 6
        "masking": tiny_text_config("masking", steps=2, moe=False),
        "none": tiny_text_config("none", steps=2, moe=False),  # the autoregressive baseline
    }
    runs["uniform"].eval.num_samples = 1  # the eval samples then share the end-of-run sample's compiled programs
    for name in ("masking", "none"):
        runs[name].train.eval_every = 0
        runs[name].train.checkpoint_every = 2
    for name, config in runs.items():
        workdir = root / name
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            train.run(config, str(workdir))
        (workdir / TRAIN_OUTPUT).write_text(output.getvalue())
    (root / "done").touch()


@pytest.fixture(scope="session")
def trained_text_runs(tmp_path_factory, worker_id):
    """{"uniform", "masking", "none"} -> a tiny trained text run directory, trained once per test run and shared by
    the xdist workers (the first one trains under a file lock, the others wait and reuse it). Read only: a test that
    writes into a run copies it first (`shutil.copytree`)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if worker_id != "master" else base) / "shared_text_runs"
    root.mkdir(parents=True, exist_ok=True)
    with open(root.parent / "shared_text_runs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (root / "done").exists():
                for partial in root.iterdir():
                    shutil.rmtree(partial, ignore_errors=True)
                _train_shared_runs(root)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return {name: root / name for name in ("uniform", "masking", "none")}
