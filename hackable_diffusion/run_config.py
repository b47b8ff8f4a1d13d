"""The config a run saves in its directory: written once per run (`config.json`), its changes kept, read back upgraded.

Every command after `train` (sample, evaluate, sft, quantize, convert, the lm-eval adapter) rebuilds a run from
`workdir/config.json`, so sampling and evaluation use exactly the model shape, process and tokenizer that training
used. Rerunning a workdir with other overrides replaces config.json and appends the changed keys to
`config_changes.jsonl`; a config saved by an older version of the toolbox is brought to the current keys on load.
"""

from __future__ import annotations

import datetime
import json
import pathlib

import ml_collections

from hackable_diffusion.data import safe_files

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
    config = ml_collections.ConfigDict(safe_files.read_json(path, "repair it, or restore it from a copy of the run"))
    upgrade_saved_config(config)
    return config


def upgrade_saved_config(config: ml_collections.ConfigDict) -> None:
    """Brings a config saved by an older version of the toolbox to the current keys (in place): the task moves its
    own keys first (`tasks.Task.upgrade_saved_config`), then the sampler section is restructured
    (`recipes.upgrade_saved_sampler`), `init.use_ema` becomes `init.weights`; model fields a run saved before they were spelled out take their defaults."""
    from hackable_diffusion import recipes
    from hackable_diffusion.tasks import get_task

    if "data" in config and "sampler" in config:
        get_task(config.data.get("task", "text")).upgrade_saved_config(config)
    if "sampler" in config:
        recipes.upgrade_saved_sampler(config)
    if "init" in config and "use_ema" in config.init:  # the EMA choice is spelt `weights` ("ema" | "raw") everywhere
        init = config.init.to_dict()
        init["weights"] = "ema" if init.pop("use_ema") else "raw"
        with config.unlocked():
            config.init = ml_collections.ConfigDict(init)
    if "model" in config and "grid_embeddings" in config.model:  # the grid prior is now a task's structure prior
        model = config.model.to_dict()
        side, bias = int(model.pop("grid_embeddings") or 0), float(model.pop("grid_attention_bias", 0.0) or 0.0)
        model.update(structure=f"grid:{side}" if side else "", structure_embeddings=bool(side))
        model["structure_attention_bias"] = bias
        with config.unlocked():
            config.model = ml_collections.ConfigDict(model)
    if "model" in config:  # model fields a run saved before they were spelled out take their (training-time) default
        import dataclasses

        from hackable_diffusion.models.config import TransformerConfig

        for field in dataclasses.fields(TransformerConfig):
            if field.name not in config.model and field.default not in (dataclasses.MISSING, None):
                config.model[field.name] = field.default
