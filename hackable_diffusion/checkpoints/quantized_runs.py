"""Runs quantized to FP8 (`python -m hackable_diffusion.quantize`): their `QuantizedParams` on disk.

A quantized run is a directory with `config.json` (model.weight_dtype='float8_e4m3fn'), `tokenizer/`,
`fp8_params/` (orbax: the FP8 values stored as uint8 bytes, the per-channel scales of the quantized leaves) and
`quantized_from.json` (the source run and step). `models.quantize` holds the quantization itself.
"""

from __future__ import annotations

import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from hackable_diffusion.checkpoints.trees import tree_metadata
from hackable_diffusion.data import safe_files
from hackable_diffusion.models.quantize import FP8, QuantizedParams

QUANTIZED_DIR = "fp8_params"  # a quantized run's weights
QUANTIZED_SOURCE = "quantized_from.json"  # the run and step they were quantized from


def load_quantized_run(workdir: str):
    """(QuantizedParams, step) of a run written by `python -m hackable_diffusion.quantize`."""

    run = pathlib.Path(workdir)
    if not (run / QUANTIZED_DIR).is_dir():
        raise FileNotFoundError(
            f"{workdir} says model.weight_dtype='float8_e4m3fn' but has no {QUANTIZED_DIR}/: make it with python -m "
            f"hackable_diffusion.quantize --workdir TRAINED_RUN --out {workdir}."
        )
    source = safe_files.read_json(run / QUANTIZED_SOURCE)
    return load_quantized(run / QUANTIZED_DIR), int(source["step"])


def _path_key(path) -> str:
    return "/".join(str(getattr(p, "key", p)) for p in path)


def save_quantized(quantized: QuantizedParams, directory: str | os.PathLike) -> str:
    """Writes `quantized` with orbax: {"values": the tree with FP8 leaves as uint8 bytes, "scales": {path: scale}}."""
    import orbax.checkpoint as ocp

    values = jax.tree.map(
        lambda v: np.asarray(jax.lax.bitcast_convert_type(v, jnp.uint8)) if v.dtype == FP8 else np.asarray(v),
        quantized.values,
    )
    flat = jax.tree_util.tree_flatten_with_path(quantized.scales, is_leaf=lambda x: x is None)[0]
    scales = {_path_key(path): np.asarray(s) for path, s in flat if s is not None}
    directory = os.path.abspath(os.fspath(directory))
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(directory, {"values": values, "scales": scales}, force=True)
    checkpointer.wait_until_finished()
    return directory


def load_quantized(directory: str | os.PathLike) -> QuantizedParams:
    """Reads what `save_quantized` wrote, onto the default device."""
    import orbax.checkpoint as ocp

    directory = os.path.abspath(os.fspath(directory))
    metadata = tree_metadata(directory)
    stored = ocp.PyTreeCheckpointer().restore(
        directory,
        args=ocp.args.PyTreeRestore(
            restore_args=jax.tree.map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
        ),
    )
    flat, treedef = jax.tree_util.tree_flatten_with_path(stored["values"])
    values, scales = [], []
    for path, leaf in flat:
        scale = stored["scales"].get(_path_key(path))
        values.append(jax.lax.bitcast_convert_type(jnp.asarray(leaf), FP8) if scale is not None else jnp.asarray(leaf))
        scales.append(None if scale is None else jnp.asarray(scale))
    return QuantizedParams(treedef.unflatten(values), treedef.unflatten(scales))
