"""Shared pytest setup: 8 simulated CPU devices for mesh tests, deterministic seeds, the hypothesis profiles, the
`slow` marker, and tiny text runs trained once per test run and shared by the end-to-end tests."""

import contextlib
import fcntl
import io
import os
import pathlib
import shutil
import sys
import tempfile

import pytest

# Must be set before jax initialises its backend: lets sharding tests build an 8-device mesh on a CPU. The tests run
# tiny programs, so most of their time is XLA compiling them. Two compile-time settings, each measured on the suite
# with two xdist workers of a 2-core CPU: without LLVM's optimisation passes (level 0) it ran in 914 s against
# 1,377 s at the default level; with XLA's MLIR fusion emitters off as well (the older elemental emitters compile a
# fusion in about half the time) it ran in 557 s against 888 s with them on, the same hour. Subprocesses inherit both.
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false",
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache per test run, shared by the xdist workers and every subprocess they start (the
# entry-point, notebook and multi-process tests compile the same tiny programs the in-process tests compile). The
# controller makes it fresh, so a run never reuses a previous run's programs, and removes it at the end. The commands
# (`cli.use_compilation_cache`) use JAX_COMPILATION_CACHE_DIR when HD_COMPILATION_CACHE is unset, so a command a test
# starts writes here too, never into the user's ~/.cache.
_OWN_CACHE = "PYTEST_XDIST_WORKER" not in os.environ and "HD_TEST_COMPILATION_CACHE" not in os.environ
if _OWN_CACHE:
    os.environ["HD_TEST_COMPILATION_CACHE"] = tempfile.mkdtemp(prefix="hd-test-jax-cache-")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ["HD_TEST_COMPILATION_CACHE"])
os.environ.pop("HD_COMPILATION_CACHE", None)  # a user's own setting would send the commands' programs elsewhere
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

# experiments/ holds experiment-only modules that tests check too (enumerable_toy, noise_level_analysis, the tooling)
for _folder in sorted((pathlib.Path(__file__).resolve().parents[1] / "experiments").iterdir()):  # topic folders
    if _folder.is_dir() and _folder.name != "__pycache__":
        sys.path.append(str(_folder))

import _hypothesis_profiles  # noqa: E402,F401  (registers and loads the `ci` / `thorough` profiles)
from _tiny_configs import TRAIN_OUTPUT  # noqa: E402


def pytest_unconfigure(config):
    if _OWN_CACHE:
        shutil.rmtree(os.environ["HD_TEST_COMPILATION_CACHE"], ignore_errors=True)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: trains, compiles large programs or runs subprocesses (deselect with -m 'not slow')"
    )


def _shared_run_config(name: str):
    from _tiny_configs import tiny_text_config

    if name == "uniform":  # DiffusionGemma's recipe, MoE; checkpoints at 3 and 6
        config = tiny_text_config("uniform", steps=6)
        config.eval.num_samples = 1  # the eval samples then share the end-of-run sample's compiled programs
        return config
    config = tiny_text_config(name, steps=2, moe=False)  # "masking", or "none": the autoregressive baseline
    config.train.eval_every = 0
    config.train.checkpoint_every = 2
    return config


class SharedTextRuns:
    """{"uniform", "masking", "none"} -> a tiny trained text run directory. A run is trained the first time a test
    asks for it, once per test run, and shared by the xdist workers: the first worker trains it under that run's own
    file lock, the others wait for that run only and reuse it."""

    NAMES = ("uniform", "masking", "none")

    def __init__(self, root: pathlib.Path):
        self.root = root

    def __getitem__(self, name: str) -> pathlib.Path:
        from hackable_diffusion import train

        if name not in self.NAMES:
            raise KeyError(f"no shared run {name!r}; runs: {self.NAMES}")
        workdir, done = self.root / name, self.root / f"{name}.done"
        with open(self.root / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not done.exists():
                    shutil.rmtree(workdir, ignore_errors=True)  # a partial run of a worker that died
                    output = io.StringIO()
                    with contextlib.redirect_stdout(output):
                        train.run(_shared_run_config(name), str(workdir))
                    (workdir / TRAIN_OUTPUT).write_text(output.getvalue())
                    done.touch()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return workdir


@pytest.fixture(scope="session")
def trained_text_runs(tmp_path_factory, worker_id):
    """`SharedTextRuns`: read only; a test that writes into a run copies it first (`shutil.copytree`)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if worker_id != "master" else base) / "shared_text_runs"
    root.mkdir(parents=True, exist_ok=True)
    return SharedTextRuns(root)
