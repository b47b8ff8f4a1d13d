"""Imports a script of `experiments/` (not a package) as a module, so that tests can call its functions."""

import importlib.util
import pathlib
import sys
import types


def load_experiment_script(name: str) -> types.ModuleType:
    path = pathlib.Path(__file__).resolve().parents[1] / "experiments" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module
