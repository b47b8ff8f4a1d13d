"""The commands' modules import no jax: `--help`, a flag error or a missing workdir answers in a tenth of a second
instead of the seconds jax takes to load, which is why their in-package imports sit inside the functions that run."""

import subprocess
import sys

import pytest

LIGHT = (
    "hackable_diffusion.cli",
    "hackable_diffusion.run_config",
    "hackable_diffusion.evaluate",
    "hackable_diffusion.convert",
    "hackable_diffusion.sample",
    "hackable_diffusion.quantize",
    "hackable_diffusion.serve.command",
    "hackable_diffusion.evals.harness",
)


@pytest.mark.parametrize("module", LIGHT)
def test_the_command_module_loads_no_jax(module):
    code = f"import sys, {module}; print(sorted(m for m in ('jax', 'flax', 'numba') if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", f"importing {module} loaded {loaded}"
