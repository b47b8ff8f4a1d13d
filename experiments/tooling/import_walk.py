"""The package modules a command loads, and any import that climbs back up the layering while it runs.

  python experiments/tooling/import_walk.py                                  # the quickstart's train, 2 steps
  python experiments/tooling/import_walk.py -- -m hackable_diffusion.sample --help

Runs the command (default: `python -m hackable_diffusion.train --config configs/quickstart.py` for 2 steps in a
temporary workdir) in a fresh interpreter whose `__import__` records every import of a `hackable_diffusion` module by
another one, including the imports inside functions that run. At exit it prints one JSON line: the modules loaded
(files, not the packages' `__init__`), their lines, the count per package, and each import edge whose importer sits in
a lower layer than the module it imports, the layers being those of the import-linter contract in pyproject.toml
(models -> diffusion -> sampling -> training -> ... -> entry points). `lint-imports` checks the import statements;
this checks what a run actually walks through.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import subprocess
import sys
import tempfile
import tomllib

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "hackable_diffusion"

RECORDER = r"""
import atexit, builtins, json, sys
_edges, _real = set(), builtins.__import__
def _recording_import(name, globals=None, locals=None, fromlist=(), level=0):
    module = _real(name, globals, locals, fromlist, level)
    importer = (globals or {}).get("__name__", "")
    if importer.startswith("hackable_diffusion") and level == 0 and name.startswith("hackable_diffusion"):
        targets = [name] + [f"{name}.{f}" for f in (fromlist or ()) if f"{name}.{f}" in sys.modules]
        _edges.update((importer, t) for t in targets if t != importer)
    return module
builtins.__import__ = _recording_import
def _dump():
    loaded = {m: getattr(sys.modules[m], "__file__", None) for m in list(sys.modules) if m.startswith("hackable_diffusion")}
    with open(OUT, "w") as f:
        json.dump({"loaded": loaded, "edges": sorted(_edges)}, f)
atexit.register(_dump)
sys.argv = ARGV
import runpy
runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
"""


def layers() -> list[set[str]]:
    """The layers of the contract in pyproject.toml, highest first; each a set of top-level names."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    return [{name.strip() for name in layer.split("|")} for layer in contract["layers"]]


def layer_of(module: str, stack: list[set[str]]) -> int | None:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    return next((i for i, names in enumerate(stack) if top in names), None)


def walk(command: list[str]) -> dict:
    """Runs `command` (`-m MODULE ARGS...`) under the recorder; returns the loaded modules and the import edges."""
    if command[:1] != ["-m"] or len(command) < 2:
        raise SystemExit(f"error: the command must be `-m MODULE [ARGS...]`, got {command}.")
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "walk.json"
        argv = [command[1], *[a.replace("{tmp}", tmp) for a in command[2:]]]
        code = f"OUT = {str(out)!r}; ARGV = {argv!r}; MODULE = {command[1]!r}\n" + RECORDER
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
        if done.returncode or not out.exists():
            raise SystemExit(f"error: the command failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def summarise(record: dict, command: list[str]) -> dict:
    stack = layers()
    files = {m: f for m, f in record["loaded"].items() if f and not f.endswith("__init__.py")}
    lines = {m: len(pathlib.Path(f).read_text().splitlines()) for m, f in files.items()}
    per_package = collections.Counter(m.split(".")[1] if m.count(".") > 1 else "(top level)" for m in files)
    climbs = []
    for importer, target in record["edges"]:
        low, high = layer_of(importer, stack), layer_of(target, stack)
        if low is not None and high is not None and low > high:
            climbs.append({"importer": importer, "imports": target})
    return {
        "command": " ".join(["python", *command]),
        "modules": len(files),
        "lines": sum(lines.values()),
        "per_package": dict(sorted(per_package.items())),
        "climb_backs": climbs,
        "module_list": sorted(m.removeprefix(f"{PACKAGE}.") for m in files),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="*", help="after `--`: `-m MODULE ARGS...` ({tmp}: a temporary folder)")
    args = parser.parse_args()
    command = args.command or [
        "-m",
        f"{PACKAGE}.train",
        "--config",
        "configs/quickstart.py",
        "--workdir",
        "{tmp}/run",
        "--config.train.num_steps=2",
        "--config.optimizer.warmup_steps=1",
    ]
    print(json.dumps(summarise(walk(command), command)))


if __name__ == "__main__":
    main()
