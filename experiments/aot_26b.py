"""Ahead-of-time compile of DiffusionGemma 26B-A4B on a simulated 8-device CPU mesh, with a per-device memory report.

Follows the JAX AOT recipe (`jax.jit(f, in_shardings, out_shardings).lower(*abstract).compile()` on
`jax.ShapeDtypeStruct`s carrying `NamedSharding`s) and the fsdp x expert layout of MaxText / GShard-style expert
parallelism: every parameter is placed by the logical-axis rules of `training/sharding.py`, expert weights are split
over the `expert` mesh axis (asserted) and over `fsdp` in their embed dimension. Nothing is allocated: parameters,
optimizer state, batches and KV caches are abstract, so the 26B model compiles on a 24 GiB laptop-class machine.

Programs (each printed as ONE JSON line):
  train_adamw, train_adafactor  the full train step (`train_state.make_train_step`: loss, grads, global-norm clip,
                                optimizer update, non-finite guard) with state donated; the loss is
                                `AutoregressiveObjective` (next-token CE, causal) by default or block diffusion
                                (`DiffusionPretrainObjective`, canvas 256, masking process, DiffusionGemma's layout).
  canvas_denoise                `transformer.decode_block`: a canvas (batch 1 x 256) attends to itself and to a
                                4096-slot KV cache, cache read only (the sampler's inner step).
  append_256, decode_1          `transformer.append`: 256 committed tokens / 1 token written into the cache (donated).

Figures: per-device bytes from `compiled.memory_analysis()` (arguments, outputs, aliases, temporaries, code) plus the
analytic per-device bytes of parameters and optimizer state computed from the shardings (`shard_shape`); the two
must agree with the compiled argument size. The summary line turns them into a number of 80 GB GPUs.

Deliberate choices and caveats (also in every JSON line):
  * Parameters are bf16 (the preset's param_dtype) with no f32 master copy; AdamW moments are bf16 too (optax keeps
    the parameter dtype), Adafactor's factored second moments are f32 and replicated (they are tiny).
    `--param_dtype float32` compiles the f32-master-weight variant instead.
  * On CPU `jax.lax.ragged_dot` ("ragged", the GPU-true dropless dispatch) lowers to a masked dense dot that
    broadcasts the routed rows to every expert, so CPU temporaries of "ragged" overstate the GPU's. `--dispatch sorted`
    (capacity buffer) gives temporaries close to what a grouped GEMM needs.
  * The layers are `nn.scan`ned over repeats of the 6-layer pattern, so the HLO holds ONE layer group whatever the
    depth; depth only changes the leading `layers` axis of the stacked weights, the caches and the saved residuals.
    Parameter, optimizer and cache bytes are therefore exactly affine in depth: bytes(G) = fixed + G * per_group
    (fixed = embedder, final norm, self-conditioner). `--num_layers 6` compiles one group with full-width shapes.

Usage: python experiments/aot_26b.py [--dispatch ragged|sorted|dense] [--num_layers 30] [--batch 8 --seq 4096]
       [--programs train_adamw,...] [--markdown]
"""

from __future__ import annotations

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

from hackable_diffusion.diffusion import objectives, processes, schedules  # noqa: E402
from hackable_diffusion.models import attention, partitioning, presets, transformer  # noqa: E402
from hackable_diffusion.models.config import TransformerConfig  # noqa: E402
from hackable_diffusion.training import optimizers, sharding, train_state  # noqa: E402

PyTree = Any
GPU_BYTES = 80e9
NO_LICM = {"xla_disable_hlo_passes": "while-loop-invariant-code-motion"}
PROGRAMS = ("train_adamw", "train_adafactor", "canvas_denoise", "append", "decode_1")
MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "alias_size_in_bytes",
    "temp_size_in_bytes",
    "generated_code_size_in_bytes",
)


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
    programs: tuple[str, ...] = PROGRAMS
    compiler_options: dict[str, Any] | None = None  # XLA options (tests use a low backend optimisation level)


# ---------------------------------------------------------------------------------------------------------------
# Abstract, sharded inputs and analytic sizes.
# ---------------------------------------------------------------------------------------------------------------


def with_shardings(abstract: PyTree, shardings: PyTree) -> PyTree:
    """ShapeDtypeStructs carrying the given NamedShardings."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def per_device_bytes(tree: PyTree) -> int:
    """Bytes one device holds of a tree of sharded ShapeDtypeStructs (the largest shard, from `shard_shape`)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shard = leaf.sharding.shard_shape(leaf.shape)
        total += math.prod(shard) * jnp.dtype(leaf.dtype).itemsize
    return total


def global_bytes(tree: PyTree) -> int:
    return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def split_bytes(tree: PyTree) -> tuple[int, int]:
    """(global bytes of leaves sharded on some axis, per-device bytes of fully replicated leaves)."""
    sharded, replicated = 0, 0
    for leaf in jax.tree.leaves(tree):
        size = math.prod(leaf.shape) * jnp.dtype(leaf.dtype).itemsize
        if leaf.sharding.is_fully_replicated:
            replicated += size
        else:
            sharded += size
    return sharded, replicated


def leading_axis_sharding(mesh: Mesh, shape: Sequence[int], axis: int = 0) -> NamedSharding:
    """Dimension `axis` over the batch mesh axes (data, fsdp) if they divide it, otherwise replicated."""
    n = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)
    spec = [None] * len(shape)
    if shape[axis] % n == 0:
        spec[axis] = sharding.BATCH_AXES
    return NamedSharding(mesh, PartitionSpec(*spec))


def cache_shardings(mesh: Mesh, cache: attention.KVCache) -> attention.KVCache:
    """K/V (groups, b, s, kv_heads, hd), positions and valid (b, s): batch-sharded when divisible, else replicated."""
    layers = tuple({k: leading_axis_sharding(mesh, v.shape, axis=1) for k, v in layer.items()} for layer in cache.layers)
    return attention.KVCache(
        layers=layers,
        positions=leading_axis_sharding(mesh, cache.positions.shape),
        valid=leading_axis_sharding(mesh, cache.valid.shape),
        end_index=NamedSharding(mesh, PartitionSpec()),
    )


def sharded_params(model: transformer.Transformer, mesh: Mesh) -> tuple[PyTree, PyTree]:
    """(abstract params with NamedShardings, the shardings); raises if an expert weight is replicated over `expert`."""
    abstract = jax.eval_shape(lambda: transformer.init_params(model, jax.random.key(0)))
    shardings = sharding.param_shardings(abstract, partitioning.logical_axes, mesh, sharding.DEFAULT_RULES)
    offending = sharding.replicated_expert_params(abstract, shardings, partitioning.logical_axes)
    if offending:
        raise AssertionError(f"expert weights replicated across the expert mesh axis: {offending}")
    return with_shardings(abstract, shardings), shardings


def expert_param_report(params: PyTree) -> dict[str, str]:
    """Path -> PartitionSpec of every parameter with an `experts` logical axis (for the record)."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = sharding.path_to_names(path)
        if "experts" in partitioning.logical_axes(names, leaf.shape):
            out["/".join(names)] = f"{tuple(leaf.shape)} {leaf.sharding.spec}"
    return out


# ---------------------------------------------------------------------------------------------------------------
# Compile one program and report.
# ---------------------------------------------------------------------------------------------------------------


def _shapes(tree: PyTree) -> list[str]:
    return sorted({f"{jnp.dtype(x.dtype).name}{list(x.shape)}" for x in jax.tree.leaves(tree)})


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
    # keep_unused: the whole parameter tree is resident on the devices even where a program does not read every leaf
    # (the self-conditioner in append/decode), so it counts in the argument size.
    jitted = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings, donate_argnums=donate_argnums,
                     keep_unused=True, compiler_options=compiler_options)
    t0 = time.perf_counter()
    lowered = jitted.lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    stats = compiled.memory_analysis()
    memory = {f: int(getattr(stats, f)) for f in MEMORY_FIELDS}
    peak = getattr(stats, "peak_memory_in_bytes", None)
    if peak is not None:
        memory["peak_memory_in_bytes"] = int(peak)
    memory["live_bytes_per_device"] = (
        memory["argument_size_in_bytes"] + memory["output_size_in_bytes"] - memory["alias_size_in_bytes"]
        + memory["temp_size_in_bytes"]
    )
    report = {
        "program": name,
        "lower_s": round(t1 - t0, 2),
        "compile_s": round(t2 - t1, 2),
        "memory_per_device": memory,
        "analytic_argument_bytes_per_device": per_device_bytes(args),
    }
    report.update(extra or {})
    return report, compiled


def _gib(x: float) -> float:
    return round(x / 2**30, 3)


# ---------------------------------------------------------------------------------------------------------------
# The programs.
# ---------------------------------------------------------------------------------------------------------------


def _loss_fn(objective: str, model: transformer.Transformer, canvas: int):
    if objective == "ar":
        return objectives.AutoregressiveObjective(model), "AutoregressiveObjective (next-token CE, causal)"
    if objective == "block_diffusion":
        process = processes.MaskingProcess(
            vocab_size=model.cfg.vocab_size, schedule=schedules.LinearSchedule(), mask_id=3
        )
        sc_prob = 0.5 if model.cfg.self_conditioning else 0.0
        loss = objectives.DiffusionPretrainObjective(
            model, process, canvas_len=canvas, loss="canvas_ce", encoder_ar_weight=1.0, self_condition_prob=sc_prob
        )
        return loss, (f"DiffusionPretrainObjective (block diffusion, canvas {canvas}, masking, canvas CE + encoder AR, "
                      f"self_condition_prob {sc_prob})")
    raise ValueError(f"unknown objective {objective!r}; choose 'ar' or 'block_diffusion'.")


def train_program(
    settings: AotSettings, mesh: Mesh, optimizer_name: str
) -> tuple[dict[str, Any], Any]:
    cfg = TransformerConfig.from_dict(settings.model).replace(remat=settings.remat)
    model = transformer.Transformer(cfg)
    params, p_shardings = sharded_params(model, mesh)
    opt_cfg = ml_collections.ConfigDict(
        dict(name=optimizer_name, peak_lr=1e-4, end_lr=1e-5, warmup_steps=100, total_steps=10_000,
             weight_decay=0.1, clip_norm=1.0)
    )
    optimizer = optimizers.make_optimizer(opt_cfg)
    abstract_state = jax.eval_shape(
        lambda p: train_state.TrainState.create(p, optimizer, jax.random.key(0)), params
    )
    s_shardings = sharding.state_shardings(abstract_state, p_shardings, mesh)
    state = with_shardings(abstract_state, s_shardings)
    b, l = settings.train_batch, settings.train_seq
    batch_sharding = sharding.batch_sharding(mesh)
    batch = {"tokens": jax.ShapeDtypeStruct((b, l), jnp.int32, sharding=batch_sharding)}
    loss_fn, loss_name = _loss_fn(settings.objective, model, settings.canvas)
    step = train_state.make_train_step(loss_fn, optimizer)
    replicated = NamedSharding(mesh, PartitionSpec())
    opt_sharded, opt_replicated = split_bytes(state.opt_state)
    extra = {
        "optimizer": optimizer_name,
        "objective": loss_name,
        "remat": cfg.remat,
        "batch_shape": [b, l],
        "batch_spec": str(batch_sharding.spec),
        "param_dtype": cfg.param_dtype,
        "compute_dtype": cfg.compute_dtype,
        "master_weights": "f32" if cfg.param_dtype == "float32" else f"none ({cfg.param_dtype} params updated in place)",
        "opt_state_dtypes": sorted({jnp.dtype(x.dtype).name for x in jax.tree.leaves(state.opt_state)}),
        "params_bytes_per_device": per_device_bytes(state.params),
        "opt_state_bytes_per_device": per_device_bytes(state.opt_state),
        "opt_state_replicated_bytes": opt_replicated,
        "state_sharded_global_bytes": split_bytes(state)[0],
        "state_replicated_bytes": split_bytes(state)[1],
    }
    return compile_program(
        f"train_{optimizer_name}", step, (state, batch), out_shardings=(s_shardings, replicated),
        donate_argnums=(0,), extra=extra, compiler_options=settings.compiler_options,
    )


def _inference_setup(settings: AotSettings, mesh: Mesh):
    cfg = TransformerConfig.from_dict(settings.model)
    model = transformer.Transformer(cfg)
    params, _ = sharded_params(model, mesh)
    abstract_cache = jax.eval_shape(lambda: attention.init_cache(cfg, settings.decode_batch, settings.cache_len))
    cache = with_shardings(abstract_cache, cache_shardings(mesh, abstract_cache))
    return cfg, model, params, cache


def _inference_extra(cfg: TransformerConfig, params: PyTree, cache: PyTree, tokens_shape) -> dict[str, Any]:
    cache_sharded, cache_replicated = split_bytes(cache)
    return {
        "tokens_shape": list(tokens_shape),
        "cache_len": cache.length,
        "cache_dtype": jnp.dtype(cache.layers[0]["k"].dtype).name,
        "cache_spec": str(cache.layers[0]["k"].sharding.spec),
        "param_dtype": cfg.param_dtype,
        "compute_dtype": cfg.compute_dtype,
        "params_bytes_per_device": per_device_bytes(params),
        "cache_bytes_per_device": per_device_bytes(cache),
        "state_sharded_global_bytes": split_bytes(params)[0] + cache_sharded,
        "state_replicated_bytes": split_bytes(params)[1] + cache_replicated,
    }


def canvas_denoise_program(settings: AotSettings, mesh: Mesh) -> tuple[dict[str, Any], Any]:
    cfg, model, params, cache = _inference_setup(settings, mesh)
    shape = (settings.decode_batch, settings.canvas)
    tokens = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=leading_axis_sharding(mesh, shape))
    logits_sharding = leading_axis_sharding(mesh, (*shape, cfg.vocab_size))
    args = [params, tokens, cache]
    if cfg.self_conditioning:
        sc_shape = (*shape, cfg.embed_dim)
        sc = jax.ShapeDtypeStruct(sc_shape, jnp.dtype(cfg.compute_dtype), sharding=leading_axis_sharding(mesh, sc_shape))
        args.append(sc)

        def fn(p, t, c, s):
            return transformer.decode_block(model, p, t, c, sc_signal=s)[0]
    else:

        def fn(p, t, c):
            return transformer.decode_block(model, p, t, c)[0]

    extra = _inference_extra(cfg, params, cache, shape)
    extra["self_conditioning_input"] = cfg.self_conditioning
    return compile_program("canvas_denoise", fn, args, out_shardings=logits_sharding, extra=extra,
                           compiler_options=settings.compiler_options)


def append_program(settings: AotSettings, mesh: Mesh, length: int) -> tuple[dict[str, Any], Any]:
    cfg, model, params, cache = _inference_setup(settings, mesh)
    shape = (settings.decode_batch, length)
    tokens = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=leading_axis_sharding(mesh, shape))
    logits_sharding = leading_axis_sharding(mesh, (*shape, cfg.vocab_size))
    cache_out = jax.tree.map(lambda a: a.sharding, cache)

    def fn(p, t, c):
        return transformer.append(model, p, t, c)

    extra = _inference_extra(cfg, params, cache, shape)
    name = "decode_1" if length == 1 else f"append_{length}"
    return compile_program(
        name, fn, (params, tokens, cache), out_shardings=(logits_sharding, cache_out), donate_argnums=(2,),
        extra=extra, compiler_options=settings.compiler_options,
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

    lower_bound: everything (state, temporaries, outputs) shards perfectly, i.e. the 8-device total
      live_bytes_per_device * 8 spread over n GPUs; the smallest n with total / n <= gpu_bytes.
    at_compiled_per_device_batch: state that is sharded here (params, optimizer state, cache) shards 1/n over n GPUs
      (the fsdp axis grows), replicated state stays whole on every GPU, and temporaries + non-state arguments/outputs
      stay at their measured per-device size, i.e. the per-device batch is kept (the global batch grows with n).
      n = ceil(sharded_state / (gpu_bytes - replicated_state - per_device_rest)), rounded up to a power of two
      (the expert count 128 and the batch must divide the mesh); "does not fit" when the rest alone exceeds a GPU.
    """
    mem = report["memory_per_device"]
    live = mem["live_bytes_per_device"]
    total = live * num_devices
    lower = max(1, math.ceil(total / gpu_bytes))
    sharded = report["state_sharded_global_bytes"]
    replicated = report["state_replicated_bytes"]
    state_here = report["params_bytes_per_device"] + report.get("opt_state_bytes_per_device", 0) + report.get(
        "cache_bytes_per_device", 0)
    donated = mem["alias_size_in_bytes"] > 0
    # Per-device bytes that are not state: temporaries, the batch, and outputs that are not donated state buffers.
    rest = live - state_here
    room = gpu_bytes - replicated - rest
    if room <= 0:
        at_batch: int | str = "does not fit"
    else:
        n = max(1, math.ceil(sharded / room))
        at_batch = 1 << (n - 1).bit_length()
    return {
        "program": report["program"],
        "live_bytes_per_device": live,
        "total_bytes_8_devices": total,
        "gpus_80gb_lower_bound": lower,
        "non_state_bytes_per_device": rest,
        "state_donated": donated,
        "gpus_80gb_at_compiled_per_device_batch": at_batch,
        "batch": report.get("batch_shape", report.get("tokens_shape")),
    }


def markdown_table(summary: dict[str, Any]) -> str:
    rows = [
        "| program | batch | per-device live GiB (8 dev) | params GiB/dev | opt GiB/dev | temp GiB/dev | compile s |"
        " 80GB GPUs (lower bound) | 80GB GPUs (same per-device batch) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary["programs"]:
        rows.append(
            f"| {row['program']} | {row['batch']} | {_gib(row['live_bytes_per_device'])} | {row['params_gib']} | "
            f"{row['opt_gib']} | {row['temp_gib']} | {row['compile_s']} | {row['gpus_80gb_lower_bound']} | "
            f"{row['gpus_80gb_at_compiled_per_device_batch']} |"
        )
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------------------------
# Main.
# ---------------------------------------------------------------------------------------------------------------


def run(settings: AotSettings, emit: Callable[[dict[str, Any]], None] = lambda r: None) -> dict[str, Any]:
    """Compiles `settings.programs`; calls `emit(report)` per program and returns the summary."""
    unknown = [p for p in settings.programs if p not in PROGRAMS]
    if unknown:
        raise ValueError(f"unknown programs {unknown}; choose from {list(PROGRAMS)}.")
    mesh = sharding.make_mesh(settings.mesh)
    cfg = TransformerConfig.from_dict(settings.model)
    model = transformer.Transformer(cfg)
    params, _ = sharded_params(model, mesh)
    mesh_shape = dict(mesh.shape)
    common = {
        "mesh": mesh_shape,
        "num_layers": cfg.num_layers,
        "scanned_groups": cfg.num_groups,
        "layer_pattern_len": len(cfg.layer_pattern),
        "dispatch": cfg.moe.dispatch if cfg.moe else None,
        "backend": jax.default_backend(),
    }
    header = dict(
        common,
        program="params",
        total_params=sum(math.prod(x.shape) for x in jax.tree.leaves(params)),
        params_global_bytes=global_bytes(params),
        params_bytes_per_device=per_device_bytes(params),
        expert_param_specs=expert_param_report(params),
        replicated_expert_params=[],
    )
    emit(header)
    builders = build_programs(settings, mesh)
    rows = []
    num_devices = mesh.size
    for name in settings.programs:
        report, compiled = builders[name]()
        del compiled
        report = dict(common, **report)
        mem = report["memory_per_device"]
        report["analytic_vs_compiled_argument_ratio"] = round(
            report["analytic_argument_bytes_per_device"] / max(mem["argument_size_in_bytes"], 1), 4
        )
        emit(report)
        gpus = gpus_needed(report, num_devices)
        gpus.update(
            params_gib=_gib(report["params_bytes_per_device"]),
            opt_gib=_gib(report.get("opt_state_bytes_per_device", 0)),
            temp_gib=_gib(mem["temp_size_in_bytes"]),
            compile_s=report["compile_s"],
        )
        rows.append(gpus)
    return dict(
        common,
        program="summary",
        gpu_bytes=GPU_BYTES,
        assumptions=(
            "lower_bound = ceil(8 * live_bytes_per_device / 80e9): everything shards perfectly. "
            "same per-device batch: sharded state (params, optimizer, cache) / n + replicated state + measured "
            "non-state per-device bytes (temporaries, batch, logits) <= 80e9, n rounded up to a power of two; the "
            "global batch grows with n. CPU temporaries are XLA:CPU's buffer assignment; with dispatch 'ragged' "
            "they include the masked-dense ragged_dot expansion the GPU does not have."
        ),
        programs=rows,
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dispatch", default=None, choices=["ragged", "sorted", "dense"],
                   help="MoE dispatch (default: the preset's, 'ragged').")
    p.add_argument("--num_layers", type=int, default=None, help="Depth (multiple of 6); default the preset's 30.")
    p.add_argument("--param_dtype", default=None, choices=["bfloat16", "float32"],
                   help="Parameter dtype (default: the preset's bfloat16; float32 = f32 master weights).")
    p.add_argument("--no_self_conditioning", action="store_true",
                   help="Drop DiffusionGemma's self-conditioner (then the model is plain Gemma-4 26B-A4B).")
    p.add_argument("--mesh", default="data=1,fsdp=2,expert=4,tensor=1", help="Mesh axis sizes (8 devices).")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--decode_batch", type=int, default=1)
    p.add_argument("--canvas", type=int, default=256)
    p.add_argument("--cache_len", type=int, default=4096)
    p.add_argument("--append_len", type=int, default=256)
    p.add_argument("--objective", default="ar", choices=["ar", "block_diffusion"])
    p.add_argument("--remat", default="full", choices=["none", "full", "dots"], help="Training programs only.")
    p.add_argument("--programs", default=",".join(PROGRAMS))
    p.add_argument("--licm", default="off", choices=["on", "off"],
                   help="XLA's while-loop-invariant-code-motion pass. On CPU it hoists an f32 copy of every scanned "
                        "bf16 weight stack out of the layer loop (a CPU-only artifact, see the module docstring); "
                        "'off' (default) disables that pass for these programs.")
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
        key, _, value = item.partition("=")
        mesh[key.strip()] = int(value)
    return AotSettings(
        model=model, mesh=mesh, train_batch=args.batch, train_seq=args.seq, decode_batch=args.decode_batch,
        canvas=args.canvas, cache_len=args.cache_len, append_len=args.append_len, objective=args.objective,
        remat=args.remat, programs=tuple(p for p in args.programs.split(",") if p),
        compiler_options=None if args.licm == "on" else dict(NO_LICM),
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    settings = settings_from_args(args)
    t0 = time.perf_counter()
    summary = run(settings, emit=lambda r: print(json.dumps(r), flush=True))
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(summary), flush=True)
    if args.markdown:
        print(markdown_table(summary))


if __name__ == "__main__":
    main()
