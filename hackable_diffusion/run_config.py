"""The config a run saves in its directory: written once per run (`config.json`), its changes kept, read back upgraded.

Every command after `train` (sample, evaluate, sft, quantize, convert, the lm-eval adapter) rebuilds a run from
`workdir/config.json`, so sampling and evaluation use exactly the model shape, process and tokenizer that training
used. Rerunning a workdir with other overrides replaces config.json and appends the changed keys to
`config_changes.jsonl`; a config saved by an older version of the toolbox is brought to the current keys on load.
A config of another run (another task, other text data for the saved tokenizer, another model shape) is refused
before anything is written (`check_same_run`): rerunning a workdir continues its run, it never turns it into another.
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


class RunMismatchError(ValueError):
    """The config describes another run than the one the workdir holds (bad input, reported on one line)."""


def _data_keys(config: ml_collections.ConfigDict) -> dict:
    """The data settings a run's saved tokenizer and data were made with (text: the corpus, the tokenizer and the
    share of the training split)."""
    d = config.get("data", {})
    keys = {"task": d.get("task", "text")}
    if keys["task"] == "text":
        keys.update(corpus=d.get("corpus"), tokenizer=d.get("tokenizer"), vocab_size=d.get("vocab_size", 0) or 0)
        keys.update(train_fraction=float(d.get("train_fraction", 1.0)))
    return keys


def _param_shapes(config: ml_collections.ConfigDict) -> dict[str, tuple[int, ...]]:
    """Parameter path -> shape of the model `config` describes, with one stand-in vocabulary for every run (the
    vocabulary of a run comes from its tokenizer); nothing is initialised."""
    import jax

    # deferred: cli reads this module and loads no jax (test_light_imports.py)
    from hackable_diffusion import builders
    from hackable_diffusion.models import transformer as T

    model = builders.build_model(config, 256)
    shapes = jax.eval_shape(lambda key: T.init_params(model, key), jax.random.key(0))
    return {jax.tree_util.keystr(path): tuple(x.shape) for path, x in jax.tree_util.tree_leaves_with_path(shapes)}


def check_same_run(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> None:
    """Raises RunMismatchError when `workdir` holds a run (a config.json) that `config` would not continue: another
    task, other text data than its saved tokenizer was made with, or another model shape (parameter shapes, whatever
    the vocabulary). Reads only, so that a refused command leaves the workdir byte for byte as it was; a workdir
    without config.json passes."""
    path = pathlib.Path(workdir) / "config.json"
    if not path.is_file():
        return
    saved = load_saved_config(str(workdir))
    before, after = _data_keys(saved), _data_keys(config)
    if before["task"] != after["task"]:
        raise RunMismatchError(
            f"{workdir} holds a {before['task']} run; this config trains {after['task']}: use another --workdir "
            "(or that run's own config to continue it)."
        )
    differing = [k for k in before if before[k] != after.get(k)]
    if differing:
        shown = ", ".join(f"data.{k}: {before[k]!r} there, {after.get(k)!r} here" for k in differing)
        raise RunMismatchError(
            f"{workdir} holds a run trained on other data ({shown}); its tokenizer and checkpoints are that data's: "
            "use another --workdir (or that run's own data settings to continue it)."
        )
    if "model" not in saved or _param_shapes(saved) == _param_shapes(config):
        return
    changes = config_changes(saved.model.to_dict(), config.model.to_dict())
    changes.pop("vocab_size", None)
    listed = list(changes.items())
    shown = ", ".join(f"model.{k}: {old!r} there, {new!r} here" for k, (old, new) in listed[:4])
    shown += ", ..." if len(listed) > 4 else ""
    raise RunMismatchError(
        f"{workdir} holds a run of another model shape ({shown or 'other parameter shapes'}); its checkpoints do not "
        "fit this config: use another --workdir (or that run's own config to continue it)."
    )


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
    (`recipes.upgrade_saved_sampler`), a schedule saved as a name with `diffusion.schedule_eps` becomes the schedule
    section (`recipes.upgrade_saved_diffusion`), the RL objectives' flat keys become their sections
    (`upgrade_saved_rl`), `init.use_ema` becomes `init.weights`; model fields a run saved before they were spelled out
    take their defaults."""
    # deferred: cli reads this module and loads no jax (test_light_imports.py)
    from hackable_diffusion import recipes
    from hackable_diffusion.tasks import get_task

    if "data" in config and "sampler" in config:
        get_task(config.data.get("task", "text")).upgrade_saved_config(config)
    if "sampler" in config:
        recipes.upgrade_saved_sampler(config)
    if "diffusion" in config:
        recipes.upgrade_saved_diffusion(config)
    if "rl" in config:
        upgrade_saved_rl(config)
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

        # deferred: cli reads this module and loads no jax (test_light_imports.py)
        from hackable_diffusion.models.config import TransformerConfig

        for field in dataclasses.fields(TransformerConfig):
            if field.name not in config.model and field.default not in (dataclasses.MISSING, None):
                config.model[field.name] = field.default


SAVED_RL_KEYS = {  # a flat config.rl key of an older run -> the objective sections (and key) that now hold it
    "clip_eps": (("diffu_grpo", "ar_grpo"), "clip_eps"),
    "wd1_psi": (("wd1",), "psi"),
    "wd1_negative_weight": (("wd1",), "negative_weight"),
    "wd1_zero_tied_groups": (("wd1",), "zero_tied_groups"),
    "elbo_draws": (("elbo", "expert_iteration"), "draws"),  # the two objectives shared the key
}


def upgrade_saved_rl(config: ml_collections.ConfigDict) -> None:
    """Moves the flat `config.rl` keys of a run saved before each RL objective had its section into those sections
    (in place; the value is kept, so the run's objective reads what it trained with)."""
    rl = config.rl.to_dict()
    for key, (sections, field) in SAVED_RL_KEYS.items():
        if key in rl:
            value = rl.pop(key)
            for section in sections:
                rl.setdefault(section, {})[field] = value
    with config.unlocked():
        config.rl = ml_collections.ConfigDict(rl)
