"""Runs every notebook in colabs/ headless with nbclient, in quick mode (HD_NOTEBOOK_QUICK=1): a failing cell fails, and
each notebook's own check reads what it produced (the pictures it saved and showed inline, its table, key printed lines).

The kernel is the `python3` kernelspec of the running interpreter (ipykernel installs it into the venv, and
jupyter_client starts a kernelspec whose argv[0] is "python" with `sys.executable`), so the notebook imports the
same hackable_diffusion as the tests. Outputs go to a temporary folder (HD_NOTEBOOK_OUT) and runs to another
(HD_NOTEBOOK_WORKDIR), never to results/ or runs/. A notebook that trains is then run a second time, up to its
train-or-load cell, on the same run directory: as for a user reopening it, it must load the checkpoint it trained.
Every notebook is stored without outputs and starts with the cell that installs the package on a fresh runtime.
"""

import builtins
import itertools
import os
import pathlib
import re
import sys
import time

import pytest
from _xla_flags import with_device_count

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO_ROOT / "colabs").glob("*.ipynb"))
CELL_TIMEOUT_S = 600  # per cell; generous because the machine running the suite may be shared
LOADED = "Loaded the checkpoint"  # what a train-or-load cell prints when it loads instead of training


def kernel_env(out_dir: pathlib.Path, workdir: pathlib.Path) -> dict[str, str]:
    env = dict(
        os.environ,
        HD_NOTEBOOK_QUICK="1",
        HD_NOTEBOOK_OUT=str(out_dir),
        HD_NOTEBOOK_WORKDIR=str(workdir),
        MPLBACKEND="module://matplotlib_inline.backend_inline",
    )  # plots inline even if MPLBACKEND=Agg
    # conftest.py simulates 8 CPU devices for the mesh tests; the notebook runs as a user would, on one device.
    flags = with_device_count(env.get("XLA_FLAGS", ""), None)
    if flags:
        env["XLA_FLAGS"] = flags
    else:
        env.pop("XLA_FLAGS", None)
    return env


def execute(path: pathlib.Path, out_dir: pathlib.Path, workdir: pathlib.Path, *, cells: int | None = None):
    """Runs the notebook (its first `cells` cells if given) and returns it with its outputs."""
    nb = nbformat.read(path, as_version=4)
    if cells is not None:
        nb.cells = nb.cells[:cells]
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(REPO_ROOT)}}
    )
    client.execute(env=kernel_env(out_dir, workdir))  # raises CellExecutionError on the first failing cell
    return nb


def printed(nb) -> str:
    return "\n".join(
        out.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if out.output_type == "stream"
    )


def inline_images(nb) -> int:
    return sum(
        "image/png" in out.get("data", {}) for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
    )


def assert_png(path: pathlib.Path):
    assert path.is_file() and path.read_bytes().startswith(b"\x89PNG"), f"the notebook did not save {path.name}"


def table_rows(path: pathlib.Path) -> list[list[str]]:
    """The body rows of the markdown table in `path` (no header, no separator), as lists of stripped cells."""
    lines = [line for line in path.read_text().splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines[1:]]


# ----------------------------------------------------------------------------------------------------------------
# What each notebook must produce (in quick mode).


def check_sampler_playground(out: pathlib.Path, text: str, nb):
    assert_png(out / "sampler_playground.png")
    assert inline_images(nb) >= 1, "the plot was not shown inline"
    table = (out / "sampler_playground.md").read_text()
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


def check_training(out: pathlib.Path, text: str, nb):
    assert_png(out / "training_curve.png")
    assert inline_images(nb) >= 1, "the training curve was not shown inline"
    assert "checkpoints at steps [2, 4, 6]" in text  # quick mode: 6 steps, a checkpoint every 2, all kept
    curve = re.search(
        r"(\d+) train records, (\d+) eval records; last train bound ([\d.]+), last held-out bound ([\d.]+)", text
    )
    assert curve, "the curve cell did not report what it read from metrics.jsonl"
    assert int(curve.group(1)) == 6 and int(curve.group(2)) == 3  # log_every 1, an evaluation at every checkpoint
    assert 0 < float(curve.group(3)) < 20 and 0 < float(curve.group(4)) < 20
    rows = table_rows(out / "training_samples.md")
    assert [int(row[0]) for row in rows] == [2, 4, 6]  # one row per checkpoint, in step order
    for row in rows:
        assert 0 < float(row[1]) < 20, row  # the held-out bound at that step
        assert all(len(cell.strip("`")) >= 8 for cell in row[2:]), row  # a canvas of text per prompt


def check_sudoku(out: pathlib.Path, text: str, nb):
    assert_png(out / "sudoku_passes.png")
    assert_png(out / "sudoku_compare.png")
    assert inline_images(nb) >= 2, "the pictures were not shown inline"
    # The grid fills in pass by pass: the blanks only go down, to none.
    blanks = [int(m.group(1)) for m in re.finditer(r"^pass +\d+: .*?(\d+) blanks", text, flags=re.MULTILINE)]
    assert len(blanks) == 7 and blanks[-1] == 0, blanks  # the puzzle, then 6 passes
    assert all(a >= b for a, b in itertools.pairwise(blanks)), blanks
    rows = {row[0]: row[1:] for row in table_rows(out / "sudoku_compare.md")}
    assert set(rows) == {"sampler", "sampler + rules", "search", "search, rules only"}
    for name, (exact, passes, max_passes, network, _) in rows.items():
        assert 0 <= float(exact) <= 100, name
        assert 0 <= float(passes) <= int(max_passes), name
    assert float(rows["sampler"][1]) == 6.0  # the sampler spends its num_steps
    assert int(rows["search"][2]) <= 24 and int(rows["search, rules only"][2]) <= 24  # within the pass budget
    assert float(rows["search, rules only"][3]) == 0.0  # no model call when the rules alone steer


def check_hf_checkpoint(out: pathlib.Path, text: str, nb):
    assert_png(out / "hf_decoder_windows.png")
    assert_png(out / "hf_selection_rules.png")
    assert inline_images(nb) >= 2, "the pictures were not shown inline"
    assert "tests/fixtures/hf_diffusiongemma (the tiny fixture)" in text  # quick mode never looks for the real model
    assert "per_token and cache_tail loads hold identical weights: True" in text
    for line in ("hidden_size", "embed_dim = 32"), ("sliding_window", "sliding_window = 6"), ("top_k_experts", "= 2"):
        assert any(line[0] in row and line[1] in row for row in text.splitlines()), line
    gaps = dict(re.findall(r"^(narrow|wide) window .* = ([\d.e+-]+)$", text, flags=re.MULTILINE))
    assert float(gaps["narrow"]) > 1.0  # the window is shorter than prompt + canvas: the conventions differ
    assert float(gaps["wide"]) < 1e-4  # a window over everything: they agree
    rows = table_rows(out / "hf_checkpoint.md")
    rules = ("entropy_bound(gamma=0.1)", "threshold(tau=0.9)", "top_k_confidence, 4 steps")
    # quick mode: every rule under cache_tail, DiffusionGemma's entropy bound under per_token too
    assert [(row[0], row[1]) for row in rows] == [
        (rules[0], "cache_tail"),
        (rules[0], "per_token"),
        (rules[1], "cache_tail"),
        (rules[2], "cache_tail"),
    ]
    for rule, convention, steps, calls, _, _, same in rows:
        assert 1 <= float(steps) <= 8 and int(calls) >= float(steps) + 2, (rule, convention)  # + prefill, commit
        assert float(same) == 1.0 if convention == "cache_tail" else 0.0 <= float(same) <= 1.0


def check_rl_playground(out: pathlib.Path, text: str, nb):
    assert_png(out / "rl_reward_curve.png")
    assert_png(out / "rl_before_after.png")
    assert inline_images(nb) >= 2, "the pictures were not shown inline"
    curve = re.search(r"(\d+) train records; first reward ([\d.]+), last reward ([\d.]+)", text)
    assert curve, "the curve cell did not report what it read from metrics.jsonl"
    assert int(curve.group(1)) == 6  # quick mode: 6 RL steps, a record at every step
    assert all(0.0 <= float(curve.group(i)) <= 1.0 for i in (2, 3)), curve.group(0)  # finite: "nan" does not match
    rows = {row[0]: row[1:] for row in table_rows(out / "rl_before_after.md")}
    assert list(rows) == ["before RL", "after RL"], rows
    for name, (exact, blank_accuracy, reward) in rows.items():
        assert 0 <= float(exact) <= 100 and 0 <= float(blank_accuracy) <= 100, name
        assert 0 <= float(reward) <= 1, name


CHECKS = {
    "sampler_playground": check_sampler_playground,
    "training": check_training,
    "sudoku": check_sudoku,
    "hf_checkpoint": check_hf_checkpoint,
    "rl_playground": check_rl_playground,
}


# ----------------------------------------------------------------------------------------------------------------
# Tests.


def test_python3_kernel_is_this_interpreter():
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    assert spec.argv[0] in ("python", "python3", sys.executable), (
        f"the python3 kernelspec at {spec.resource_dir} runs {spec.argv[0]!r}, not this interpreter"
    )


def test_every_notebook_has_its_checks():
    assert set(CHECKS) == {path.stem for path in NOTEBOOKS}, "add the checks of a new notebook to CHECKS"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [
        i
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)
    ]
    assert not dirty, f"clear the outputs of cells {dirty} before saving {path.name}"


class FakeShell:
    """Stands for IPython in the install cell: records `!` commands and `%` magics with their {names} expanded, and
    makes the clone that `git clone` would make."""

    def __init__(self, namespace: dict):
        self.namespace, self.calls = namespace, []

    def system(self, command: str):
        command = command.format_map(self.namespace)
        self.calls.append(("system", command))
        if command.startswith("git clone"):
            checkout = pathlib.Path(command.split()[-1])
            (checkout / "hackable_diffusion").mkdir(parents=True)
            (checkout / "pyproject.toml").write_text("")

    def run_line_magic(self, name: str, line: str):
        self.calls.append((name, line.format_map(self.namespace)))


def run_install_cell(source: str, *, installed: bool) -> tuple[dict, FakeShell]:
    """Executes the install cell as IPython would run it; `installed=False`: `import hackable_diffusion` fails until
    the cell has called pip, as on a fresh runtime."""
    from IPython.core.inputtransformer2 import TransformerManager

    code = compile(TransformerManager().transform_cell(source), "install cell", "exec")
    real_import = builtins.__import__
    namespace = {}
    shell = FakeShell(namespace)

    def fake_import(name, *args, **kwargs):
        if name == "hackable_diffusion" and not installed and not any(call[0] == "pip" for call in shell.calls):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    namespace.update(__builtins__={**vars(builtins), "__import__": fake_import}, get_ipython=lambda: shell)
    exec(code, namespace)  # noqa: S102  (the cell's own code, as the kernel would run it)
    return namespace, shell


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_first_code_cell_installs_the_package_only_when_it_is_missing(path, tmp_path, monkeypatch):
    nb = nbformat.read(path, as_version=4)
    source = next(cell.source for cell in nb.cells if cell.cell_type == "code")
    assert "import hackable_diffusion" in source and "except ImportError:" in source and "%pip install" in source

    # Where the package imports (this checkout, the test suite): nothing is run, nothing changes.
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    namespace, shell = run_install_cell(source, installed=True)
    assert shell.calls == [] and namespace["hackable_diffusion"].__name__ == "hackable_diffusion"
    assert pathlib.Path.cwd() == tmp_path

    # A fresh runtime outside a clone: without a URL it says what to set; with one it clones, installs the clone
    # (with the Hugging Face extra) and makes it the working directory.
    monkeypatch.delenv("HD_GIT_URL", raising=False)
    with pytest.raises(RuntimeError, match="HD_GIT_URL"):
        run_install_cell(source, installed=False)
    monkeypatch.setenv("HD_GIT_URL", "https://example.invalid/hackable_diffusion.git")
    namespace, shell = run_install_cell(source, installed=False)
    checkout = tmp_path / "hackable_diffusion_repo"
    assert shell.calls[0] == (
        "system",
        f"git clone -q --depth 1 https://example.invalid/hackable_diffusion.git {checkout}",
    )
    assert shell.calls[1][0] == "pip" and f'-e "{checkout}[hf' in shell.calls[1][1]
    assert pathlib.Path.cwd() == checkout and sys.path[0] == str(checkout)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_headless(path, tmp_path):
    out, workdir = tmp_path / "out", tmp_path / "workdir"
    start = time.perf_counter()
    nb = execute(path, out, workdir)
    print(f"{path.name}: {time.perf_counter() - start:.1f} s in quick mode")
    text = printed(nb)
    assert "QUICK=True" in text
    CHECKS[path.stem](out, text, nb)

    # Run again on the same run directory, up to the cell that trains or loads: it must load the checkpoint (a config
    # read back from config.json used to differ from the notebook's in fields filled with their defaults on loading).
    train_cell = next((i for i, cell in enumerate(nb.cells) if LOADED in cell.source), None)
    if train_cell is not None:
        assert LOADED not in text and "Trained" in text, "the first run should have trained"
        again = printed(execute(path, tmp_path / "out_again", workdir, cells=train_cell + 1))
        assert LOADED in again and "Trained" not in again, again[-2000:]
