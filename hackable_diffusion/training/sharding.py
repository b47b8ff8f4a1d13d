"""Device meshes, logical-axis rules and shardings for params and batches.

Follows the logical-axis-rules idea of t5x / flax `logical_to_mesh_axes` and MaxText: the model names each parameter
dimension logically ("embed", "heads", "experts", ...), a rules table maps logical names to the mesh axes
(data, fsdp, expert, tensor), and the model never mentions the mesh.

Deliberate differences:
  * A dimension that a mesh axis does not divide is an error by default (with the sizes and the fix in the
    message), not silently replicated; `drop_indivisible=True` drops trailing mesh axes until it divides.
  * The model supplies `logical_axes_fn(path, shape)` instead of annotating variables, and it must cover every
    parameter: an unknown parameter is a ValueError naming its path.
  * Meshes use `AxisType.Auto` on every axis (`jax.make_mesh` defaults to Explicit, which makes ordinary code raise
    `ShardingTypeError`).
  * Optimizer-state leaves take the sharding of the parameter whose path they end with and whose shape they share
    (Adam's mu/nu); leaves of any other shape (counts, Adafactor's factored moments) are replicated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

PyTree = Any
MESH_AXES: tuple[str, ...] = ("data", "fsdp", "expert", "tensor")
BATCH_AXES: tuple[str, ...] = ("data", "fsdp")

MeshAxes = str | tuple[str, ...] | None
Rules = Mapping[str, MeshAxes]
LogicalAxesFn = Callable[[tuple[str, ...], tuple[int, ...]], "Sequence[str | None] | None"]

#: Default logical-name -> mesh-axes table. A logical name of None (or a rule of None) means replicated.
DEFAULT_RULES: dict[str, MeshAxes] = {
    "batch": BATCH_AXES,
    "length": None,
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": None,  # few KV heads (GQA/MQA) rarely divide the tensor axis; replicating them is cheap.
    "head_dim": None,
    "mlp": "tensor",
    "experts": "expert",
    "expert_mlp": "tensor",
    "layers": None,
    "norm": None,
    "lora_rank": None,
}


# ---------------------------------------------------------------------------------------------------------------
# Mesh
# ---------------------------------------------------------------------------------------------------------------


def mesh_shape(cfg: ml_collections.ConfigDict | Mapping[str, int], num_devices: int) -> tuple[int, ...]:
    """Resolves the (data, fsdp, expert, tensor) sizes; exactly one may be -1 (= whatever is left)."""
    unknown = [k for k in cfg.keys() if k not in MESH_AXES]
    if unknown:
        raise ValueError(f"unknown mesh axes {unknown}; the mesh axes are {list(MESH_AXES)}.")
    sizes = [int(cfg[a]) if a in cfg else 1 for a in MESH_AXES]
    free = [a for a, s in zip(MESH_AXES, sizes) if s == -1]
    bad = [f"{a}={s}" for a, s in zip(MESH_AXES, sizes) if s == 0 or s < -1]
    if bad:
        raise ValueError(f"mesh axis sizes must be positive (or -1 for one axis), got {', '.join(bad)}.")
    if len(free) > 1:
        raise ValueError(f"at most one mesh axis may be -1 (= the remaining devices), got -1 for {free}.")
    known = math.prod(s for s in sizes if s != -1)
    if free:
        if num_devices % known:
            raise ValueError(
                f"cannot fill mesh axis '{free[0]}': the other axes multiply to {known}, which does not divide the "
                f"{num_devices} devices."
            )
        sizes[MESH_AXES.index(free[0])] = num_devices // known
    elif known != num_devices:
        shape = ", ".join(f"{a}={s}" for a, s in zip(MESH_AXES, sizes))
        raise ValueError(
            f"mesh {shape} has {known} devices but there are {num_devices}; make the product equal {num_devices} "
            "or set one axis to -1."
        )
    return tuple(sizes)


def make_mesh(cfg: ml_collections.ConfigDict | Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, expert, tensor) mesh with Auto axis types over `devices` (default: all global devices).

    Devices are laid out in `jax.devices()` order (process-major), so the outer axes (data first) span processes
    and the inner ones (tensor) stay within a host.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(cfg, len(devices))
    return Mesh(np.array(devices).reshape(shape), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


# ---------------------------------------------------------------------------------------------------------------
# Logical axes -> PartitionSpec
# ---------------------------------------------------------------------------------------------------------------


def _as_tuple(axes: MeshAxes) -> tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def logical_to_spec(
    logical_axes: Sequence[str | None],
    rules: Rules,
    mesh: Mesh,
    shape: Sequence[int],
    *,
    drop_indivisible: bool = False,
) -> PartitionSpec:
    """PartitionSpec for an array of `shape` whose dimensions have the given logical names."""
    if len(logical_axes) != len(shape):
        raise ValueError(f"logical axes {tuple(logical_axes)} do not match the rank of shape {tuple(shape)}.")
    used: dict[str, str] = {}
    spec: list[MeshAxes] = []
    for name, size in zip(logical_axes, shape):
        if name is None:
            spec.append(None)
            continue
        if name not in rules:
            raise ValueError(f"logical axis {name!r} has no rule; known names are {sorted(rules)}. Add a rule.")
        axes = _as_tuple(rules[name])
        for axis in axes:
            if axis not in mesh.shape:
                raise ValueError(f"rule {name!r} -> {axis!r} names an axis the mesh lacks ({tuple(mesh.axis_names)}).")
            if axis in used:
                raise ValueError(
                    f"mesh axis {axis!r} is used by both logical axes {used[axis]!r} and {name!r} of one array; "
                    "change the rules so each mesh axis shards at most one dimension."
                )
        kept = list(axes)
        while kept and size % math.prod(mesh.shape[a] for a in kept):
            if not drop_indivisible:
                sizes = " x ".join(f"'{a}' of size {mesh.shape[a]}" for a in kept)
                raise ValueError(
                    f"dimension {name!r} of size {size} is not divisible by mesh axis {sizes}; choose a mesh whose "
                    f"axis sizes divide {size}, map {name!r} to other axes in the rules, or pass "
                    "drop_indivisible=True to replicate it."
                )
            kept.pop()
        for axis in kept:
            used[axis] = name
        spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return PartitionSpec(*spec)


def path_to_names(path: tuple[Any, ...]) -> tuple[str, ...]:
    """A jax tree path (DictKey/GetAttrKey/SequenceKey...) as a tuple of strings."""
    names = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                names.append(str(getattr(key, attr)))
                break
        else:
            names.append(str(key))
    return tuple(names)


def param_specs(
    params: PyTree,
    logical_axes_fn: LogicalAxesFn,
    mesh: Mesh,
    rules: Rules = DEFAULT_RULES,
    *,
    drop_indivisible: bool = False,
) -> PyTree:
    """PartitionSpec for every leaf of `params` (arrays or ShapeDtypeStructs)."""

    def spec(path, leaf):
        names = path_to_names(path)
        shape = tuple(leaf.shape)
        logical = logical_axes_fn(names, shape)
        if logical is None:
            raise ValueError(
                f"logical_axes_fn has no logical axes for parameter {'/'.join(names)!r} with shape {shape}; "
                "extend the model's logical_axes_fn to cover it."
            )
        try:
            return logical_to_spec(logical, rules, mesh, shape, drop_indivisible=drop_indivisible)
        except ValueError as e:
            raise ValueError(f"parameter {'/'.join(names)!r}: {e}") from None

    return jax.tree_util.tree_map_with_path(spec, params)


def param_shardings(
    params: PyTree,
    logical_axes_fn: LogicalAxesFn,
    mesh: Mesh,
    rules: Rules = DEFAULT_RULES,
    *,
    drop_indivisible: bool = False,
) -> PyTree:
    """NamedSharding for every leaf of `params` from the model's logical axes and the rules."""
    specs = param_specs(params, logical_axes_fn, mesh, rules, drop_indivisible=drop_indivisible)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


def replicated_expert_params(
    params: PyTree,
    shardings: PyTree,
    logical_axes_fn: LogicalAxesFn,
    *,
    expert_logical_axis: str = "experts",
    expert_mesh_axis: str = "expert",
) -> list[str]:
    """Paths of expert weights (a dimension named `experts`) not sharded over the expert mesh axis.

    Returns [] when the mesh's expert axis has size 1 (nothing can be replicated across it).
    """
    offending = []
    flat_params = jax.tree_util.tree_flatten_with_path(params)[0]
    flat_shardings = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    if len(flat_params) != len(flat_shardings):
        raise ValueError("params and shardings must have the same tree structure.")
    for (path, leaf), sharding in zip(flat_params, flat_shardings):
        names = path_to_names(path)
        if sharding.mesh.shape.get(expert_mesh_axis, 1) == 1:
            continue
        if expert_logical_axis not in tuple(logical_axes_fn(names, tuple(leaf.shape)) or ()):
            continue
        used = {a for entry in sharding.spec for a in _as_tuple(entry)}
        if expert_mesh_axis not in used:
            offending.append("/".join(names))
    return offending


# ---------------------------------------------------------------------------------------------------------------
# State and batch shardings
# ---------------------------------------------------------------------------------------------------------------


def state_shardings(abstract_state: PyTree, params_shardings: PyTree, mesh: Mesh) -> PyTree:
    """Shardings for a TrainState-like pytree that has `.params` (and maybe `.ema_params`).

    Any leaf whose path ends with a parameter's path and whose shape equals that parameter's shape gets the
    parameter's sharding (params, EMA, Adam moments); every other leaf (step, rng, counts, factored moments) is
    replicated.
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    by_path: dict[tuple[str, ...], tuple[tuple[int, ...], NamedSharding]] = {}
    flat_shardings = jax.tree.leaves(params_shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    flat_params = jax.tree_util.tree_flatten_with_path(abstract_state.params)[0]
    if len(flat_params) != len(flat_shardings):
        raise ValueError("params_shardings must have the tree structure of abstract_state.params.")
    for (path, leaf), sharding in zip(flat_params, flat_shardings):
        by_path[path_to_names(path)] = (tuple(leaf.shape), sharding)
    max_len = max((len(p) for p in by_path), default=0)

    def pick(path, leaf):
        names = path_to_names(path)
        for n in range(min(len(names), max_len), 0, -1):
            hit = by_path.get(names[-n:])
            if hit is not None and hit[0] == tuple(leaf.shape):
                return hit[1]
        return replicated

    return jax.tree_util.tree_map_with_path(pick, abstract_state)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis over (data, fsdp); other axes replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def shard_batch(batch: PyTree, mesh: Mesh) -> PyTree:
    """Places a host batch on the mesh with `batch_sharding`.

    Single process: `batch` is the global batch (device_put). Several processes: `batch` is this process's slice of
    the global batch (rows in process order) and the global array is assembled with
    `jax.make_array_from_process_local_data`.
    """
    sharding = batch_sharding(mesh)
    if jax.process_count() == 1:
        return jax.device_put(batch, sharding)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), batch)
