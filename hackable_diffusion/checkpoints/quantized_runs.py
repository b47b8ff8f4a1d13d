"""Runs quantized to FP8 or NVFP4 (`python -m hackable_diffusion.quantize [--format nvfp4]`): their
`QuantizedParams` / `NVFP4Params` on disk.

A quantized run is a directory with `config.json` (model.weight_dtype='float8_e4m3fn' or 'nvfp4'), `tokenizer/`,
the weights and `quantized_from.json` (the source run and step). FP8: `fp8_params/` (orbax: the FP8 values stored as
uint8 bytes, the per-channel scales of the quantized leaves). NVFP4: `nvfp4_params/` (orbax: the packed uint8 codes
in the tree, and {leaf path: e4m3 block scales as uint8 bytes} and {leaf path: float32 global scale}).
`models.quantize` holds the quantization itself.
"""

from __future__ import annotations

import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from hackable_diffusion.checkpoints.trees import tree_metadata
from hackable_diffusion.data import safe_files
from hackable_diffusion.models.quantize import FP8, NVFP4Params, QuantizedParams

QUANTIZED_DIR = "fp8_params"  # a quantized run's weights
NVFP4_DIR = "nvfp4_params"  # an NVFP4 run's weights
WEIGHT_DIRS = {"float8_e4m3fn": QUANTIZED_DIR, "nvfp4": NVFP4_DIR}  # model.weight_dtype -> its weights directory
QUANTIZED_SOURCE = "quantized_from.json"  # the run and step they were quantized from


def load_quantized_run(workdir: str, weight_dtype: str = "float8_e4m3fn"):
    """(QuantizedParams or NVFP4Params, step) of a run written by `python -m hackable_diffusion.quantize`."""

    run = pathlib.Path(workdir)
    directory = WEIGHT_DIRS.get(weight_dtype)
    if directory is None or not (run / directory).is_dir():
        fmt = "nvfp4" if weight_dtype == "nvfp4" else "fp8"
        raise FileNotFoundError(
            f"{workdir} says model.weight_dtype={weight_dtype!r} but has no {directory}/: make it with python -m "
            f"hackable_diffusion.quantize --workdir TRAINED_RUN --out {workdir} --format {fmt}."
        )
    source = safe_files.read_json(run / QUANTIZED_SOURCE)
    load = load_nvfp4 if weight_dtype == "nvfp4" else load_quantized
    return load(run / directory), int(source["step"])


def _path_key(path) -> str:
    return "/".join(str(getattr(p, "key", p)) for p in path)


def save_quantized(quantized: QuantizedParams, directory: str | os.PathLike) -> str:
    """Writes `quantized` with orbax: {"values": the tree with FP8 leaves as uint8 bytes, "scales": {path: scale}}."""
    values = jax.tree.map(
        lambda v: np.asarray(jax.lax.bitcast_convert_type(v, jnp.uint8)) if v.dtype == FP8 else np.asarray(v),
        quantized.values,
    )
    flat = jax.tree_util.tree_flatten_with_path(quantized.scales, is_leaf=lambda x: x is None)[0]
    scales = {_path_key(path): np.asarray(s) for path, s in flat if s is not None}
    return _save_arrays({"values": values, "scales": scales}, directory)


def _save_arrays(stored: dict, directory: str | os.PathLike) -> str:
    """Writes a dict of numpy trees with orbax (replacing `directory`); returns its absolute path."""
    import orbax.checkpoint as ocp

    directory = os.path.abspath(os.fspath(directory))
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(directory, stored, force=True)
    checkpointer.wait_until_finished()
    return directory


def _restore_arrays(directory: str | os.PathLike) -> dict:
    """Reads what `_save_arrays` wrote, every leaf as a numpy array."""
    import orbax.checkpoint as ocp

    directory = os.path.abspath(os.fspath(directory))
    metadata = tree_metadata(directory)
    return ocp.PyTreeCheckpointer().restore(
        directory,
        args=ocp.args.PyTreeRestore(
            restore_args=jax.tree.map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
        ),
    )


def load_quantized(directory: str | os.PathLike) -> QuantizedParams:
    """Reads what `save_quantized` wrote, onto the default device."""
    stored = _restore_arrays(directory)
    flat, treedef = jax.tree_util.tree_flatten_with_path(stored["values"])
    values, scales = [], []
    for path, leaf in flat:
        scale = stored["scales"].get(_path_key(path))
        values.append(jax.lax.bitcast_convert_type(jnp.asarray(leaf), FP8) if scale is not None else jnp.asarray(leaf))
        scales.append(None if scale is None else jnp.asarray(scale))
    return QuantizedParams(treedef.unflatten(values), treedef.unflatten(scales))


def _fp8_bytes(x) -> np.ndarray:
    return np.asarray(jax.lax.bitcast_convert_type(x, jnp.uint8))


def save_nvfp4(quantized: NVFP4Params, directory: str | os.PathLike) -> str:
    """Writes `quantized` with orbax: {"values": the tree (packed codes as uint8), "block_scales": {path: e4m3 bytes
    as uint8}, "global_scales": {path: float32}}."""

    def by_path(tree, convert):
        flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)[0]
        return {_path_key(path): convert(s) for path, s in flat if s is not None}

    stored = {
        "values": jax.tree.map(np.asarray, quantized.values),
        "block_scales": by_path(quantized.block_scales, _fp8_bytes),
        "global_scales": by_path(quantized.global_scales, lambda s: np.asarray(s, np.float32)),
    }
    return _save_arrays(stored, directory)


def load_nvfp4(directory: str | os.PathLike) -> NVFP4Params:
    """Reads what `save_nvfp4` wrote, onto the default device."""
    stored = _restore_arrays(directory)
    flat, treedef = jax.tree_util.tree_flatten_with_path(stored["values"])
    blocks, globals_ = [], []
    for path, _ in flat:
        block = stored["block_scales"].get(_path_key(path))
        blocks.append(None if block is None else jax.lax.bitcast_convert_type(jnp.asarray(block), FP8))
        glob = stored["global_scales"].get(_path_key(path))
        globals_.append(None if glob is None else jnp.asarray(glob, jnp.float32))
    values = treedef.unflatten([jnp.asarray(leaf) for _, leaf in flat])
    return NVFP4Params(values, treedef.unflatten(blocks), treedef.unflatten(globals_))
