"""The package's import layering (`[tool.importlinter]` in pyproject.toml), checked with import-linter.

models -> diffusion -> sampling -> training -> builders/recipes -> tasks -> saved configs -> checkpoints ->
experiment -> cli -> entry points: a module may import from its own layer and the layers below, never from one
above, and the entry points do not import each other. The second test shows the check can fail: a copy of the
package with one upward import is refused, naming the import.
"""

import pathlib
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("importlinter")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
LINT = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"]


def lint(repo: pathlib.Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the package in `repo` (found first on PYTHONPATH), with the contracts of `repo`'s
    pyproject.toml."""
    return subprocess.run(
        [*LINT, str(repo / "pyproject.toml"), "--no-cache"],
        cwd=repo,
        env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_package_keeps_its_import_layers():
    result = lint(REPO_ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "BROKEN" not in result.stdout and "KEPT" in result.stdout


def test_an_upward_import_breaks_the_layers(tmp_path):
    shutil.copytree(
        REPO_ROOT / "hackable_diffusion",
        tmp_path / "hackable_diffusion",
        ignore=shutil.ignore_patterns("files", "__pycache__"),
    )
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    upward = tmp_path / "hackable_diffusion" / "models" / "upward_import.py"
    upward.write_text(
        '"""A model module that reaches up into the tasks."""\n\nfrom hackable_diffusion.tasks import text\n'
    )
    result = lint(tmp_path)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout
    assert "hackable_diffusion.models.upward_import -> hackable_diffusion.tasks.text" in result.stdout
