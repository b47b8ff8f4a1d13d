"""Ahead-of-time compile of DiffusionGemma 26B-A4B on a simulated 8-device CPU mesh, with a per-device memory report.

Follows the JAX AOT recipe (`jax.jit(f, in_shardings, out_shardings).lower(*abstract).compile()` on
`jax.ShapeDtypeStruct`s carrying `NamedSharding`s) and an fsdp x expert layout in the style of MaxText / GShard
expert parallelism: every parameter is placed by the logical-axis rules of `training/sharding.py` (expert weights
over the `expert` mesh axis -- asserted -- and over `fsdp` in their embed dimension). Nothing is allocated: the
parameters, optimizer state, batches and KV caches are abstract, so the 26B model compiles in under 2 GB of RSS.

Programs (each printed as ONE JSON line, after a `params` line):
  train_adamw, train_adafactor  the full train step of `train_state.make_train_step` (loss, grads, global-norm clip,
                                optimizer update, non-finite guard), state donated. Loss: `AutoregressiveObjective`
                                (next-token CE, causal), or `--objective block_diffusion` for
                                `DiffusionPretrainObjective` (canvas 256, masking, canvas CE + encoder AR loss).
  canvas_denoise                `transformer.decode_block`: a canvas (batch 1 x 256) attends to itself and to a
                                4096-slot KV cache, cache read only (the sampler's inner step), with self-conditioning.
  append                        `transformer.append` of 256 committed tokens into the cache (cache donated).
  decode_1                      the same for one token (causal decoding).

Figures: per-device bytes from `compiled.memory_analysis()` (arguments, outputs, aliases, temporaries, code) and the
analytic per-device bytes of parameters / optimizer state / cache from the shardings (`shard_shape`), which must
match the compiled argument size. The summary line converts them into 80 GB GPUs under stated assumptions.

Deliberate choices and caveats (each JSON line says which were used):
  * Params are bf16 (the preset's param_dtype) with NO f32 master copy; the optimizer state follows the parameter
    dtype (optax's default): AdamW's mu/nu are bf16 and sharded like the params, Adafactor's factored row/column
    moments are bf16 and replicated (about 90 MB).
    `--param_dtype float32` compiles the f32-master-weight variant.
  * MoE dispatch: the preset's "ragged" (dropless `jax.lax.ragged_dot`, the GPU path) by default. XLA:CPU lowers
    ragged_dot to a masked dense dot over every local expert, so CPU temporaries of "ragged" overstate a GPU's
    grouped GEMM; `--dispatch sorted` (capacity buffers) is closer to what the GPU allocates.
  * `--licm off` (default) disables XLA's while-loop-invariant-code-motion for these programs: on CPU that pass hoists
    an f32 convert of every scanned bf16 weight stack out of the layer loop (an f32 copy of all layer weights, e.g.
    +15 GiB per device for canvas_denoise), an artifact of XLA:CPU's bf16 dot handling that the GPU does not have.
  * Layout: the toolbox's batch sharding is over (data, fsdp); the model has no activation sharding constraints, and
    GSPMD then gives the residual stream the embedding table's layout (embed dim over fsdp, batch replicated on every
    device). `--layout toolbox --batch_axes data,fsdp` compiles exactly that; `--layout constrained` (default) adds one
    `with_sharding_constraint` on the token embeddings (batch over `--batch_axes`), which the layers then follow.
  * Layers are `nn.scan`ned over repeats of the 6-layer pattern, so the HLO holds ONE layer group whatever the depth;
    depth only changes the leading `layers` axis of the stacked weights, the caches and the saved residuals, and
    compile time does not grow with it. Parameter, optimizer and cache bytes are exactly affine in depth,
    bytes(G) = fixed + G * per_group (the `params` line gives both); `--num_layers 6` compiles one full-width group.

Usage: python experiments/aot_26b.py [--dispatch ragged|sorted|dense] [--num_layers 30] [--batch 8 --seq 4096]
       [--layout constrained|toolbox] [--batch_axes data,fsdp,expert] [--programs train_adamw,...] [--markdown]
       [--num_devices 16 --mesh data=1,fsdp=4,expert=4,tensor=1]
Results and the GPU counts: docs/scaling.md.
"""

from __future__ import annotations

import os
import sys


def _requested_devices(argv: list[str]) -> int:
    """`--num_devices N` from the command line (read before jax starts; the flag fixes the CPU device count)."""
    for i, arg in enumerate(argv):
        if arg.startswith("--num_devices="):
            return int(arg.split("=", 1)[1])
        if arg == "--num_devices" and i + 1 < len(argv):
            return int(argv[i + 1])
    return 8


if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    _count = _requested_devices(sys.argv) if __name__ == "__main__" else 8
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_count}"
    ).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402
from jaxtyping import Array, Float, Int  # noqa: E402

from hackable_diffusion.diffusion import objectives, processes, schedules  # noqa: E402
from hackable_diffusion.models import attention, partitioning, presets, transformer  # noqa: E402
from hackable_diffusion.models.config import TransformerConfig  # noqa: E402
from hackable_diffusion.training import optimizers, sharding, train_state  # noqa: E402

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


# ---------------------------------------------------------------------------------------------------------------
# The model with its one activation constraint.
# ---------------------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------------------
# Abstract, sharded inputs and analytic sizes.
# ---------------------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------------------
# Compile one program.
# ---------------------------------------------------------------------------------------------------------------


def compile_program(
    name: str,
    fn: Callable,
    args: Sequence[PyTree],
    *,
    out_shardings: PyTree,
    donate_argnums: tuple[int, ...] = (),
    extra: dict[str, Any] | None = None,
    compiler_options: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], Any]:
    """Lowers and compiles `fn` on abstract sharded `args`; returns (report, compiled)."""
    in_shardings = jax.tree.map(lambda a: a.sharding, tuple(args))
    # keep_unused: the whole parameter tree is resident even where a program does not read every leaf (the
    # self-conditioner in append/decode), so it belongs in the argument size.
    jitted = jax.jit(
        fn,
        in_shardings=in_shardings,
        out_shardings=out_shardings,
        donate_argnums=donate_argnums,
        keep_unused=True,
        compiler_options=compiler_options,
    )
    t0 = time.perf_counter()
    lowered = jitted.lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    stats = compiled.memory_analysis()
    if stats is None:
        raise RuntimeError(f"{name}: this backend returned no memory analysis.")
    memory = {f: int(getattr(stats, f)) for f in MEMORY_FIELDS}
    memory["live_bytes_per_device"] = (
        memory["argument_size_in_bytes"]
        + memory["output_size_in_bytes"]
        - memory["alias_size_in_bytes"]
        + memory["temp_size_in_bytes"]
    )
    analytic = per_device_bytes(args)
    report = {
        "program": name,
        "lower_s": round(t1 - t0, 2),
        "compile_s": round(t2 - t1, 2),
        "memory_per_device": memory,
        "analytic_argument_bytes_per_device": analytic,
        "analytic_vs_compiled_argument_ratio": round(analytic / max(memory["argument_size_in_bytes"], 1), 4),
    }
    report.update(extra or {})
    return report, compiled


# ---------------------------------------------------------------------------------------------------------------
# The programs.
# ---------------------------------------------------------------------------------------------------------------


def _loss_fn(objective: str, model: transformer.Transformer, canvas: int) -> tuple[Callable, str]:
    if objective == "ar":
        return objectives.AutoregressiveObjective(model), "AutoregressiveObjective (next-token CE, causal)"
    process = processes.MaskingProcess(vocab_size=model.cfg.vocab_size, schedule=schedules.LinearSchedule(), mask_id=3)
    sc_prob = 0.5 if model.cfg.self_conditioning else 0.0
    loss = objectives.DiffusionPretrainObjective(
        model, process, canvas_len=canvas, loss="canvas_ce", encoder_ar_weight=1.0, self_condition_prob=sc_prob
    )
    return loss, (
        f"DiffusionPretrainObjective (block diffusion, canvas {canvas}, masking, canvas CE + encoder AR, "
        f"self_condition_prob {sc_prob})"
    )


def _layout_fields(settings: AotSettings) -> dict[str, Any]:
    return {
        "layout": settings.layout,
        "batch_axes": list(settings.batch_axes),
        "xla_options": settings.compiler_options or {},
    }


def train_program(settings: AotSettings, mesh: Mesh, optimizer_name: str) -> tuple[dict[str, Any], Any]:
    cfg = TransformerConfig.from_dict(settings.model).replace(remat=settings.remat)
    model = make_model(cfg, settings, mesh)
    params, p_shardings = sharded_params(model, mesh)
    opt_cfg = ml_collections.ConfigDict(
        dict(
            name=optimizer_name,
            peak_lr=1e-4,
            end_lr=1e-5,
            warmup_steps=100,
            total_steps=10_000,
            weight_decay=0.1,
            clip_norm=1.0,
        )
    )
    optimizer = optimizers.make_optimizer(opt_cfg)
    abstract_state = jax.eval_shape(lambda p: train_state.TrainState.create(p, optimizer, jax.random.key(0)), params)
    s_shardings = sharding.state_shardings(abstract_state, p_shardings, mesh)
    state = with_shardings(abstract_state, s_shardings)
    b, l = settings.train_batch, settings.train_seq
    batch_sharding = leading_axis_sharding(mesh, (b, l), settings.batch_axes)
    batch = {"tokens": jax.ShapeDtypeStruct((b, l), jnp.int32, sharding=batch_sharding)}
    loss_fn, loss_name = _loss_fn(settings.objective, model, settings.canvas)
    step = train_state.make_train_step(loss_fn, optimizer)
    state_sharded, state_replicated = split_bytes(state)
    extra = dict(
        _layout_fields(settings),
        optimizer=optimizer_name,
        objective=loss_name,
        remat=cfg.remat,
        batch_shape=[b, l],
        batch_spec=str(batch_sharding.spec),
        tokens_per_device=math.prod(batch_sharding.shard_shape((b, l))),
        param_dtype=cfg.param_dtype,
        compute_dtype=cfg.compute_dtype,
        master_weights=(
            "f32 params" if cfg.param_dtype == "float32" else f"none ({cfg.param_dtype} params, no f32 copy)"
        ),
        opt_state_dtypes=sorted({jnp.dtype(x.dtype).name for x in jax.tree.leaves(state.opt_state)}),
        params_bytes_per_device=per_device_bytes(state.params),
        opt_state_bytes_per_device=per_device_bytes(state.opt_state),
        opt_state_replicated_bytes=split_bytes(state.opt_state)[1],
        state_sharded_global_bytes=state_sharded,
        state_replicated_bytes=state_replicated,
    )
    replicated = NamedSharding(mesh, PartitionSpec())
    return compile_program(
        f"train_{optimizer_name}",
        step,
        (state, batch),
        out_shardings=(s_shardings, replicated),
        donate_argnums=(0,),
        extra=extra,
        compiler_options=settings.compiler_options,
    )


def _inference_setup(settings: AotSettings, mesh: Mesh):
    cfg = TransformerConfig.from_dict(settings.model)
    model = make_model(cfg, settings, mesh)
    params, _ = sharded_params(model, mesh)
    abstract_cache = jax.eval_shape(lambda: attention.init_cache(cfg, settings.decode_batch, settings.cache_len))
    cache = with_shardings(abstract_cache, cache_shardings(mesh, abstract_cache, settings.batch_axes))
    return cfg, model, params, cache


def _inference_extra(settings, cfg: TransformerConfig, params: PyTree, cache: PyTree, shape) -> dict[str, Any]:
    cache_sharded, cache_replicated = split_bytes(cache)
    params_sharded, params_replicated = split_bytes(params)
    return dict(
        _layout_fields(settings),
        tokens_shape=list(shape),
        cache_len=cache.length,
        cache_dtype=jnp.dtype(cache.layers[0]["k"].dtype).name,
        cache_spec=str(cache.layers[0]["k"].sharding.spec),
        param_dtype=cfg.param_dtype,
        compute_dtype=cfg.compute_dtype,
        params_bytes_per_device=per_device_bytes(params),
        cache_bytes_per_device=per_device_bytes(cache),
        state_sharded_global_bytes=params_sharded + cache_sharded,
        state_replicated_bytes=params_replicated + cache_replicated,
    )


def canvas_denoise_program(settings: AotSettings, mesh: Mesh) -> tuple[dict[str, Any], Any]:
    cfg, model, params, cache = _inference_setup(settings, mesh)
    shape = (settings.decode_batch, settings.canvas)
    axes = settings.batch_axes
    tokens = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=leading_axis_sharding(mesh, shape, axes))
    logits_sharding = leading_axis_sharding(mesh, (*shape, cfg.vocab_size), axes)
    extra = _inference_extra(settings, cfg, params, cache, shape)
    extra["self_conditioning_input"] = cfg.self_conditioning
    if cfg.self_conditioning:
        sc_shape = (*shape, cfg.embed_dim)
        sc_sharding = leading_axis_sharding(mesh, sc_shape, axes)
        sc = jax.ShapeDtypeStruct(sc_shape, jnp.dtype(cfg.compute_dtype), sharding=sc_sharding)

        def denoise_sc(p, t, c, s):
            return transformer.decode_block(model, p, t, c, sc_signal=s)[0]

        fn, args = denoise_sc, (params, tokens, cache, sc)
    else:

        def denoise(p, t, c):
            return transformer.decode_block(model, p, t, c)[0]

        fn, args = denoise, (params, tokens, cache)
    return compile_program(
        "canvas_denoise",
        fn,
        args,
        out_shardings=logits_sharding,
        extra=extra,
        compiler_options=settings.compiler_options,
    )


def append_program(settings: AotSettings, mesh: Mesh, length: int) -> tuple[dict[str, Any], Any]:
    cfg, model, params, cache = _inference_setup(settings, mesh)
    shape = (settings.decode_batch, length)
    axes = settings.batch_axes
    tokens = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=leading_axis_sharding(mesh, shape, axes))
    logits_sharding = leading_axis_sharding(mesh, (*shape, cfg.vocab_size), axes)
    cache_out = jax.tree.map(lambda a: a.sharding, cache)

    def append(p, t, c):
        return transformer.append(model, p, t, c)

    name = "decode_1" if length == 1 else f"append_{length}"
    return compile_program(
        name,
        append,
        (params, tokens, cache),
        out_shardings=(logits_sharding, cache_out),
        donate_argnums=(2,),
        extra=_inference_extra(settings, cfg, params, cache, shape),
        compiler_options=settings.compiler_options,
    )


def build_programs(settings: AotSettings, mesh: Mesh) -> dict[str, Callable[[], tuple[dict[str, Any], Any]]]:
    return {
        "train_adamw": lambda: train_program(settings, mesh, "adamw"),
        "train_adafactor": lambda: train_program(settings, mesh, "adafactor"),
        "canvas_denoise": lambda: canvas_denoise_program(settings, mesh),
        "append": lambda: append_program(settings, mesh, settings.append_len),
        "decode_1": lambda: append_program(settings, mesh, 1),
    }


# ---------------------------------------------------------------------------------------------------------------
# GPU count.
# ---------------------------------------------------------------------------------------------------------------


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


def markdown_table(summary: dict[str, Any]) -> str:
    keys = (
        "program",
        "batch",
        "tokens_per_device",
        "state_gib_per_device",
        "temp_gib_per_device",
        "live_gib_per_device",
        "gpus_80gb_pooled",
        "gpus_80gb_same_per_device_batch",
        "compile_s",
    )
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in summary["programs"]:
        lines.append("| " + " | ".join(str(row[k]) for k in keys) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# Main.
# ---------------------------------------------------------------------------------------------------------------


def run(settings: AotSettings, emit: Callable[[dict[str, Any]], None] = lambda r: None) -> dict[str, Any]:
    """Compiles `settings.programs`, calls `emit(report)` for the params line and each program, returns the summary."""
    mesh = sharding.make_mesh(settings.mesh)
    cfg = TransformerConfig.from_dict(settings.model)
    params, _ = sharded_params(transformer.Transformer(cfg), mesh)
    common = {
        "mesh": dict(mesh.shape),
        "num_layers": cfg.num_layers,
        "scanned_groups": cfg.num_groups,
        "dispatch": cfg.moe.dispatch if cfg.moe else None,
        "backend": jax.default_backend(),
    }
    emit(
        dict(
            common,
            program="params",
            total_params=sum(math.prod(x.shape) for x in jax.tree.leaves(params)),
            params_global_bytes=global_bytes(params),
            params_bytes_per_device=per_device_bytes(params),
            depth_model=depth_split(params, cfg.num_groups),
            self_conditioning=cfg.self_conditioning,
            expert_param_specs=expert_param_specs(params),
            replicated_expert_params=[],  # sharded_params raised otherwise
        )
    )
    builders = build_programs(settings, mesh)
    rows = []
    for name in settings.programs:
        report, _ = builders[name]()
        report = dict(common, **report)
        emit(report)
        rows.append(gpus_needed(report, mesh.size))
    return dict(
        common,
        program="summary",
        gpu_bytes=GPU_BYTES,
        assumptions=(
            "gpus_80gb_pooled = ceil(num_devices * live_bytes_per_device / 80e9): the devices' bytes pooled, as if "
            "state, temporaries and outputs all sharded perfectly. gpus_80gb_same_per_device_batch: the smallest "
            "power of two n with sharded state / n + "
            "replicated state + the measured non-state per-device bytes (temporaries, batch, logits) <= 80e9, i.e. "
            "fsdp grows, the per-device batch stays and the global batch grows with n. Temporaries are XLA:CPU's "
            "buffer assignment (see the module docstring for the CPU-only artifacts)."
        ),
        programs=rows,
        max_rss_gib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--dispatch",
        default=None,
        choices=["ragged", "sorted", "dense"],
        help="MoE dispatch (default: the preset's, 'ragged').",
    )
    p.add_argument("--num_layers", type=int, default=None, help="Depth (a multiple of 6); default the preset's 30.")
    p.add_argument(
        "--param_dtype",
        default=None,
        choices=["bfloat16", "float32"],
        help="Parameter dtype (default the preset's bfloat16; float32 = f32 master weights).",
    )
    p.add_argument(
        "--no_self_conditioning",
        action="store_true",
        help="Drop DiffusionGemma's self-conditioner (the model is then plain Gemma-4 26B-A4B).",
    )
    p.add_argument(
        "--num_devices",
        type=int,
        default=8,
        help="Simulated CPU devices (set before jax starts); the mesh must use all of them.",
    )
    p.add_argument("--mesh", default="data=1,fsdp=2,expert=4,tensor=1", help="Mesh axis sizes.")
    p.add_argument("--layout", default="constrained", choices=LAYOUTS)
    p.add_argument(
        "--batch_axes",
        default="data,fsdp,expert",
        help="Mesh axes of the batch dimension (the toolbox's batch_sharding uses data,fsdp).",
    )
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--decode_batch", type=int, default=1)
    p.add_argument("--canvas", type=int, default=256)
    p.add_argument("--cache_len", type=int, default=4096)
    p.add_argument("--append_len", type=int, default=256)
    p.add_argument("--objective", default="ar", choices=["ar", "block_diffusion"])
    p.add_argument("--remat", default="full", choices=["none", "full", "dots"], help="Training programs only.")
    p.add_argument(
        "--licm",
        default="off",
        choices=["on", "off"],
        help="XLA's while-loop-invariant-code-motion pass ('off' avoids the CPU-only f32 weight copies).",
    )
    p.add_argument("--programs", default=",".join(PROGRAMS))
    p.add_argument("--markdown", action="store_true", help="Also print the summary as a markdown table.")
    return p.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> AotSettings:
    model = presets.diffusiongemma_26b_a4b()
    model["self_conditioning"] = not args.no_self_conditioning
    if args.dispatch:
        model["moe"] = dict(model["moe"], dispatch=args.dispatch)
    if args.num_layers:
        model["num_layers"] = args.num_layers
    if args.param_dtype:
        model["param_dtype"] = args.param_dtype
    mesh = {}
    for item in args.mesh.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--mesh entries look like fsdp=2, got {item!r}.")
        mesh[key.strip()] = int(value)
    return AotSettings(
        model=model,
        mesh=mesh,
        train_batch=args.batch,
        train_seq=args.seq,
        decode_batch=args.decode_batch,
        canvas=args.canvas,
        cache_len=args.cache_len,
        append_len=args.append_len,
        objective=args.objective,
        remat=args.remat,
        layout=args.layout,
        batch_axes=tuple(a for a in args.batch_axes.split(",") if a),
        programs=tuple(p for p in args.programs.split(",") if p),
        compiler_options=None if args.licm == "on" else dict(NO_LICM),
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if jax.device_count() != args.num_devices:
        raise ValueError(
            f"jax sees {jax.device_count()} devices but --num_devices={args.num_devices}; XLA_FLAGS already fixed the "
            "count (unset xla_force_host_platform_device_count there or pass the matching --num_devices)."
        )
    settings = settings_from_args(args)
    t0 = time.perf_counter()
    summary = run(settings, emit=lambda r: print(json.dumps(r), flush=True))
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(summary), flush=True)
    if args.markdown:
        print(markdown_table(summary))


if __name__ == "__main__":
    main()
