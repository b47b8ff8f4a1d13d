"""Ahead-of-time compile of DiffusionGemma 26B-A4B on a simulated 8-device CPU mesh, with a per-device memory report.

The programs, figures and caveats: `experiments/speed/aot/` (its package docstring).

Usage: python experiments/speed/aot_26b.py [--dispatch ragged|sorted|dense] [--num_layers 30] [--batch 8 --seq 4096]
       [--layout constrained|toolbox] [--batch_axes data,fsdp,expert] [--programs train_adamw,...] [--markdown]
       [--num_devices 16 --mesh data=1,fsdp=4,expert=4,tensor=1]
       [--memory_at_batch 1,4,8,16 --vocab_chunks 0,16384]   (the decode programs at each batch instead)
       [--weight_memory bf16,fp8,nvfp4]   (only the weights' bytes in each format, analytic: nothing compiled)
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
import json  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402

import jax  # noqa: E402

from aot.layout import LAYOUTS, NO_LICM, PROGRAMS, AotSettings, mesh_from_spec  # noqa: E402
from aot.programs import markdown_table, memory_at_batch, memory_table, run  # noqa: E402
from hackable_diffusion.models import presets  # noqa: E402


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
    p.add_argument(
        "--memory_at_batch",
        default="",
        help="Batch sizes, e.g. 1,4,8,16: compile the decode programs (model call, the sampler's canvas loop per "
        "--vocab_chunks, append, decode_1) at each instead of --programs.",
    )
    p.add_argument(
        "--vocab_chunks",
        default="0,16384",
        help="DiffusionSampler.vocab_chunk values of the canvas loop with --memory_at_batch (0 = off).",
    )
    p.add_argument("--num_steps", type=int, default=48, help="Denoising steps of the canvas loop (--memory_at_batch).")
    p.add_argument("--markdown", action="store_true", help="Also print the summary as a markdown table.")
    p.add_argument(
        "--weight_memory",
        default="",
        help="Comma-separated weight formats (bf16, fp8, nvfp4: 4.5 bits per weight with its block scales): print the "
        "weights' bytes in each, total and per device when fully sharded over the mesh, and compile nothing.",
    )
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
    mesh = mesh_from_spec(args.mesh)
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
    if args.weight_memory:
        from aot import costs
        from hackable_diffusion.models.config import TransformerConfig

        cfg = TransformerConfig.from_dict(settings.model)
        for weights in (w for w in args.weight_memory.split(",") if w):
            total = costs.weight_memory(cfg, weights)
            line = {"weights": weights, "bits_per_matmul_weight": costs.WEIGHT_BITS[weights], "gb": total / 1e9}
            print(json.dumps(dict(line, gb_per_device_fully_sharded=total / 1e9 / args.num_devices)), flush=True)
        return
    t0 = time.perf_counter()
    if args.memory_at_batch:
        batches = [int(x) for x in args.memory_at_batch.split(",") if x]
        chunks = [int(x) for x in args.vocab_chunks.split(",") if x]
        summary = memory_at_batch(
            settings, batches, chunks, emit=lambda r: print(json.dumps(r), flush=True), num_steps=args.num_steps
        )
        summary["wall_s"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(summary), flush=True)
        if args.markdown:
            print(memory_table(summary))
        return
    summary = run(settings, emit=lambda r: print(json.dumps(r), flush=True))
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(summary), flush=True)
    if args.markdown:
        print(markdown_table(summary))


if __name__ == "__main__":
    main()
