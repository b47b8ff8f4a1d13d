"""Settings, the sharded abstract state and the byte bookkeeping of the AOT compiles (see the package docstring)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Float, Int

from hackable_diffusion.models import attention, partitioning, transformer
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.training import sharding

PyTree = Any


GPU_BYTES = 80e9


PROGRAMS = ("train_adamw", "train_adafactor", "canvas_denoise", "append", "decode_1")


NO_LICM = {"xla_disable_hlo_passes": "while-loop-invariant-code-motion"}


MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "alias_size_in_bytes",
    "temp_size_in_bytes",
    "generated_code_size_in_bytes",
)


LAYOUTS = ("constrained", "toolbox")


@dataclasses.dataclass(frozen=True)
class AotSettings:
    """Everything that decides the compiled programs."""

    model: dict[str, Any]
    mesh: dict[str, int]
    train_batch: int = 8
    train_seq: int = 4096
    decode_batch: int = 1
    canvas: int = 256
    cache_len: int = 4096
    append_len: int = 256
    objective: str = "ar"  # "ar" | "block_diffusion"
    remat: str = "full"  # applied to the training programs only
    layout: str = "constrained"  # "constrained" | "toolbox"
    batch_axes: tuple[str, ...] = ("data", "fsdp", "expert")  # the toolbox's batch_sharding uses (data, fsdp)
    programs: tuple[str, ...] = PROGRAMS
    compiler_options: dict[str, Any] | None = None

    def __post_init__(self):
        unknown = [p for p in self.programs if p not in PROGRAMS]
        if unknown:
            raise ValueError(f"unknown programs {unknown}; choose from {list(PROGRAMS)}.")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout {self.layout!r} is not one of {LAYOUTS}.")
        bad = [a for a in self.batch_axes if a not in sharding.MESH_AXES]
        if bad:
            raise ValueError(f"batch_axes {bad} are not mesh axes; choose from {list(sharding.MESH_AXES)}.")
        if self.objective not in ("ar", "block_diffusion"):
            raise ValueError(f"objective {self.objective!r} must be 'ar' or 'block_diffusion'.")


class ConstrainedTransformer(transformer.Transformer):
    """`Transformer` whose token embeddings are constrained to a batch-sharded layout (same parameters).

    Without it GSPMD propagates the embedding table's layout (embed dim over fsdp) into the residual stream and
    replicates the batch on every device. `batch_axes=None` gives the toolbox's unconstrained model.
    """

    mesh: Mesh | None = None
    batch_axes: tuple[str, ...] | None = None

    def embed(self, tokens: Int[Array, "b l"]) -> Float[Array, "b l d"]:
        x = super().embed(tokens)
        if self.mesh is None or self.batch_axes is None:
            return x
        return jax.lax.with_sharding_constraint(x, leading_axis_sharding(self.mesh, x.shape, self.batch_axes))


def make_model(cfg: TransformerConfig, settings: AotSettings, mesh: Mesh) -> transformer.Transformer:
    if settings.layout == "toolbox":
        return transformer.Transformer(cfg)
    return ConstrainedTransformer(cfg, mesh=mesh, batch_axes=tuple(settings.batch_axes))


def with_shardings(abstract: PyTree, shardings: PyTree) -> PyTree:
    """ShapeDtypeStructs carrying the given NamedShardings."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def _nbytes(shape: Sequence[int], dtype: Any) -> int:
    return math.prod(shape) * jnp.dtype(dtype).itemsize


def per_device_bytes(tree: PyTree) -> int:
    """Bytes one device holds of a tree of sharded ShapeDtypeStructs (its shard of every leaf)."""
    return sum(_nbytes(x.sharding.shard_shape(x.shape), x.dtype) for x in jax.tree.leaves(tree))


def global_bytes(tree: PyTree) -> int:
    return sum(_nbytes(x.shape, x.dtype) for x in jax.tree.leaves(tree))


def split_bytes(tree: PyTree) -> tuple[int, int]:
    """(global bytes of leaves sharded over some mesh axis, bytes of fully replicated leaves)."""
    sharded = sum(_nbytes(x.shape, x.dtype) for x in jax.tree.leaves(tree) if not x.sharding.is_fully_replicated)
    replicated = sum(_nbytes(x.shape, x.dtype) for x in jax.tree.leaves(tree) if x.sharding.is_fully_replicated)
    return sharded, replicated


def leading_axis_sharding(mesh: Mesh, shape: Sequence[int], batch_axes: Sequence[str], axis: int = 0) -> NamedSharding:
    """Dimension `axis` over `batch_axes` if their sizes divide it, otherwise replicated."""
    spec: list[Any] = [None] * len(shape)
    if shape[axis] % math.prod(mesh.shape[a] for a in batch_axes) == 0:
        spec[axis] = tuple(batch_axes)
    return NamedSharding(mesh, PartitionSpec(*spec))


def cache_shardings(mesh: Mesh, cache: attention.KVCache, batch_axes: Sequence[str]) -> attention.KVCache:
    """K/V (groups, b, s, kv_heads, hd), positions and valid (b, s): batch-sharded when divisible, else replicated."""
    layers = tuple(
        {k: leading_axis_sharding(mesh, v.shape, batch_axes, axis=1) for k, v in layer.items()}
        for layer in cache.layers
    )
    return attention.KVCache(
        layers=layers,
        positions=leading_axis_sharding(mesh, cache.positions.shape, batch_axes),
        valid=leading_axis_sharding(mesh, cache.valid.shape, batch_axes),
        end_index=NamedSharding(mesh, PartitionSpec()),
    )


def sharded_params(
    model: transformer.Transformer, mesh: Mesh, rules: sharding.Rules = sharding.DEFAULT_RULES
) -> tuple[PyTree, PyTree]:
    """(abstract params carrying NamedShardings, their shardings).

    Raises AssertionError naming every expert weight that is replicated across the `expert` mesh axis.
    """
    abstract = jax.eval_shape(lambda: transformer.init_params(model, jax.random.key(0)))
    shardings = sharding.param_shardings(abstract, partitioning.logical_axes, mesh, rules)
    offending = sharding.replicated_expert_params(abstract, shardings, partitioning.logical_axes)
    if offending:
        raise AssertionError(f"expert weights replicated across the expert mesh axis: {offending}")
    return with_shardings(abstract, shardings), shardings


def expert_param_specs(params: PyTree) -> dict[str, str]:
    """Path -> 'shape spec' of every parameter with an `experts` logical axis."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = sharding.path_to_names(path)
        if "experts" in partitioning.logical_axes(names, leaf.shape):
            out["/".join(names)] = f"{tuple(leaf.shape)} {leaf.sharding.spec}"
    return out


def depth_split(params: PyTree, num_groups: int) -> dict[str, int]:
    """Per-device parameter bytes that do not depend on depth, and those of one scanned layer group."""
    fixed, stacked = 0, 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        size = _nbytes(leaf.sharding.shard_shape(leaf.shape), leaf.dtype)
        if "layers" in sharding.path_to_names(path):
            stacked += size
        else:
            fixed += size
    return {"fixed_bytes_per_device": fixed, "per_group_bytes_per_device": stacked // num_groups}


def gpus_needed(report: dict[str, Any], num_devices: int, gpu_bytes: float = GPU_BYTES) -> dict[str, Any]:
    """How many `gpu_bytes` GPUs a program needs, under two explicit assumptions.

    pooled: the bytes of all devices pooled and divided evenly, as if state, temporaries and outputs all sharded
      perfectly: n = ceil(num_devices * live / gpu_bytes). Replicated buffers are counted once per device, so this
      overstates programs whose temporaries are replicated (batch-1 inference) and understates per-device peaks.
    same_per_device_batch: the state that is sharded here (params, optimizer state, cache) shards 1/n over n GPUs
      (the fsdp axis grows), replicated state stays whole on every GPU, and everything else per device (temporaries,
      batch, logits) keeps its measured size, i.e. the per-device batch is kept and the global batch grows with n:
      the smallest power of two n with sharded/n + replicated + rest <= gpu_bytes (powers of two divide the 128
      experts and the batch); "does not fit" when replicated + rest alone exceed a GPU.
    """
    mem = report["memory_per_device"]
    live = mem["live_bytes_per_device"]
    pooled = max(1, math.ceil(live * num_devices / gpu_bytes))
    state_here = (
        report["params_bytes_per_device"]
        + report.get("opt_state_bytes_per_device", 0)
        + report.get("cache_bytes_per_device", 0)
    )
    rest = live - state_here
    room = gpu_bytes - report["state_replicated_bytes"] - rest
    if room <= 0:
        same_batch: int | str = "does not fit"
    else:
        n = max(1, math.ceil(report["state_sharded_global_bytes"] / room))
        same_batch = 1 << (n - 1).bit_length()
    batch = report.get("batch_shape", report.get("tokens_shape"))
    per_device_batch = report.get("tokens_per_device")
    return {
        "program": report["program"],
        "batch": batch,
        "tokens_per_device": per_device_batch,
        "live_gib_per_device": _gib(live),
        "state_gib_per_device": _gib(state_here),
        "non_state_gib_per_device": _gib(rest),
        "temp_gib_per_device": _gib(mem["temp_size_in_bytes"]),
        "total_gib_all_devices": _gib(live * num_devices),
        "gpus_80gb_pooled": pooled,
        "gpus_80gb_same_per_device_batch": same_batch,
        "compile_s": report["compile_s"],
    }


def _gib(x: float) -> float:
    return round(x / 2**30, 2)


def mesh_from_spec(spec: str) -> dict[str, int]:
    """ "data=1,fsdp=2,expert=4,tensor=1" -> {"data": 1, "fsdp": 2, "expert": 4, "tensor": 1}."""
    mesh = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"mesh entries look like fsdp=2, got {item!r}.")
        mesh[key.strip()] = int(value)
    return mesh
