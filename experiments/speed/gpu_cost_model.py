"""A GPU cost model of DiffusionGemma 26B-A4B decoding, read from the compiled programs and set against published GPU
peaks and vLLM's measured speed.

  python experiments/speed/gpu_cost_model.py --out results/gpu_cost_model

1. Compiles, ahead of time on ONE CPU device (nothing allocated: `experiments/speed/aot/`), the programs decoding
   runs, at batch 1 and 8: the canvas denoising step (`canvas_denoise`: decoder mode over a 256-token canvas against a
   4,096-slot KV cache, with the self-conditioning input), the AR step (`transformer.append` of 1 token), the prefill
   of a 256- and a 1,024-token prompt and the canvas commit (`append` of 256 / 1,024 tokens; the 256-token prefill and
   the commit are one program). The layer scan is unrolled (XLA's cost analysis counts a loop body once).
2. Reads XLA's `cost_analysis()` (flops, bytes accessed) of each and sets it against the analytic counts of
   `experiments/speed/aot/costs.py`: `compiled_counts` (what the program computes as compiled: every cache slot,
   every position's logits, the dispatch's expert rows; bytes = every argument read once) and `ideal_counts` (what
   the step must do). It also parses the optimized HLO for the matmul FLOPs and splits "bytes accessed" by kind.
   `--compare_dispatches sorted,dense` adds the canvas and AR steps at batch 1 with those MoE dispatches.
3. Predicts step times on H100 SXM, H200 and B200 from their published dense peaks (`roofline.HARDWARE`, with sources)
   as a roofline, max(FLOPs / peak, bytes / bandwidth) of the ideal counts: a lower bound on time (no kernel
   efficiency is assumed), in bf16 and FP8 weights (FP8: weight bytes halved, FLOPs at the FP8 peak). Canvas tokens/s
   = batch x 256 / ((steps + 1) x canvas step), the +1 the commit; AR tokens/s = batch / AR step. Time to first
   token, as `decode_bench.py` defines it: prefill + steps x canvas step + commit (diffusion), prefill + one AR step.
4. Sets vLLM's measured tokens/s (`VLLM_MEASURED`) against the FP8 prediction.

Printed: one JSON line per compiled program (`"kind": "xla_check"`), one per hardware x weights x batch
(`"kind": "roofline"`), one per vLLM figure (`"kind": "vllm"`). `--out DIR` also writes `gpu_cost_model.jsonl` and
`gpu_cost_model.md` (the tables of docs/scaling.md) there. `--no_compile` skips steps 1-2 (seconds instead of
minutes). Results and discussion: docs/scaling.md, "GPU cost model".
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402

from aot import costs, roofline, xla_counts  # noqa: E402
from hackable_diffusion.models import presets  # noqa: E402
from hackable_diffusion.models.config import TransformerConfig  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Measured:
    """A published measurement of DiffusionGemma's decode speed."""

    hardware: str  # a key of roofline.HARDWARE
    weights: str
    steps: int
    batch: int
    tokens_per_s: float
    source: str


VLLM_MEASURED = (
    Measured(
        hardware="H100 SXM",
        weights="fp8",
        steps=16,
        batch=1,
        tokens_per_s=1003.79,
        source="vLLM pull request 46212 (DiffusionGemma support, benchmark in its description): 1,003.79 output "
        "tokens/s on one H100, FP8 checkpoint, 16 denoising steps per canvas, concurrency 1.",
    ),
    Measured(
        hardware="H200 SXM",
        weights="fp8",
        steps=16,
        batch=1,
        tokens_per_s=1288.0,
        source="vLLM's DiffusionGemma announcement (blog, 2026-06-10) and its press coverage: 1,288 tokens/s on an "
        "H200 (taken here as the same setting as the H100 figure: FP8, 16 steps, concurrency 1).",
    ),
)


def programs_at(batch: int, canvas: int, context: int, prompts: Sequence[int]) -> list[costs.Program]:
    """The decode programs at one batch size: canvas step, AR step and commit against `context` cached tokens, and
    the prefill of each prompt length (into an empty cache; the last position's logits)."""
    out = [
        costs.Program("canvas_step", "canvas", batch, canvas, context, canvas),
        costs.Program("ar_step", "append", batch, 1, context, 1),
        costs.Program("commit", "append", batch, canvas, context, 0),
    ]
    out += [costs.Program(f"prefill_{p}", "append", batch, p, 0, 1) for p in prompts]
    return out


def _ratio(a: float, b: float) -> float:
    return round(a / b, 4) if b else float("nan")


def check_program(
    model: dict[str, Any],
    cfg: TransformerConfig,
    sizes: costs.ParamSizes,
    compiled_as: costs.Program,
    same_program: Sequence[costs.Program],
    cache_slots: int,
) -> dict[str, Any]:
    """Compiles `compiled_as`, reads XLA's counts and sets them against the analytic ones (`same_program`: the
    decode programs this compiled program serves, e.g. the 256-token prefill and the commit)."""
    report, compiled = xla_counts.compile_decode_program(model, compiled_as, cache_slots)
    xla = xla_counts.xla_costs(compiled)
    analytic = costs.compiled_counts(cfg, sizes, compiled_as, cache_slots)
    ideal = {p.name: costs.ideal_counts(cfg, sizes, p, weight_bytes=2, sampler=False) for p in same_program}
    moved = sum(xla["bytes_by_kind"].values())
    return {
        "kind": "xla_check",
        "program": "+".join(p.name for p in same_program),
        "compiled": "canvas_denoise" if compiled_as.mode == "canvas" else f"append_{compiled_as.tokens}",
        "batch": compiled_as.batch,
        "tokens": compiled_as.tokens,
        "cache_slots": cache_slots,
        "dispatch": cfg.moe.dispatch if cfg.moe else None,
        "compile_s": report["compile_s"],
        "argument_bytes": report["memory_per_device"]["argument_size_in_bytes"],
        "xla": {k: v for k, v in xla.items() if k != "bytes_by_kind"},
        "xla_bytes_by_kind_share": {k: round(v / moved, 3) for k, v in sorted(xla["bytes_by_kind"].items())},
        "analytic_as_compiled": {
            "flops": analytic.flops,
            "bytes_read_once": analytic.bytes,
            "flops_parts": dict(analytic.flops_parts),
            "bytes_parts": dict(analytic.bytes_parts),
        },
        "analytic_ideal": {name: {"flops": c.flops, "bytes": c.bytes} for name, c in ideal.items()},
        "ratios": {
            "xla_flops_over_as_compiled": _ratio(xla["flops"], analytic.flops),
            "hlo_dot_flops_over_as_compiled": _ratio(xla["dot_flops"], analytic.flops),
            "xla_bytes_over_read_once": _ratio(xla["bytes_accessed"], analytic.bytes),
            "argument_bytes_over_read_once_params_and_cache": _ratio(
                report["memory_per_device"]["argument_size_in_bytes"],
                analytic.bytes_parts["params"] + analytic.bytes_parts["cache"],
            ),
            **{f"xla_flops_over_ideal_{n}": _ratio(xla["flops"], c.flops) for n, c in ideal.items()},
            **{f"hlo_dot_flops_over_ideal_{n}": _ratio(xla["dot_flops"], c.flops) for n, c in ideal.items()},
            **{f"xla_bytes_over_ideal_{n}": _ratio(xla["bytes_accessed"], c.bytes) for n, c in ideal.items()},
        },
    }


def xla_checks(
    model: dict[str, Any], batches: Sequence[int], canvas: int, context: int, prompts: Sequence[int], cache_slots: int
) -> list[dict[str, Any]]:
    cfg = TransformerConfig.from_dict(model)
    sizes = costs.param_sizes(cfg)
    lines = []
    for batch in batches:
        by_shape: dict[tuple[str, int], list[costs.Program]] = {}
        for program in programs_at(batch, canvas, context, prompts):
            by_shape.setdefault((program.mode, program.tokens), []).append(program)
        for (mode, tokens), same in by_shape.items():
            compiled_as = costs.Program(same[0].name, mode, batch, tokens, 0, tokens)
            line = check_program(model, cfg, sizes, compiled_as, same, cache_slots)
            print(json.dumps(line), flush=True)
            lines.append(line)
    return lines


def roofline_lines(
    cfg: TransformerConfig,
    sizes: costs.ParamSizes,
    hardware: Sequence[roofline.Hardware],
    weights: Sequence[str],
    batches: Sequence[int],
    steps: Sequence[int],
    canvas: int,
    context: int,
    prompts: Sequence[int],
) -> list[dict[str, Any]]:
    lines = []
    for hw in hardware:
        for fmt in weights:
            for batch in batches:
                programs = {}
                for program in programs_at(batch, canvas, context, prompts):
                    counts = costs.ideal_counts(cfg, sizes, program, weight_bytes=roofline.WEIGHT_FORMATS[fmt])
                    roof = roofline.roofline(counts, hw, fmt)
                    weights_share = (
                        counts.bytes_parts["weights"]
                        + counts.bytes_parts["experts"]
                        + counts.bytes_parts.get("sc_signal", 0)
                    ) / counts.bytes
                    programs[program.name] = {
                        "step_s": roof.seconds,
                        "bound": roof.bound,
                        "compute_s": roof.compute_s,
                        "memory_s": roof.memory_s,
                        "flops": counts.flops,
                        "bytes": counts.bytes,
                        "weights_share_of_bytes": round(weights_share, 4),
                        "expert_fraction": costs.expert_fraction(cfg, batch * program.tokens),
                        "bytes_parts": dict(counts.bytes_parts),
                        "flops_parts": dict(counts.flops_parts),
                    }
                cv, ar, commit = (programs[n]["step_s"] for n in ("canvas_step", "ar_step", "commit"))
                ttft = {
                    str(p): {
                        **{str(s): programs[f"prefill_{p}"]["step_s"] + s * cv + commit for s in steps},
                        "ar": programs[f"prefill_{p}"]["step_s"] + ar,
                    }
                    for p in prompts
                }
                line = {
                    "kind": "roofline",
                    "hardware": hw.name,
                    "weights": fmt,
                    "batch": batch,
                    "canvas": canvas,
                    "context": context,
                    "peaks": {"tflops": hw.flops_per_s(fmt) / 1e12, "tb_per_s": hw.hbm_tb_per_s},
                    "programs": programs,
                    "ttft_s": ttft,
                    "tokens_per_s": {
                        **{str(s): roofline.canvas_tokens_per_s(batch, canvas, s, cv) for s in steps},
                        "ar": batch / ar,
                    },
                    "note": "roofline: a lower bound on time; no kernel efficiency assumed",
                }
                print(json.dumps(line), flush=True)
                lines.append(line)
    return lines


def vllm_lines(predictions: Sequence[dict[str, Any]], canvas: int) -> list[dict[str, Any]]:
    lines = []
    for m in VLLM_MEASURED:
        match = [
            p
            for p in predictions
            if p["hardware"] == m.hardware and p["weights"] == m.weights and p["batch"] == m.batch
        ]
        if not match or str(m.steps) not in match[0]["tokens_per_s"]:
            continue
        pred = match[0]
        predicted = pred["tokens_per_s"][str(m.steps)]
        step = pred["programs"]["canvas_step"]
        measured_step_s = m.batch * canvas / ((m.steps + 1) * m.tokens_per_s)
        hw = roofline.HARDWARE[m.hardware]
        line = {
            "kind": "vllm",
            "hardware": m.hardware,
            "weights": m.weights,
            "steps": m.steps,
            "batch": m.batch,
            "measured_tokens_per_s": m.tokens_per_s,
            "roofline_tokens_per_s": predicted,
            "fraction_of_roofline": round(m.tokens_per_s / predicted, 3),
            "implied_step_s": measured_step_s,
            "roofline_step_s": step["step_s"],
            "implied_bandwidth_tb_per_s": step["bytes"] / measured_step_s / 1e12,
            "implied_fraction_of_peak_bandwidth": round(step["bytes"] / measured_step_s / hw.bytes_per_s, 3),
            "source": m.source,
        }
        print(json.dumps(line), flush=True)
        lines.append(line)
    return lines


# ---------------------------------------------------------------------------------------------------------------------
# Markdown.


def _ms(x: float) -> str:
    return f"{1e3 * x:.2f}"


def prediction_table(predictions: Sequence[dict[str, Any]], batch: int, steps: Sequence[int], prompt: int) -> str:
    ttft_steps = str(max(steps))
    heads = [
        "GPU",
        "weights",
        "canvas step ms (bound)",
        "commit ms",
        "AR step ms (bound)",
        f"prefill {prompt} ms",
        f"TTFT ms, {ttft_steps} steps / AR",
    ]
    heads += [f"tok/s, {s} steps" for s in steps] + ["AR tok/s"]
    lines = ["| " + " | ".join(heads) + " |", "|---|---|" + "---:|" * (len(heads) - 2)]
    for p in predictions:
        if p["batch"] != batch:
            continue
        cv, ar = p["programs"]["canvas_step"], p["programs"]["ar_step"]
        ttft = p["ttft_s"][str(prompt)]
        cells = [
            p["hardware"],
            p["weights"],
            f"{_ms(cv['step_s'])} ({cv['bound']})",
            _ms(p["programs"]["commit"]["step_s"]),
            f"{_ms(ar['step_s'])} ({ar['bound']})",
            _ms(p["programs"][f"prefill_{prompt}"]["step_s"]),
            f"{_ms(ttft[ttft_steps])} / {_ms(ttft['ar'])}",
        ]
        cells += [f"{p['tokens_per_s'][str(s)]:,.0f}" for s in steps] + [f"{p['tokens_per_s']['ar']:,.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def check_table(checks: Sequence[dict[str, Any]]) -> str:
    heads = [
        "compiled program (serves)",
        "batch",
        "dispatch",
        "XLA GFLOP",
        "as compiled GFLOP",
        "ideal GFLOP",
        "XLA / as compiled",
        "HLO dots / as compiled",
        "XLA / ideal",
        "XLA GB accessed",
        "read-once GB",
        "ideal GB",
        "XLA / read-once",
        "argument copies share",
    ]
    lines = ["| " + " | ".join(heads) + " |", "|---|---:|---|" + "---:|" * (len(heads) - 3)]
    for c in checks:
        first = c["program"].split("+")[0]
        cells = [
            f"{c['compiled']} ({c['program'].replace('+', ', ')})",
            str(c["batch"]),
            str(c["dispatch"]),
            f"{c['xla']['flops'] / 1e9:,.0f}",
            f"{c['analytic_as_compiled']['flops'] / 1e9:,.0f}",
            f"{c['analytic_ideal'][first]['flops'] / 1e9:,.0f}",
            f"{c['ratios']['xla_flops_over_as_compiled']:.3f}",
            f"{c['ratios']['hlo_dot_flops_over_as_compiled']:.4f}",
            f"{c['ratios'][f'xla_flops_over_ideal_{first}']:.2f}",
            f"{c['xla']['bytes_accessed'] / 1e9:,.0f}",
            f"{c['analytic_as_compiled']['bytes_read_once'] / 1e9:,.1f}",
            f"{c['analytic_ideal'][first]['bytes'] / 1e9:,.1f}",
            f"{c['ratios']['xla_bytes_over_read_once']:.2f}",
            f"{c['xla_bytes_by_kind_share'].get('argument_copies', 0):.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def hardware_table() -> str:
    lines = [
        "| GPU | bf16 TFLOP/s (dense) | FP8 TFLOP/s (dense) | HBM TB/s | memory GB | source |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for hw in roofline.HARDWARE.values():
        lines.append(
            f"| {hw.name} | {hw.bf16_tflops:,.1f} | {hw.fp8_tflops:,.1f} | {hw.hbm_tb_per_s} | {hw.memory_gb} | "
            f"{hw.source} |"
        )
    return "\n".join(lines)


def vllm_table(lines: Sequence[dict[str, Any]]) -> str:
    out = [
        "| GPU | weights, steps | measured tok/s | roofline tok/s | fraction | implied canvas step ms (roofline) | "
        "implied bandwidth TB/s (of peak) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for v in lines:
        out.append(
            f"| {v['hardware']} | {v['weights']}, {v['steps']} | {v['measured_tokens_per_s']:,.0f} | "
            f"{v['roofline_tokens_per_s']:,.0f} | {v['fraction_of_roofline']:.2f} | {_ms(v['implied_step_s'])} "
            f"({_ms(v['roofline_step_s'])}) | {v['implied_bandwidth_tb_per_s']:.2f} "
            f"({v['implied_fraction_of_peak_bandwidth']:.0%}) |"
        )
    return "\n".join(out)


def markdown(
    args: argparse.Namespace,
    checks: Sequence[dict[str, Any]],
    predictions: Sequence[dict[str, Any]],
    vllm: Sequence[dict[str, Any]],
    wall_s: float,
) -> str:
    prompt = max(args.prompts)
    parts = [f"# GPU cost model of DiffusionGemma 26B-A4B decoding\n\nWall time {wall_s:.0f} s, jax {jax.__version__}."]
    for batch in args.batches:
        parts.append(
            f"## Roofline at batch {batch} (context {args.context} cached tokens, canvas {args.canvas}; TTFT with a "
            f"{prompt}-token prompt)\n\n" + prediction_table(predictions, batch, args.steps, prompt)
        )
    if vllm:
        parts.append("## vLLM's measurements against the roofline\n\n" + vllm_table(vllm))
    if checks:
        parts.append(
            f"## XLA's cost analysis against the analytic counts (one CPU device, cache {args.cache_len} slots)\n\n"
            + check_table(checks)
        )
    parts.append("## Hardware\n\n" + hardware_table())
    return "\n\n".join(parts) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,8")
    p.add_argument("--steps", default="4,8,16", help="denoising steps per canvas")
    p.add_argument("--prompts", default="256,1024", help="prompt lengths of the prefill programs")
    p.add_argument("--context", type=int, default=1024, help="valid cached tokens for the canvas, AR and commit steps")
    p.add_argument("--canvas", type=int, default=256)
    p.add_argument("--cache_len", type=int, default=4096, help="cache slots of the compiled programs")
    p.add_argument("--weights", default="bf16,fp8")
    p.add_argument("--hardware", default=",".join(roofline.HARDWARE))
    p.add_argument("--dispatch", default="", help="MoE dispatch of the compiled programs (default: the preset's)")
    p.add_argument(
        "--compare_dispatches",
        default="sorted,dense",
        help="also compile the canvas and AR steps at batch 1 with these dispatches ('' = none)",
    )
    p.add_argument("--num_layers", type=int, default=0, help="depth override (a multiple of 6), for quick runs")
    p.add_argument("--no_compile", action="store_true", help="the roofline only, no compiles")
    p.add_argument("--out", default="", help="folder for gpu_cost_model.jsonl and gpu_cost_model.md")
    args = p.parse_args(argv)
    for name in ("batches", "steps", "prompts"):
        setattr(args, name, [int(x) for x in getattr(args, name).split(",") if x])
    args.weights = [w for w in args.weights.split(",") if w]
    args.hardware = [h for h in args.hardware.split(",") if h]
    args.compare_dispatches = [d for d in args.compare_dispatches.split(",") if d]
    unknown = [h for h in args.hardware if h not in roofline.HARDWARE] + [
        w for w in args.weights if w not in roofline.WEIGHT_FORMATS
    ]
    if unknown:
        choices = f"{list(roofline.HARDWARE)} / {list(roofline.WEIGHT_FORMATS)}"
        p.error(f"unknown --hardware / --weights {unknown}; choose from {choices}")
    if not args.batches or not args.steps or not args.prompts or min(args.batches + args.steps + args.prompts) < 1:
        p.error("--batches, --steps and --prompts must be positive integers")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    start = time.perf_counter()
    model = presets.diffusiongemma_26b_a4b()
    if args.dispatch:
        model["moe"] = dict(model["moe"], dispatch=args.dispatch)
    if args.num_layers:
        model["num_layers"] = args.num_layers
    cfg = TransformerConfig.from_dict(model)
    sizes = costs.param_sizes(cfg)
    checks: list[dict[str, Any]] = []
    if not args.no_compile:
        checks += xla_checks(model, args.batches, args.canvas, args.context, args.prompts, args.cache_len)
        for dispatch in args.compare_dispatches:
            other = dict(model, moe=dict(model["moe"], dispatch=dispatch))
            other_cfg = TransformerConfig.from_dict(other)
            for program in programs_at(1, args.canvas, args.context, args.prompts)[:2]:
                compiled_as = costs.Program(program.name, program.mode, 1, program.tokens, 0, program.tokens)
                line = check_program(other, other_cfg, sizes, compiled_as, [program], args.cache_len)
                print(json.dumps(line), flush=True)
                checks.append(line)
    hardware = [roofline.HARDWARE[h] for h in args.hardware]
    predictions = roofline_lines(
        cfg, sizes, hardware, args.weights, args.batches, args.steps, args.canvas, args.context, args.prompts
    )
    vllm = [] if args.num_layers else vllm_lines(predictions, args.canvas)  # measured on the full depth only
    wall_s = time.perf_counter() - start
    summary = {
        "kind": "summary",
        "wall_s": round(wall_s, 1),
        "max_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "params": sizes.total,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
    }
    print(json.dumps(summary), flush=True)
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "gpu_cost_model.jsonl", "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in [*checks, *predictions, *vllm, summary])
        (out / "gpu_cost_model.md").write_text(markdown(args, checks, predictions, vllm, wall_s))


if __name__ == "__main__":
    main()
