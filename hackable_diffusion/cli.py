"""Command-line helpers shared by `train`, `sample` and `evaluate`: config overrides checked before absl parses them.

ml_collections reports a misspelt `--config.a.b=...` override with a traceback from deep inside flag parsing; here an
unknown key stops the command with one line naming the key and the closest existing keys.
"""

from __future__ import annotations

import datetime
import difflib
import importlib.util
import json
import pathlib
import sys
from typing import Sequence

import ml_collections


class ConfigKeyError(ValueError):
    """An override names a config key that does not exist."""


def load_config_file(path: str) -> ml_collections.ConfigDict:
    """Imports a config file and calls its `get_config()` (the same contract as ml_collections' config flags)."""
    spec = importlib.util.spec_from_file_location("_hd_config", path)
    if spec is None or not pathlib.Path(path).is_file():
        raise FileNotFoundError(f"Config file {path!r} not found.")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def flat_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in config.items():
        name = f"{prefix}{key}"
        keys.append(name)
        if isinstance(value, ml_collections.ConfigDict):
            keys.extend(flat_keys(value, name + "."))
    return keys


def check_overrides(config: ml_collections.ConfigDict, argv: Sequence[str], flag: str = "config") -> None:
    """Raises ConfigKeyError for the first `--config.KEY=...` whose KEY is not in `config`."""
    valid = flat_keys(config)
    valid_set = set(valid)
    for arg in argv:
        if not arg.startswith(f"--{flag}."):
            continue
        key = arg[len(flag) + 3 :].split("=", 1)[0]
        if key not in valid_set:
            close = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
            hint = f" Closest existing keys: {', '.join(close)}." if close else ""
            raise ConfigKeyError(f"Unknown config key {key!r} in {arg!r}.{hint}")


def precheck_argv(argv: Sequence[str], flag: str = "config") -> None:
    """Before `app.run`: validates overrides against the config file named by `--config`; exits 2 on an error."""
    path = None
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{flag}="):
            path = arg.split("=", 1)[1]
        elif arg == f"--{flag}" and i + 1 < len(argv):
            path = argv[i + 1]
    if path is None:
        return
    try:
        check_overrides(load_config_file(path.split(":", 1)[0]), argv, flag)
    except (ConfigKeyError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


CONFIG_CHANGES_FILE = "config_changes.jsonl"
_ABSENT = "<absent>"


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def config_changes(saved: dict, current: dict) -> dict[str, tuple]:
    """Dotted key -> (saved value, current value) for every leaf that differs; a missing side reads "<absent>"."""
    before, after = _flatten(saved), _flatten(current)
    return {
        key: (before.get(key, _ABSENT), after.get(key, _ABSENT))
        for key in sorted(before.keys() | after.keys())
        if before.get(key, _ABSENT) != after.get(key, _ABSENT)
    }


def save_config(config: ml_collections.ConfigDict, path: pathlib.Path) -> dict[str, tuple]:
    """Writes `config` to `path` (JSON); returns what changed against the config already saved there.

    Rerunning a workdir with overrides (e.g. a longer `train.num_steps` to continue a run) replaces config.json, so
    that the saved config describes the run from now on; the keys that changed, with their old and new values, are
    printed and appended to `config_changes.jsonl` beside it, so the run's history is not lost.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # Round-trip through JSON so that tuples, numpy scalars etc. compare as they are stored.
    current = json.loads(json.dumps(config.to_dict(), sort_keys=True, default=str))
    changes = {}
    if path.is_file():
        changes = config_changes(json.loads(path.read_text()), current)
        if changes:
            lines = "\n".join(f"  {key}: {old!r} -> {new!r}" for key, (old, new) in changes.items())
            print(
                f"{path} exists and this config differs from it in {len(changes)} key(s); saving the new one and "
                f"recording the change in {path.parent / CONFIG_CHANGES_FILE}:\n{lines}",
                flush=True,
            )
            record = {
                "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "changes": {key: [old, new] for key, (old, new) in changes.items()},
            }
            with open(path.parent / CONFIG_CHANGES_FILE, "a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
    path.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    return changes


def load_saved_config(workdir: str) -> ml_collections.ConfigDict:
    path = pathlib.Path(workdir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: is {workdir!r} a training workdir (python -m hackable_diffusion.train "
            "writes config.json there)?"
        )
    config = ml_collections.ConfigDict(json.loads(path.read_text()))
    # Sampler keys added after a run was trained (inference-only settings) take base_config's defaults, which are
    # chosen to reproduce how samplers behaved before the key existed (score_temperature 0: score the sampling logits).
    from hackable_diffusion import recipes

    if "sampler" in config:
        for key, value in recipes.base_config().sampler.items():
            if key not in config.sampler:
                config.sampler[key] = value
    return config


def quiet_library_logs():
    """orbax/grain/jax log every checkpoint step at INFO through absl; keep warnings and our own prints."""
    import logging

    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)
    for name in ("orbax", "jax", "grain", "absl"):
        logging.getLogger(name).setLevel(logging.WARNING)
