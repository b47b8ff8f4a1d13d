"""The files of a Hugging Face checkpoint directory, as `transformers` lays them out, and reading them.

`config.json`, `model.safetensors` or `model-0000k-of-0000N.safetensors` with `model.safetensors.index.json`,
`generation_config.json`, tokenizer files. A tensor is read one at a time (`safe_open`, closed after each read, so no
memory map keeps the file resident), through a quantized checkpoint's dequantizing view when it has one
(`quantized_formats.dequantizing_view`). A missing, truncated or malformed file is an error that names it. `hf.py`
maps what these files hold to and from the toolbox's config and parameters.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from hackable_diffusion.checkpoints import quantized_formats
from hackable_diffusion.checkpoints.hf_config import HFModelInfo, config_from_hf
from hackable_diffusion.data import safe_files
from hackable_diffusion.models.config import TransformerConfig

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def is_hf_directory(path: str | os.PathLike) -> bool:
    path = pathlib.Path(path)
    return (path / CONFIG_FILE).is_file() and ((path / SINGLE_FILE).is_file() or (path / INDEX_FILE).is_file())


def read_json(path: pathlib.Path) -> Any:
    """A JSON file of a checkpoint; a malformed one is a ValueError that names it."""
    return safe_files.read_json(path, f"repair it, or copy or download the checkpoint {path.parent} again")


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    path = pathlib.Path(path)
    if not is_hf_directory(path):
        raise FileNotFoundError(
            f"{path} is not a Hugging Face checkpoint directory (it needs {CONFIG_FILE} and {SINGLE_FILE} or "
            f"{INDEX_FILE})."
        )
    config = read_json(path / CONFIG_FILE)
    if isinstance(config, dict):
        return config
    raise ValueError(
        f"{path / CONFIG_FILE} holds a JSON {type(config).__name__}, not the object of a Hugging Face config: "
        f"repair it, or copy or download the checkpoint {path} again."
    )


def read_model_config(path: str | os.PathLike, **kwargs) -> tuple[TransformerConfig, HFModelInfo]:
    """`config_from_hf` of a checkpoint directory's config.json; an error names the file."""
    file = pathlib.Path(path) / CONFIG_FILE
    hf = read_config(path)
    try:
        return config_from_hf(hf, **kwargs)
    except KeyError as err:
        raise ValueError(
            f"{file} has no field {err}, which a {hf.get('model_type')} config needs: is it a DiffusionGemma or "
            "Gemma-4 checkpoint saved by transformers?"
        ) from None
    except ValueError as err:  # a field the toolbox cannot express, refused by name
        raise ValueError(f"{pathlib.Path(path)}: {err}") from err


def _corrupt(file: pathlib.Path, err: Exception) -> ValueError:
    return ValueError(
        f"{file} is not a readable safetensors file ({err}); it is probably truncated or corrupt: copy or download "
        f"the checkpoint {file.parent} again."
    )


def _open_weights(file: pathlib.Path):
    """`safe_open` of one weight file; a missing or unreadable file is an error that names it."""
    from safetensors import SafetensorError, safe_open

    if not file.is_file():
        raise FileNotFoundError(
            f"{file} is missing, though {file.parent / INDEX_FILE} lists it: the checkpoint is incomplete; copy or "
            "download it again."
        )
    try:
        return safe_open(file, framework="numpy")
    except SafetensorError as err:
        raise _corrupt(file, err) from None


def weight_files(path: str | os.PathLike) -> dict[str, pathlib.Path]:
    """{tensor name: safetensors file} of a checkpoint directory."""
    path = pathlib.Path(path)
    if (path / INDEX_FILE).is_file():
        index = read_json(path / INDEX_FILE)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise ValueError(
                f"{path / INDEX_FILE} has no weight_map object: repair it, or copy or download the checkpoint again."
            )
        files = {name: path / file for name, file in weight_map.items()}
        for file in sorted(set(files.values())):
            with _open_weights(file):  # every shard is there and its header reads
                pass
        return files
    with _open_weights(path / SINGLE_FILE) as f:
        return {name: path / SINGLE_FILE for name in f.keys()}


def tensor_shapes(files: Mapping[str, pathlib.Path]) -> dict[str, tuple[int, ...]]:
    """{name: shape} from the safetensors headers (no tensor is read)."""
    shapes = {}
    for file in sorted(set(files.values())):
        with _open_weights(file) as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def read_tensor(files: Mapping[str, pathlib.Path], name: str) -> np.ndarray:
    """One tensor, read and the file closed again (no memory map stays open); through a quantized checkpoint's
    view (`quantized_formats.dequantizing_view`), a quantized weight dequantized to float32."""
    from safetensors import SafetensorError

    if isinstance(files, quantized_formats.DequantizingView):
        return files.read_tensor(name)
    with _open_weights(files[name]) as f:
        try:
            return f.get_tensor(name)
        except SafetensorError as err:
            raise _corrupt(files[name], err) from None


def checkpoint_bytes(path: str | os.PathLike) -> int:
    """Bytes of the safetensors files of a checkpoint directory."""
    return sum(f.stat().st_size for f in set(weight_files(path).values()))


def read_all_tensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint as numpy (for tests and the naive loading path of the benchmark)."""
    files = weight_files(path)
    return {name: read_tensor(files, name) for name in files}
