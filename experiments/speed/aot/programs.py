"""The compiled programs of the AOT report (train steps, canvas denoise, cache appends) and the summary of a run.

`memory_at_batch` adds the decode programs at several batch sizes: the model call of a canvas step alone
(`canvas_denoise`), the sampler's whole canvas loop around it (`canvas_sample`: `sampling.canvas._denoise` with
DiffusionGemma's sampler -- uniform process, entropy bound 0.1, annealed temperature, Gumbel-max draw, stability and
entropy early stopping, self-conditioning -- for each `DiffusionSampler.vocab_chunk` asked for), and the cache
appends of AR decoding (`append_256`, `decode_1`), each with XLA's temporary and argument bytes per device.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import resource
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from aot.layout import (
    GPU_BYTES,
    MEMORY_FIELDS,
    AotSettings,
    PyTree,
    cache_shardings,
    depth_split,
    expert_param_specs,
    global_bytes,
    gpus_needed,
    leading_axis_sharding,
    make_model,
    per_device_bytes,
    sharded_params,
    split_bytes,
    with_shardings,
)
from hackable_diffusion.diffusion import objectives, processes, schedules
from hackable_diffusion.models import attention, transformer
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.sampling import canvas as canvas_lib
from hackable_diffusion.sampling.sampler import DiffusionSampler
from hackable_diffusion.training import optimizers, sharding, train_state


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


def canvas_sample_program(
    settings: AotSettings, mesh: Mesh, vocab_chunk: int, num_steps: int = 48
) -> tuple[dict[str, Any], Any]:
    """The sampler's canvas loop, `canvas._denoise` (a `lax.while_loop` of `num_steps` model calls and sampling
    steps), with DiffusionGemma's sampler over the whole vocabulary and `vocab_chunk` (0 = off)."""
    cfg, model, params, cache = _inference_setup(settings, mesh)
    b, c = settings.decode_batch, settings.canvas
    axes = settings.batch_axes
    row_sharding = leading_axis_sharding(mesh, (b,), axes)
    canvas_sharding = leading_axis_sharding(mesh, (b, c), axes)
    tokens = jax.ShapeDtypeStruct((b, c), jnp.int32, sharding=canvas_sharding)
    # the row keys as raw threefry key data (b, 2), wrapped inside the program (typed keys have no byte size here)
    key_data = jax.ShapeDtypeStruct((b, 2), jnp.uint32, sharding=leading_axis_sharding(mesh, (b, 2), axes))
    fixed = jax.ShapeDtypeStruct((b, c), jnp.bool_, sharding=canvas_sharding)
    active = jax.ShapeDtypeStruct((b,), jnp.bool_, sharding=row_sharding)
    sampler = DiffusionSampler.diffusiongemma(
        cfg.vocab_size, num_steps=num_steps, canvas_length=c, vocab_chunk=vocab_chunk
    )

    def fn(p, cache_, canvas, key_data_, fixed_, active_):
        keys = jax.random.wrap_key_data(key_data_)
        return canvas_lib._denoise(
            model, p, cache_, canvas, keys, fixed_, active_, sampler=sampler, return_trajectory=False
        )

    out_shardings = canvas_lib.CanvasResult(
        canvas=canvas_sharding, steps=row_sharding, forward_passes=NamedSharding(mesh, PartitionSpec())
    )
    extra = _inference_extra(settings, cfg, params, cache, (b, c))
    extra.update(
        vocab_chunk=vocab_chunk,
        num_steps=num_steps,
        sampler="DiffusionGemma: uniform process, entropy bound 0.1, annealed 0.8 -> 0.4, Gumbel-max, stability + "
        "entropy early stopping, self-conditioning" + (" (model has none)" if not cfg.self_conditioning else ""),
        logits_bytes_per_row=c * cfg.vocab_size * 4,
    )
    return compile_program(
        "canvas_sample",
        fn,
        (params, cache, tokens, key_data, fixed, active),
        out_shardings=out_shardings,
        extra=extra,
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


def _memory_row(report: dict[str, Any]) -> dict[str, Any]:
    mem = report["memory_per_device"]
    return {
        "program": report["program"],
        "batch": report["tokens_shape"][0],
        "vocab_chunk": report.get("vocab_chunk"),
        "temp_bytes": mem["temp_size_in_bytes"],
        "argument_bytes": mem["argument_size_in_bytes"],
        "temp_gib": _gib(mem["temp_size_in_bytes"]),
        "argument_gib": _gib(mem["argument_size_in_bytes"]),
        "output_gib": _gib(mem["output_size_in_bytes"]),
        "live_gib": _gib(mem["live_bytes_per_device"]),
        "compile_s": report["compile_s"],
    }


def _gib(x: float) -> float:
    return round(x / 2**30, 2)


def memory_at_batch(
    settings: AotSettings,
    batches: Sequence[int],
    vocab_chunks: Sequence[int],
    emit: Callable[[dict[str, Any]], None] = lambda r: None,
    num_steps: int = 48,
) -> dict[str, Any]:
    """Compiles the decode programs at every batch size: `canvas_denoise` (the model call alone), `canvas_sample`
    (the sampler's canvas loop) for each vocab chunk (0 = off), `append_<append_len>` and `decode_1`; calls
    `emit(report)` for each and returns a summary whose `rows` hold temp / argument / output GiB per device."""
    mesh = sharding.make_mesh(settings.mesh)
    cfg = TransformerConfig.from_dict(settings.model)
    common = {
        "mesh": dict(mesh.shape),
        "num_layers": cfg.num_layers,
        "vocab_size": cfg.vocab_size,
        "canvas": settings.canvas,
        "cache_len": settings.cache_len,
        "dispatch": cfg.moe.dispatch if cfg.moe else None,
        "backend": jax.default_backend(),
    }
    rows = []
    for batch in batches:
        at = dataclasses.replace(settings, decode_batch=batch)
        compiles = [functools.partial(canvas_denoise_program, at, mesh)]
        compiles += [functools.partial(canvas_sample_program, at, mesh, chunk, num_steps) for chunk in vocab_chunks]
        compiles += [functools.partial(append_program, at, mesh, length) for length in (at.append_len, 1)]
        for make in compiles:
            report, _ = make()
            report = dict(common, **report)
            emit(report)
            rows.append(_memory_row(report))
    return dict(
        common,
        program="memory_at_batch",
        batches=list(batches),
        vocab_chunks=list(vocab_chunks),
        logits_bytes_per_row=settings.canvas * cfg.vocab_size * 4,  # one canvas's float32 logits
        rows=rows,
        max_rss_gib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    )


def memory_table(summary: dict[str, Any]) -> str:
    """The `memory_at_batch` summary as a markdown table: one line per batch, temp (argument) GiB per program."""
    chunks = summary["vocab_chunks"]
    by_key = {(r["batch"], r["program"], r["vocab_chunk"]): r for r in summary["rows"]}
    heads = ["batch", "logits GiB (whole batch)", "model call temp"]
    heads += [f"canvas step, vocab_chunk {'off' if k == 0 else k}: temp (argument)" for k in chunks]
    appends = sorted({r["program"] for r in summary["rows"] if r["program"].startswith(("append", "decode"))})
    heads += [f"{name} temp (argument)" for name in appends]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for batch in summary["batches"]:
        model = by_key[(batch, "canvas_denoise", None)]
        logits = summary["logits_bytes_per_row"] * batch / 2**30
        cells = [str(batch), f"{logits:.2f}", f"{model['temp_gib']:.2f}"]
        for k in chunks:
            row = by_key[(batch, "canvas_sample", k)]
            cells.append(f"{row['temp_gib']:.2f} ({row['argument_gib']:.2f})")
        for name in appends:
            row = by_key[(batch, name, None)]
            cells.append(f"{row['temp_gib']:.2f} ({row['argument_gib']:.2f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
