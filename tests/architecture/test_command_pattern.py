"""One command pattern (docs/architecture.md, Conventions): every `python -m hackable_diffusion.NAME` module runs its
`define_flags` and `main` through `cli.run_command`, a package's through its `__main__.py` and `command.py`."""

import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "hackable_diffusion"
COMMANDS = ("train", "sample", "evaluate", "sft", "convert", "quantize", "rl", "distill", "serve")


def runnable_modules(package: pathlib.Path = PACKAGE) -> dict[str, pathlib.Path]:
    """Every module `python -m` can run: top-level modules with a `__main__` guard, and packages with `__main__.py`."""
    found = {p.stem: p for p in package.glob("*.py") if 'if __name__ == "__main__":' in p.read_text()}
    found.update({p.parent.name: p for p in package.glob("*/__main__.py")})
    return found


def test_every_command_runs_through_cli_run_command():
    modules = runnable_modules()
    assert sorted(modules) == sorted(COMMANDS), "a new command: add it to COMMANDS and docs/architecture.md"
    for name, path in modules.items():
        text = path.read_text()
        call = (
            "cli.run_command(command.define_flags, command.main, command.__doc__)"
            if path.name == "__main__.py"
            else ("cli.run_command(define_flags, main, __doc__)")
        )
        assert call in text, f"{path}: run the command with {call}"
        if path.name == "__main__.py":
            command = (path.parent / "command.py").read_text()
            assert "def define_flags(" in command and "def main(" in command, f"{path.parent}/command.py"
        else:
            assert "def define_flags(" in text and "def main(" in text, path
