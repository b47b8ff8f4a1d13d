"""An in-package import inside a function says why it is there (a comment on its line or just above its group):
the commands that load no jax before they run, and readers only some runs need. Anything else belongs at the top of
its module, where the import graph (`lint-imports`) and a reader see it."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "hackable_diffusion"


def unexplained_deferred_imports(root: pathlib.Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().split("\n")
        for function in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                if not (module or "").startswith("hackable_diffusion"):
                    continue
                above = node.lineno - 2  # the line above the group of imports this one belongs to
                while above >= 0 and (lines[above].strip().startswith(("from ", "import ")) or lines[above].strip()
                                      in (")",) or lines[above].strip().endswith(",")):  # fmt: skip
                    above -= 1
                if "#" not in lines[node.lineno - 1] and not lines[above].strip().startswith("#"):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {module}")
    return found


def test_every_deferred_in_package_import_says_why():
    assert unexplained_deferred_imports() == [], "hoist these to the module's top, or say in a comment why they wait"


def test_an_unexplained_one_is_caught(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(
        "def f():\n    from hackable_diffusion import cli\n\n\n"
        "def g():\n    # deferred: a reason\n    from hackable_diffusion import cli\n    from hackable_diffusion import recipes\n"
    )
    assert unexplained_deferred_imports(tmp_path / "pkg") == ["pkg/mod.py:2 hackable_diffusion"]
