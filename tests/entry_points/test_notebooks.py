"""Runs the notebooks in colabs/ headless with nbclient, in quick mode (HD_NOTEBOOK_QUICK=1): a failing cell fails.

The kernel is the `python3` kernelspec of the running interpreter (ipykernel installs it into the venv, and
jupyter_client starts a kernelspec whose argv[0] is "python" with `sys.executable`), so the notebook imports the
same hackable_diffusion as the tests. Outputs go to a temporary folder (HD_NOTEBOOK_OUT), never to results/.
"""

import os
import pathlib
import re
import sys

import pytest
from _xla_flags import with_device_count

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
PLAYGROUND = REPO_ROOT / "colabs" / "sampler_playground.ipynb"
CELL_TIMEOUT_S = 600  # per cell; generous because the machine running the suite may be shared


def kernel_env(out_dir: pathlib.Path) -> dict[str, str]:
    env = dict(
        os.environ,
        HD_NOTEBOOK_QUICK="1",
        HD_NOTEBOOK_OUT=str(out_dir),
        MPLBACKEND="module://matplotlib_inline.backend_inline",
    )  # plots inline even if MPLBACKEND=Agg
    # conftest.py simulates 8 CPU devices for the mesh tests; the notebook runs as a user would, on one device.
    flags = with_device_count(env.get("XLA_FLAGS", ""), None)
    if flags:
        env["XLA_FLAGS"] = flags
    else:
        env.pop("XLA_FLAGS", None)
    return env


def test_python3_kernel_is_this_interpreter():
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    assert spec.argv[0] in ("python", "python3", sys.executable), (
        f"the python3 kernelspec at {spec.resource_dir} runs {spec.argv[0]!r}, not this interpreter"
    )


def test_notebook_is_stored_without_outputs():
    nb = nbformat.read(PLAYGROUND, as_version=4)
    nbformat.validate(nb)
    dirty = [
        i
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)
    ]
    assert not dirty, f"clear the outputs of cells {dirty} before saving {PLAYGROUND.name}"


@pytest.mark.slow
def test_sampler_playground_runs_headless(tmp_path):
    nb = nbformat.read(PLAYGROUND, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(REPO_ROOT)}}
    )
    client.execute(env=kernel_env(tmp_path))  # raises CellExecutionError on the first failing cell

    text = "\n".join(
        out.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if out.output_type == "stream"
    )
    assert "QUICK=True" in text

    plot = tmp_path / "sampler_playground.png"
    assert plot.is_file() and plot.read_bytes().startswith(b"\x89PNG"), "the notebook did not save its plot"
    assert any(
        "image/png" in out.get("data", {}) for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
    ), "the plot was not shown inline"

    table = (tmp_path / "sampler_playground.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| setting")]
    settings = [row.split("|")[1].strip() for row in rows]
    assert settings[-1].startswith("true continuation")
    assert {"entropy_bound(gamma=0.1)", "threshold(tau=0.9)", "top_k_confidence, 4 steps"} <= set(settings)
    for row in rows:
        bpc = float(row.split("|")[6].split("±")[0])
        assert 0 < bpc < 40, row  # finite bits per character

    # The step-by-step view starts fully masked and ends with no mask left ("_" never occurs in Shakespeare).
    step_line = re.compile(r"^\s*\d+ \((\s*\d+ masked|\+\s*\d+ decided)\) (.*)$")
    canvases = [m.group(2) for m in map(step_line.match, text.splitlines()) if m]
    assert len(canvases) >= 2 and canvases[0] == "_" * len(canvases[0])
    assert "_" not in canvases[-1]
