"""Nested parameter trees as flat `{"a/b/c": leaf}` dicts, and the metadata of an orbax tree on disk.

Every checkpoint format (gemma library trees, Hugging Face tensors, the toolbox's own runs) is converted leaf by leaf
through these flat views; `natural_key` orders paths so that `layer_10` comes after `layer_9`.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Mapping
from typing import Any


def flatten_tree(tree: Mapping[str, Any], sep: str = "/") -> dict[str, Any]:
    """{'a/b/c': leaf} from a nested mapping (a flat mapping with '/'-joined keys passes through)."""
    flat: dict[str, Any] = {}

    def walk(node, prefix):
        for key, value in node.items():
            path = f"{prefix}{sep}{key}" if prefix else str(key)
            if isinstance(value, Mapping):
                walk(value, path)
            elif value is not None:
                flat[path] = value

    walk(tree, "")
    return flat


def unflatten_tree(flat: Mapping[str, Any], sep: str = "/") -> dict[str, Any]:
    """Nested dict from {'a/b/c': leaf}."""
    tree: dict[str, Any] = {}
    for path, value in flat.items():
        node = tree
        *parents, leaf = path.split(sep)
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return tree


def natural_key(path: str) -> list[Any]:
    """Sort key that orders the numbers inside a path by value (`layer_2` before `layer_10`)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path)]


def tree_metadata(directory: str | os.PathLike) -> dict[str, Any]:
    """The nested tree of array metadata (shape, dtype) of an orbax PyTree item directory, without reading arrays.

    Read through the PyTree handler, so it also works for an item inside a CheckpointManager step (e.g.
    `checkpoints/300/state`), which has no item-level `_CHECKPOINT_METADATA` file.
    """
    import orbax.checkpoint as ocp

    metadata = ocp.PyTreeCheckpointHandler().metadata(pathlib.Path(os.path.abspath(os.fspath(directory))))
    return getattr(metadata, "tree", metadata)
