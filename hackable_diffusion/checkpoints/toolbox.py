"""The toolbox's own checkpoints: a training run's orbax steps and the params directories fine-tuning writes.

`load_params(exp, workdir)` reads a run's latest (or a given) step onto one device, the EMA weights when the run kept
them; it is the one call every command uses, so a run quantized to FP8 (`quantized_runs`) or made from a Hugging Face
checkpoint (`hf_runs`) is read from where its weights really are. `load_toolbox_params` reads one params subtree of a
step as numpy arrays without building the train state (what fine-tuning starts from); `save_params` /
`load_params_directory` write and read a bare params tree (the `fused_params` of an SFT run).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from hackable_diffusion import builders
from hackable_diffusion.checkpoints.trees import tree_metadata
from hackable_diffusion.models import lora as lora_lib
from hackable_diffusion.models import transformer as T
from hackable_diffusion.training import checkpointing, optimizers
from hackable_diffusion.training.train_state import TrainState

PyTree = Any
WEIGHTS = ("ema", "raw")  # which weights of a run: its EMA when it kept one, or the trained weights
FUSED_DIR = "fused_params"  # the fused weights an SFT run writes (init kind "params" reads them)

if TYPE_CHECKING:
    from hackable_diffusion.experiment import Experiment


def check_weights(weights: str) -> None:
    if weights not in WEIGHTS:
        raise ValueError(f"weights={weights!r} must be one of {WEIGHTS} (ema: the EMA when the run kept one).")


def load_params(exp: Experiment, workdir: str, *, weights: str = "ema", step: int | None = None):
    """Parameters of the latest (or given) checkpoint in `workdir/checkpoints`, on the default device.

    Returns (params, step). `weights="ema"`: the EMA parameters when the run kept them; "raw": the trained ones.
    """
    check_weights(weights)
    config = exp.config
    if exp.model.cfg.weight_dtype is not None:  # a run written by `python -m hackable_diffusion.quantize`
        from hackable_diffusion.checkpoints import quantized_runs  # deferred: read by quantized runs alone

        return quantized_runs.load_quantized_run(workdir, exp.model.cfg.weight_dtype)
    trained_here = (pathlib.Path(workdir) / "checkpoints").is_dir()
    if config.get("init", {}).get("kind") == "hf" and not trained_here:  # `hf:DIR` as a run: its weights
        from hackable_diffusion.checkpoints import hf as hf_ckpt  # deferred: read by Hugging Face runs alone

        return hf_ckpt.load_hf(config.init.checkpoint, dtype=exp.model.cfg.param_dtype).params, 0
    adapter = builders.build_adapter(config) if "lora" in config else None  # a LoRA run holds {base, lora}
    mask = None
    if adapter is not None:
        mask = lora_lib.trainable_mask
    elif "lora" in config and config.lora.get("freeze_router", False):
        mask = lora_lib.router_frozen_mask
    optimizer = optimizers.make_optimizer(builders.optimizer_config(config), mask)
    with_ema = config.train.ema_decay > 0

    def create():
        params = T.init_params(exp.model, jax.random.key(0))
        if adapter is not None:
            params = lora_lib.init_state(adapter, params, jax.random.key(0))
        return TrainState.create(params, optimizer, jax.random.key(0), use_ema=with_ema)

    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), jax.eval_shape(create))
    ckpt = checkpointing.Checkpointer(str(pathlib.Path(workdir) / "checkpoints"), async_save=False)
    try:
        if step is None:
            restored = ckpt.restore_latest(abstract)
            if restored is None:
                raise FileNotFoundError(
                    f"No checkpoint in {workdir}/checkpoints: train first with python -m "
                    f"hackable_diffusion.train --config ... --workdir {workdir}."
                )
            state, step = restored
        else:
            step = _existing_step(pathlib.Path(workdir) / "checkpoints", int(step))
            state = ckpt.restore(step, abstract)
    finally:
        ckpt.close()
    params = state.ema_params if (weights == "ema" and state.ema_params is not None) else state.params
    if adapter is not None:  # the fused weights: what the run's model computes
        params = jax.jit(adapter.merge)(params[lora_lib.BASE_KEY], params[lora_lib.LORA_KEY])
    return params, int(step)


def _step_dirs(checkpoints: pathlib.Path) -> list[int]:
    if not checkpoints.is_dir():
        return []
    return sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit() and (p / "state").is_dir())


def _existing_step(checkpoints: pathlib.Path, step: int) -> int:
    """`step` if `checkpoints` holds it complete, else an error that names the steps it holds."""
    steps = _step_dirs(checkpoints)
    if step not in steps:
        raise ValueError(f"Checkpoint step {step} not found in {str(checkpoints)!r}; available: {steps}.")
    return step


def load_toolbox_params(
    path: str | os.PathLike, *, weights: str = "ema", step: int | None = None
) -> tuple[PyTree, int]:
    """(params as numpy arrays, step) of a toolbox run's checkpoint (the EMA params for `weights="ema"` when kept).

    `path` is a training workdir or its `checkpoints/` folder; `step=None` takes the latest complete step.
    """
    check_weights(weights)
    path = pathlib.Path(path)
    checkpoints = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    steps = _step_dirs(checkpoints)
    if not steps:
        raise ValueError(
            f"No toolbox checkpoint in {str(path)!r} (looked for step folders with a 'state' item in "
            f"{str(checkpoints)!r}); train with hackable_diffusion.train first or fix init.checkpoint."
        )
    step = steps[-1] if step is None else _existing_step(checkpoints, int(step))
    item = (checkpoints / str(step) / "state").absolute()
    checkpointer = ocp.PyTreeCheckpointer()
    metadata = tree_metadata(item)
    key = "ema_params" if weights == "ema" and metadata.get("ema_params") else "params"
    if isinstance(metadata[key], Mapping) and set(metadata[key]) == {lora_lib.BASE_KEY, lora_lib.LORA_KEY}:
        raise ValueError(
            f"{str(path)!r} is a LoRA fine-tuning run (its params are {{'base', 'lora'}}); start from "
            f"its fused weights instead: init.kind='params', init.checkpoint='{path}/{FUSED_DIR}'."
        )
    subtree = {key: metadata[key]}
    restored = checkpointer.restore(
        item,
        args=ocp.args.PyTreeRestore(
            item=jax.tree.map(lambda m: np.empty(m.shape, m.dtype), subtree),
            restore_args=jax.tree.map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray), subtree),
            partial_restore=True,
        ),
    )
    return restored[key], step


def save_params(params: PyTree, directory: str | os.PathLike) -> str:
    """Writes a params pytree with orbax (StandardCheckpointer), replacing an existing directory."""
    directory = os.path.abspath(os.fspath(directory))
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(directory, params, force=True)
    checkpointer.wait_until_finished()
    return directory


def load_params_directory(directory: str | os.PathLike) -> PyTree:
    """Reads a params pytree written by `save_params` (numpy arrays, on the host)."""
    directory = os.path.abspath(os.fspath(directory))
    checkpointer = ocp.PyTreeCheckpointer()
    metadata = tree_metadata(directory)
    return checkpointer.restore(
        directory,
        args=ocp.args.PyTreeRestore(
            restore_args=jax.tree.map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
        ),
    )
