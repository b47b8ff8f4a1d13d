"""Hugging Face checkpoints <-> toolbox: DiffusionGemma (`diffusion_gemma`) and Gemma-4 (`gemma4`, `gemma4_text`).

Reads and writes the directory layout `transformers` uses: its files are `hf_files.py`'s (names, the index, reading one
tensor at a time), the config half is `hf_config.py`.
Follows `transformers` 5.23's `DiffusionGemmaForBlockDiffusion` and `Gemma4ForCausalLM` (`modeling_diffusion_gemma.py`,
`modeling_gemma4.py`); the names and layouts below were read from that source and checked against checkpoints it
saves (`experiments/checkpoints/make_hf_fixtures.py`, `tests/models/test_hf_checkpoints.py`); no code of theirs is used.

The weight mapping (one row per toolbox leaf) is `hf_mapping.py`'s `RULES`; `mapping_table` prints it.

Deliberate choices
------------------
- The text weights are read one tensor at a time (`safe_open`, closed after each read, so no memory map keeps the
  file resident). With a mesh, each leaf is built straight into a sharded `jax.Array` with `make_array_from_callback`:
  a device's slice is cut from the layer's tensor, which is read once for all the devices that need it, so host memory
  never holds the model twice (`experiments/training/bench_load.py` measures peak RSS against checkpoint bytes).
- Strict: a missing or unexpected text tensor, a mis-shaped one, or an encoder copy (DiffusionGemma checkpoints hold
  each `layer_scalar` twice, for the encoder and the decoder stacks) that differs from the decoder's fails by name.
  Vision and audio towers are skipped and counted. `ignore_unexpected=True` tolerates other unknown tensors.
- Config fields the toolbox cannot express (another activation, attention bias, per-layer input embeddings, KV
  sharing, double-wide MLPs, a dense Gemma-4 block without experts, untied embeddings, bidirectional text attention,
  RoPE scaling) are refused by name, never dropped.
- A loaded model runs the experts dropless (the reference's ragged dispatch; on a CPU the sorted dispatch with room for
  every assignment, capacity E / k), because capacity dropping changes a pretrained model's outputs.
- `decoder_window="cache_tail"` reproduces transformers' decoder exactly when a sliding window is smaller than prompt
  + canvas; the default is the convention config.json records (`decoder_window`, written by `save_hf`), else the gemma
  library's per-token window (docs/reference.md §6, docs/checkpoints.md).
- Bit-exact: loading and saving copy the stored values (reshapes and transposes only); dtypes are kept unless `dtype`
  is given. HF -> toolbox -> HF reproduces every text tensor bit for bit, and the vision tower when `source` is given.
- Quantized checkpoints (config.json `quantization_config`: ModelOpt NVFP4, FP8 compressed-tensors) are read through
  `quantized_formats.dequantizing_view`: each quantized weight arrives dequantized to float32, exactly.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import pathlib
import shutil
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from hackable_diffusion.checkpoints import quantized_formats
from hackable_diffusion.checkpoints.hf_config import (  # noqa: F401  (the config half, re-exported for callers)
    DIFFUSION_GEMMA,
    GEMMA4_TEXT,
    MINIMAL_VISION_CONFIG,
    MODEL_TYPES,
    SPECIAL_TOKEN_FIELDS,
    HFModelInfo,
    config_from_hf,
    config_to_hf,
    generation_config,
    generation_config_from_sampler,
    minimal_vision_shapes,
)
from hackable_diffusion.checkpoints.hf_files import (
    CONFIG_FILE,
    GENERATION_CONFIG_FILE,
    INDEX_FILE,
    SINGLE_FILE,
    TOKENIZER_FILES,
    read_config,
    read_json,
    read_model_config,
    read_tensor,
    weight_files,
)
from hackable_diffusion.checkpoints.hf_mapping import RULES, HFRule, _Leaf, mapping_table, plan  # noqa: F401
from hackable_diffusion.checkpoints.trees import flatten_tree, natural_key, unflatten_tree
from hackable_diffusion.data import safe_files
from hackable_diffusion.models import partitioning
from hackable_diffusion.models.config import TransformerConfig, resolve_dtype
from hackable_diffusion.training import sharding

MAX_SHARD_BYTES = 5 * 10**9
SKIPPED_PARTS = ("vision_tower.", "embed_vision.", "audio_tower.", "embed_audio.", "multi_modal_projector.")
TEXT_STACK = {DIFFUSION_GEMMA: "model.decoder.", "gemma4": "model.language_model.", GEMMA4_TEXT: "model."}
COPY_STACKS = {DIFFUSION_GEMMA: ("model.encoder.language_model.",)}  # tied copies that must agree with TEXT_STACK


# ----------------------------------------------------------------------------------------------------------------
# Reading.


@dataclasses.dataclass(frozen=True)
class _Source:
    """Where each text tensor of a checkpoint is, after the checks."""

    files: Mapping[str, pathlib.Path]
    stack: str  # the text stack prefix whose names the rules complete
    skipped: int  # vision/audio tensors left out


def _check_names(
    cfg: TransformerConfig, info: HFModelInfo, files: Mapping[str, pathlib.Path], rules, ignore_unexpected: bool
) -> _Source:
    stack = TEXT_STACK[info.model_type]
    copies = COPY_STACKS.get(info.model_type, ())
    expected = {stack + name for _, names in mapping_table(cfg, rules) for name in names}
    skipped = [n for n in files if any(part in n for part in SKIPPED_PARTS)]
    text = set(files) - set(skipped)
    missing = sorted(expected - text, key=natural_key)
    if missing:
        raise ValueError(
            f"The checkpoint lacks {len(missing)} text tensor(s) the model needs, first {missing[:3]} (model shape "
            "from config.json; is it the right checkpoint?)."
        )

    def twin(name: str) -> str:
        """The stored weight a tied copy must equal (the name itself for a weight that is not a copy)."""
        if name == "lm_head.weight":
            return stack + "embed_tokens.weight"
        copy = next((c for c in copies if name.startswith(c)), None)
        return stack + name[len(copy) :] if copy else name

    unexpected = sorted((n for n in text - expected if twin(n) not in expected), key=natural_key)
    if unexpected and not ignore_unexpected:
        raise ValueError(
            f"The checkpoint holds {len(unexpected)} text tensor(s) the toolbox has no place for, first "
            f"{unexpected[:3]}; pass ignore_unexpected=True to skip them."
        )
    for name in sorted(text - expected - set(unexpected), key=natural_key):
        same = np.array_equal(read_tensor(files, name).view(np.uint8), read_tensor(files, twin(name)).view(np.uint8))
        if not same:
            raise ValueError(
                f"{name} differs from {twin(name)}: the checkpoint stores one tied weight twice with two values, so "
                "it cannot be loaded as one model."
            )
    return _Source(files, stack, len(skipped))


class _LayerCache:
    """The last few toolbox-layout layer arrays, so that the devices sharing a layer read it once."""

    def __init__(self, size: int):
        self.size, self.items = size, collections.OrderedDict()

    def get(self, key, make):
        if key not in self.items:
            self.items[key] = make()
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return self.items[key]


def _leaf_layer(source: _Source, leaf: _Leaf, layer: int | None, dtype: Any) -> np.ndarray:
    names = [source.stack + name for name in leaf.names(layer)]
    arrays = [read_tensor(source.files, name) for name in names]
    shape = leaf.shape[1:] if leaf.block is not None else leaf.shape
    try:
        out = leaf.rule.from_hf(arrays, shape)
    except ValueError as err:
        raise ValueError(f"{names} have shapes {[a.shape for a in arrays]}, not what {leaf.path} {shape} needs: {err}")
    if out.shape != shape:
        raise ValueError(f"{names} give {leaf.path} the shape {out.shape}, expected {shape}.")
    return out.astype(dtype) if dtype is not None and out.dtype != dtype else out


@dataclasses.dataclass(frozen=True)
class HFCheckpoint:
    """A loaded checkpoint: the toolbox config, parameters (a nested dict) and what else the directory says."""

    config: TransformerConfig
    params: Any
    info: HFModelInfo
    skipped_tensors: int


def load_hf(
    path: str | os.PathLike,
    *,
    mesh: jax.sharding.Mesh | None = None,
    logical_axes_fn: Callable | None = None,
    dtype: str | None = None,
    dispatch: str | None = None,
    decoder_window: str | None = None,
    ignore_unexpected: bool = False,
    rules: Sequence[HFRule] = RULES,
) -> HFCheckpoint:
    """Loads a DiffusionGemma or Gemma-4 checkpoint directory into the toolbox's config and parameters.

    Without a mesh the parameters are numpy arrays on the host. With a mesh every leaf is a `jax.Array` sharded by
    `logical_axes_fn` (default: `models.partitioning.logical_axes`), each device's slice read straight from the files.
    decoder_window: None reads the convention config.json records, else "per_token" (`hf_config.config_from_hf`).
    """
    cfg, info = read_model_config(path, dtype=dtype, dispatch=dispatch, decoder_window=decoder_window)
    files = quantized_formats.dequantizing_view(path, read_config(path), weight_files(path), read_tensor)
    source = _check_names(cfg, info, files, rules, ignore_unexpected)
    target = None if dtype is None else resolve_dtype(dtype)
    leaves = plan(cfg, rules)
    flat: dict[str, Any] = {}
    if mesh is None:
        for leaf in leaves:
            if leaf.block is None:
                flat[leaf.path] = _leaf_layer(source, leaf, None, target)
            else:
                flat[leaf.path] = np.stack([_leaf_layer(source, leaf, n, target) for n in leaf.layers(cfg)])
    else:
        abstract = unflatten_tree(
            {leaf.path: jax.ShapeDtypeStruct(leaf.shape, target or leaf.dtype) for leaf in leaves}
        )
        shardings = flatten_tree(sharding.param_shardings(abstract, logical_axes_fn or partitioning.logical_axes, mesh))
        for leaf in leaves:  # one leaf at a time: its layers are read once, then dropped
            cache = _LayerCache(size=1 if leaf.block is None else leaf.shape[0])
            flat[leaf.path] = jax.make_array_from_callback(
                leaf.shape, shardings[leaf.path], _slice_reader(source, leaf, cfg, target, cache)
            )
            del cache
    params = unflatten_tree(flat)
    if source.skipped:
        print(f"Skipped {source.skipped} vision/audio tensors of {path} (text only).", flush=True)
    return HFCheckpoint(cfg, params, info, source.skipped)


def _slice_reader(source: _Source, leaf: _Leaf, cfg: TransformerConfig, dtype, cache: _LayerCache):
    def read(index: tuple[slice, ...]) -> np.ndarray:
        if leaf.block is None:
            whole = cache.get((leaf.path, None), lambda: _leaf_layer(source, leaf, None, dtype))
            return whole[index]
        layers = leaf.layers(cfg)[index[0]]
        slices = [cache.get((leaf.path, n), lambda n=n: _leaf_layer(source, leaf, n, dtype))[index[1:]] for n in layers]
        return slices[0][None] if len(slices) == 1 else np.stack(slices)  # one layer: a view, no host copy

    return read


# ----------------------------------------------------------------------------------------------------------------
# Writing.


def hf_tensors(cfg: TransformerConfig, params: Any, *, model_type: str = DIFFUSION_GEMMA, rules=RULES):
    """Yields (name, numpy array) of every text tensor of `params` in the Hugging Face layout, layer by layer (the
    DiffusionGemma encoder's `layer_scalar` copies included), so a writer never holds more than one layer."""
    stack = TEXT_STACK[model_type]
    flat = flatten_tree(params)
    for leaf in plan(cfg, rules):
        array = flat[leaf.path]
        if tuple(array.shape) != leaf.shape:  # config.json would describe another model than the tensors hold
            raise ValueError(
                f"parameter {leaf.path} has shape {tuple(array.shape)}, but the model config gives {leaf.shape}: "
                "export with the config the parameters were built with (e.g. the vocabulary of the run's tokenizer)."
            )
        slices = [(None, array)] if leaf.block is None else [(n, array[g]) for g, n in enumerate(leaf.layers(cfg))]
        for layer, value in slices:
            tensors = leaf.rule.to_hf(np.asarray(value))
            for name, tensor in zip(leaf.names(layer), tensors):
                yield stack + name, np.ascontiguousarray(tensor)
                if model_type == DIFFUSION_GEMMA and name.endswith("layer_scalar"):
                    yield COPY_STACKS[DIFFUSION_GEMMA][0] + name, np.ascontiguousarray(tensor)


def save_hf(
    directory: str | os.PathLike,
    cfg: TransformerConfig,
    params: Any,
    *,
    model_type: str = DIFFUSION_GEMMA,
    canvas_length: int = 256,
    sampler: Mapping[str, Any] | None = None,
    source: str | os.PathLike | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    rules: Sequence[HFRule] = RULES,
    overwrite: bool = True,
    max_position_embeddings: int | None = None,
) -> pathlib.Path:
    """Writes `(cfg, params)` as a Hugging Face directory that `from_pretrained` (and vLLM) load: config.json,
    safetensors shards of at most `max_shard_bytes` (with model.safetensors.index.json when there are several) and,
    when there is something to say, generation_config.json (`hf_config.generation_config`: the run's sampler settings,
    `sampler`, where transformers has a field for them, else the source checkpoint's).

    source: the Hugging Face directory the parameters came from; its vision/audio tensors, vision config, generation
    config and tokenizer files are carried over, so that HF -> toolbox -> HF is bit-exact.

    max_position_embeddings: the context written to config.json (None: the source's, else the release's 131,072).

    The directory is written beside the target and swapped in at the end (`replacing_directory`): an existing
    `directory` is replaced whole, and a failure part-way leaves it as it was. overwrite=False refuses a non-empty
    one."""
    directory = pathlib.Path(directory)
    with safe_files.replacing_directory(directory, overwrite=overwrite, what="the checkpoint") as staging:
        _write_hf(
            staging,
            cfg,
            params,
            model_type=model_type,
            canvas_length=canvas_length,
            sampler=sampler,
            source=source,
            max_shard_bytes=max_shard_bytes,
            rules=rules,
            max_position_embeddings=max_position_embeddings,
        )
    return directory


def _write_hf(
    directory: pathlib.Path,
    cfg: TransformerConfig,
    params: Any,
    *,
    model_type: str,
    canvas_length: int,
    sampler: Mapping[str, Any] | None,
    source: str | os.PathLike | None,
    max_shard_bytes: int,
    rules: Sequence[HFRule],
    max_position_embeddings: int | None = None,
) -> None:
    """save_hf's writing, into a new directory."""
    from safetensors.numpy import save_file

    directory.mkdir(parents=True)
    source_config = read_config(source) if source is not None else {}
    hf = config_to_hf(
        cfg,
        model_type=model_type,
        canvas_length=canvas_length,
        vision_config=source_config.get("vision_config"),
        max_position_embeddings=int(
            max_position_embeddings
            or (source_config.get("text_config") or source_config).get("max_position_embeddings")
            or 131_072
        ),
    )
    tensors = hf_tensors(cfg, params, model_type=model_type, rules=rules)
    if source is not None:
        files = weight_files(source)
        extra = [n for n in files if any(part in n for part in SKIPPED_PARTS)]
        tensors = _chain(tensors, ((name, read_tensor(files, name)) for name in sorted(extra, key=natural_key)))
    if model_type == DIFFUSION_GEMMA and source_config.get("vision_config") is None:  # the stand-in tower's weights

        stand_in = resolve_dtype(hf["dtype"])
        shapes = minimal_vision_shapes(cfg.embed_dim)
        tensors = _chain(tensors, ((name, np.zeros(shape, stand_in)) for name, shape in shapes.items()))

    shards, current, size = [], {}, 0
    for name, tensor in tensors:
        if current and size + tensor.nbytes > max_shard_bytes:
            shards.append(_write_shard(directory, len(shards), current, save_file))
            current, size = {}, 0
        current[name], size = tensor, size + tensor.nbytes
    shards.append(_write_shard(directory, len(shards), current, save_file))
    total = sum(sum(sizes.values()) for _, sizes in shards)
    if len(shards) == 1:
        (directory / shards[0][0]).rename(directory / SINGLE_FILE)
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
        weight_map = {}
        for (tmp, shard_tensors), final in zip(shards, names):
            (directory / tmp).rename(directory / final)
            weight_map.update({name: final for name in shard_tensors})
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    (directory / CONFIG_FILE).write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    source_generation = None
    if source is not None and (pathlib.Path(source) / GENERATION_CONFIG_FILE).is_file():
        source_generation = read_json(pathlib.Path(source) / GENERATION_CONFIG_FILE)
    generation = generation_config(
        model_type,
        sampler=sampler,
        source=source_generation if isinstance(source_generation, dict) else None,
        source_model_type=source_config.get("model_type"),
        special_tokens={k: hf[k] for k in SPECIAL_TOKEN_FIELDS if k in hf},
    )
    if generation:
        (directory / GENERATION_CONFIG_FILE).write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")
    if source is not None:
        for name in TOKENIZER_FILES:
            if (pathlib.Path(source) / name).is_file():
                shutil.copyfile(pathlib.Path(source) / name, directory / name)


def _chain(*iterables):
    for iterable in iterables:
        yield from iterable


def _write_shard(directory: pathlib.Path, index: int, tensors: dict[str, np.ndarray], save_file) -> tuple[str, dict]:
    """Writes one shard under a temporary name; returns (that name, {tensor name: bytes})."""
    name = f".shard-{index:05d}.safetensors"
    save_file(tensors, str(directory / name), metadata={"format": "pt"})
    os.chmod(directory / name, 0o666 & ~_umask())  # safetensors creates its files owner-only (0600)
    return name, {n: t.nbytes for n, t in tensors.items()}


@functools.cache
def _umask() -> int:
    """The process's umask, read once (reading it means setting it for a moment, which no other thread should see
    twice)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
