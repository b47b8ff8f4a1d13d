"""Decode programs against the hardware limits: prefill, one canvas denoising step, one AR decode step, and
block-autoregressive generation, each with the bytes it must read and the FLOPs it must do, against the device's
memory bandwidth and matmul peak measured in the same run.

  python experiments/speed/decode_bench.py --model small --steps 8,16
  python experiments/speed/decode_bench.py --model diffusiongemma_26b_a4b --dtype bfloat16 --steps 8,16,32,48   # a GPU

Random weights are created on the device by a jitted initialiser (no host copy of the parameters), in `--dtype`
(`auto`: bfloat16 on an accelerator, float32 on a CPU, where XLA's bf16 matmuls are slow). The prompt is `--prompt`
random tokens, the KV cache then holds prompt + `--canvases` canvases of `--canvas` tokens. Random weights make adaptive
stopping meaningless, so every canvas takes exactly the stated steps (early stopping off).

Peaks, measured here and now (the best of `--repeats` runs after a warm-up, so another job on the machine can only
lower them): memory bandwidth as the best of three streaming kernels over a buffer much larger than the caches (a
copy, a read-only sum, a matrix-vector product; XLA:CPU runs the copy on one thread), matmul FLOP/s from a square
matmul in `--dtype` (f32 accumulation).

Bytes a program must read: the weights it touches (all of a dense model; of a mixture of experts, the shared weights
plus the expected fraction of experts that `tokens` routed tokens reach, 1 - (1 - k/E)^tokens, per layer) plus the
valid part of the KV cache. FLOPs: 2 x active matmul parameters per token (the tied output head included) plus
attention (QK^T and PV over the keys each layer sees: the sliding window for local layers). Each program's time is the
median of `--repeats` calls after a compiling call. Time to first token: the first canvas generated (prefill, its
steps, the commit) for diffusion; the prefill plus one decode step for AR.

`--selection dilated,entropy_bound` times the canvas sampler under each selection rule (the rule a distilled or
few-step sampler decodes with; the step program is the same, the selection and generation figures are the rule's),
and `--process masking,uniform` under each kind of noise (a uniform sampler re-draws its undecided positions from the
prior at every step, as DiffusionGemma's reference does).

One JSON line per selection rule and steps-per-canvas setting: `canvas` and `ar` blocks with `tokens_per_s`, `step_s`,
`bytes_per_step`, `gbps`, `frac_bw_peak`, `flops_per_step`, `frac_flops_peak`, `ttft_s`; the prefill; `ratio` (canvas
tokens/s over AR tokens/s); the measured peaks and the device. `tokens_per_s_from_steps` is what the step programs alone
allow (canvas: canvas / ((steps + 1) x step time), the +1 being the commit; AR: 1 / step time). `--weights fp8`
quantizes the weights on the device (`models/quantize.py`) and the step programs read FP8 and dequantize inside; its
generation figures are then computed from the measured step programs (prefill + (steps + 1) canvas steps per canvas; AR:
one step per token), since the sampler itself takes plain weights. `--first_canvas 16,32` adds a `first_canvas` block
per length F: the time to first token when the first canvas holds only F tokens (then whole canvases, the last one F
shorter), its ratio to AR's, and the tokens/s of the whole answer with it (`tokens_per_s_loss` against the plain
canvases). `--out DIR` also writes `decode_bench.jsonl` and a markdown table there.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from benchmarking import best_time, interleaved_medians, median_time, model_shapes

from hackable_diffusion.diffusion.processes import MaskingProcess, UniformProcess
from hackable_diffusion.diffusion.schedules import LinearSchedule
from hackable_diffusion.models import presets
from hackable_diffusion.models import quantize as Q
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.models.param_count import EXPERT_LEAVES
from hackable_diffusion.sampling import autoregressive as ar_lib
from hackable_diffusion.sampling import generate as gen_lib
from hackable_diffusion.sampling import prompts as prompts_lib
from hackable_diffusion.sampling.canvas import canvas_logits
from hackable_diffusion.sampling.draws import DRAWS, make_draw
from hackable_diffusion.sampling.early_stopping import NoEarlyStop
from hackable_diffusion.sampling.sampler import DiffusionSampler
from hackable_diffusion.sampling.selection import SELECTION_RULES, make_selection
from hackable_diffusion.training.metrics import measure_peak_matmul_flops

SPECIAL_IDS = (0, 1, 2, 3)  # PAD, EOS, BOS, MASK: never sampled here
PRESETS = {
    "tiny": lambda: presets.tiny(vocab_size=128, moe=True),
    "quickstart": lambda: presets.quickstart(),
    "mini": lambda: presets.mini(),
    "mini_moe": lambda: presets.mini(moe=True),
    "small": lambda: presets.small(),
    "small_moe": lambda: presets.small(moe=True),
    "throughput_large": lambda: _throughput_size("large"),
    "gemma4_26b_a4b": presets.gemma4_26b_a4b,
    "diffusiongemma_26b_a4b": presets.diffusiongemma_26b_a4b,
}


def _throughput_size(name: str) -> dict:
    """A random-weight size of `throughput.py --quick` (`benchmarking.model_shapes`); "large": 80M dense parameters,
    3 layers of width 1024, a 32k vocabulary."""
    return model_shapes(quick=True)[name]


def model_config(name: str, dtype: str, dispatch: str, attention_impl: str = "einsum") -> TransformerConfig:
    if name not in PRESETS:
        raise SystemExit(f"error: unknown --model {name!r}; choose one of {sorted(PRESETS)}.")
    values = dict(PRESETS[name](), param_dtype=dtype, compute_dtype=dtype, attention_impl=attention_impl)
    if values.get("moe") and dispatch:
        values["moe"] = dict(values["moe"], dispatch=dispatch)
    return TransformerConfig.from_dict(values)


# ---------------------------------------------------------------------------------------------------------------------
# Peaks and timing.


def measure_bandwidth(num_bytes: int, repeats: int) -> dict[str, float]:
    """Bytes/s of three streaming kernels over a float32 buffer of `num_bytes`: a copy (y = 2x: read once, written
    once), a read-only sum, and a matrix-vector product (the read pattern of a batch-1 decode step). On XLA:CPU the
    copy runs on one thread while the reduction and the matvec use every core, so the peak is the best of the three."""
    n = num_bytes // 4
    x = jnp.ones((n,), jnp.float32)
    rows = 4096
    w = x[: (n // rows) * rows].reshape(rows, -1)
    v = jnp.ones((w.shape[1],), jnp.float32)
    figures = {
        "copy": 2 * x.nbytes / best_time(lambda: jax.jit(lambda a: a * 2.0)(x), repeats),
        "sum": x.nbytes / best_time(lambda: jax.jit(jnp.sum)(x), repeats),
        "matvec": w.nbytes / best_time(lambda: jax.jit(jnp.matmul)(w, v), repeats),
    }
    return {**figures, "peak": max(figures.values())}


# ---------------------------------------------------------------------------------------------------------------------
# What a program must read and compute.


def weight_bytes(params, cfg: TransformerConfig, tokens: int) -> float:
    """Bytes of the weights a forward pass over `tokens` tokens touches (expected, for a mixture of experts)."""
    shared = experts = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = [getattr(k, "key", str(k)) for k in path]
        size = leaf.size * leaf.dtype.itemsize
        if "moe" in names and names[-1] in EXPERT_LEAVES:
            experts += size
        else:
            shared += size
    if cfg.moe is None or experts == 0:
        return float(shared)
    reached = 1.0 - (1.0 - cfg.moe.top_k / cfg.moe.num_experts) ** tokens
    return float(shared + experts * reached)


def kv_bytes(cfg: TransformerConfig, context: int, itemsize: int) -> float:
    """Bytes of valid K and V a pass over a cache of `context` tokens reads (local layers: their window)."""
    total = 0
    for layer_type in cfg.layer_types():
        if layer_type == "global":
            heads, dim, span = cfg.global_kv_heads, cfg.global_attn_head_dim, context
            kv = 1 if cfg.k_eq_v_global else 2
        else:
            heads, dim, span, kv = cfg.num_kv_heads, cfg.head_dim, min(context, cfg.sliding_window), 2
        total += kv * heads * dim * span * itemsize
    return float(total * cfg.depth_loops)


def forward_flops(cfg: TransformerConfig, params, tokens: int, context: int) -> float:
    """Matmul FLOPs of a pass over `tokens` new tokens that attend to `context` cached ones plus each other."""
    active = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = [getattr(k, "key", str(k)) for k in path]
        if "embedder" in names:
            continue
        if "moe" in names and names[-1] in EXPERT_LEAVES:
            active += leaf.size * cfg.moe.top_k // cfg.moe.num_experts
        else:
            active += leaf.size
    matmul = 2 * tokens * (active * cfg.depth_loops + cfg.vocab_size * cfg.embed_dim)
    attn = 0
    for layer_type in cfg.layer_types():
        dim = cfg.global_attn_head_dim if layer_type == "global" else cfg.head_dim
        keys = context + tokens if layer_type == "global" else min(context + tokens, cfg.sliding_window)
        attn += 2 * 2 * cfg.num_heads * dim * keys * tokens
    return float(matmul + attn * cfg.depth_loops)


def program_figures(seconds: float, num_bytes: float, flops: float, peaks: dict) -> dict:
    return {
        "step_s": seconds,
        "bytes_per_step": num_bytes,
        "gbps": num_bytes / seconds / 1e9,
        "frac_bw_peak": num_bytes / seconds / peaks["bytes_per_s"],
        "flops_per_step": flops,
        "tflops": flops / seconds / 1e12,
        "frac_flops_peak": flops / seconds / peaks["flops_per_s"],
    }


# ---------------------------------------------------------------------------------------------------------------------


def run(args) -> list[dict]:
    device = jax.devices()[0]
    on_cpu = device.platform == "cpu"
    dtype = args.dtype if args.dtype != "auto" else ("float32" if on_cpu else "bfloat16")
    cfg = model_config(args.model, dtype, args.dispatch, args.attention_impl)
    model = T.Transformer(cfg)
    init = jax.jit(lambda key: T.init_params(model, key))  # on the device: no host copy of the weights
    params = jax.block_until_ready(init(jax.random.key(0)))
    itemsize = jnp.dtype(dtype).itemsize
    repeats = args.repeats

    bandwidth = measure_bandwidth(args.bandwidth_mib << 20, max(repeats, 5))
    peaks = {
        "bytes_per_s": bandwidth["peak"],
        "flops_per_s": measure_peak_matmul_flops(args.matmul_n, jnp.dtype(dtype), repeats=max(repeats, 5)),
    }
    c, p, n = args.canvas, args.prompt, args.canvases
    cache_length = p + n * c
    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(len(SPECIAL_IDS), cfg.vocab_size, (1, p)), jnp.int32).at[:, 0].set(2)
    prompt_mask = jnp.ones((1, p), bool)
    context = p + (n - 1) * c  # a canvas step and an AR step measured at the last canvas's position

    lines = []
    for weights_mode in args.weights:  # the model, its weights and the peaks are shared
        if weights_mode == "fp8":  # quantized on the device; every step program dequantizes inside itself
            stored = jax.block_until_ready(jax.jit(Q.quantize_fp8)(params))

            def weights(s):
                return Q.dequantize(*s, jnp.dtype(dtype))

            stored_bytes = Q.nbytes(stored[1])  # the scales; the FP8 values are counted leaf by leaf below
            counted = stored[0]
        else:
            stored, stored_bytes, counted = params, 0, params

            def weights(s):
                return s

        prefill = jax.jit(
            lambda s, toks: prompts_lib.prefill(model, weights(s), toks, prompt_mask, cache_length=cache_length)
        )
        prefill_s = median_time(lambda: prefill(stored, prompt), repeats)
        history = jnp.asarray(rng.integers(len(SPECIAL_IDS), cfg.vocab_size, (1, context)), jnp.int32)
        fill = jax.jit(
            lambda prm, toks: prompts_lib.prefill(
                model, prm, toks, jnp.ones_like(toks, bool), cache_length=cache_length
            )
        )
        _, cache = fill(params, history)
        canvas = jnp.full((1, c), SPECIAL_IDS[3], jnp.int32)
        step = jax.jit(lambda s, cch, cnv: canvas_logits(model, weights(s), cch, cnv))
        canvas_s = median_time(lambda: step(stored, cache, canvas), repeats)
        token = jnp.full((1, 1), 5, jnp.int32)
        ar_step = jax.jit(lambda s, cch, tok: T.append(model, weights(s), tok, cch))
        ar_s = median_time(lambda: ar_step(stored, cache, token), repeats)

        canvas_prog = program_figures(
            canvas_s,
            weight_bytes(counted, cfg, c) + stored_bytes + kv_bytes(cfg, context, itemsize),
            forward_flops(cfg, params, c, context),
            peaks,
        )
        ar_prog = program_figures(
            ar_s,
            weight_bytes(counted, cfg, 1) + stored_bytes + kv_bytes(cfg, context, itemsize),
            forward_flops(cfg, params, 1, context),
            peaks,
        )
        prefill_prog = program_figures(
            prefill_s, weight_bytes(counted, cfg, p) + stored_bytes, forward_flops(cfg, params, p, 0), peaks
        )

        processes = {
            "masking": MaskingProcess(vocab_size=cfg.vocab_size, schedule=LinearSchedule(), mask_id=SPECIAL_IDS[3]),
            "uniform": UniformProcess(
                vocab_size=cfg.vocab_size, schedule=LinearSchedule(), excluded_ids=tuple(SPECIAL_IDS)
            ),
        }
        new_tokens = n * c

        def ar_generate(max_new):
            return ar_lib.generate_ar(
                model, params, prompt, key=0, max_new_tokens=max_new, stop_tokens=(), forbidden_tokens=SPECIAL_IDS
            ).tokens

        fp8 = weights_mode == "fp8"  # generation would run the unquantized weights: figures from the step programs
        ar_gen_s = new_tokens * ar_s if fp8 else median_time(lambda: ar_generate(new_tokens), repeats)
        ar_ttft = prefill_s + ar_s  # the prompt's prefill and one decode step, both timed above
        for process_name, selection_rule, steps in itertools.product(args.process, args.selection, args.steps):
            sampler = DiffusionSampler(
                process=processes[process_name],
                canvas_length=c,
                num_steps=steps,
                early_stopping=NoEarlyStop(),
                forbidden_tokens=SPECIAL_IDS,
                draw=make_draw(args.draw),
                selection=make_selection(selection_rule),
            )

            def generate(max_new, sampler=sampler, on_device=False, first=None):  # one cache size: the same programs
                return gen_lib.generate(
                    model,
                    params,
                    prompt,
                    sampler=sampler,
                    key=0,
                    max_new_tokens=max_new,
                    stop_tokens=(),
                    cache_length=cache_length,
                    on_device=on_device,
                    first_canvas_length=first,
                ).tokens

            if fp8:
                gen_s = prefill_s + n * (steps + 1) * canvas_s
                ttft = prefill_s + (steps + 1) * canvas_s
            else:
                loops = {"host": lambda: generate(new_tokens), "device": lambda: generate(new_tokens, on_device=True)}
                if args.canvas_loop != "both":
                    loops = {args.canvas_loop: loops[args.canvas_loop]}
                loop_s = interleaved_medians(loops, repeats)
                gen_s = loop_s.get("host", loop_s.get("device"))
                ttft = median_time(lambda: generate(c, on_device="host" not in loops), repeats)
            line = {
                "benchmark": "decode_bench",
                "model": args.model,
                "params": int(sum(x.size for x in jax.tree.leaves(params))),
                "dtype": dtype,
                "weights": "float8_e4m3fn weight-only, per-channel scales; generation figures from the step programs"
                if fp8
                else dtype,
                "moe_dispatch": cfg.moe.dispatch if cfg.moe else None,
                "attention_impl": cfg.attention_impl,
                "device": f"{device.platform}:{device.device_kind}",
                "num_devices": jax.device_count(),
                "jax": jax.__version__,
                "batch": 1,
                "prompt": p,
                "canvas_len": c,
                "canvases": n,
                "cache_tokens": cache_length,
                "steps_per_canvas": steps,
                "steps_note": "fixed (random weights; early stopping off)",
                "process": process_name,
                "selection": selection_rule,
                "draw": args.draw,
                "canvas_loop": args.canvas_loop,
                "measured_peaks": {
                    "memory_gbps": peaks["bytes_per_s"] / 1e9,
                    "memory_gbps_by_kernel": {k: v / 1e9 for k, v in bandwidth.items() if k != "peak"},
                    "matmul_tflops": peaks["flops_per_s"] / 1e12,
                    "matmul_dtype": dtype,
                },
                "prefill": prefill_prog,
                "canvas": {
                    **canvas_prog,
                    "tokens_per_s": new_tokens / gen_s,
                    "generation_s": gen_s,
                    "ttft_s": ttft,
                    "tokens_per_s_from_steps": c / ((steps + 1) * canvas_s),
                    **(
                        {"device_loop_generation_s": loop_s["device"], "device_loop_speedup": gen_s / loop_s["device"]}
                        if not fp8 and len(loops) == 2
                        else {}
                    ),
                    "roofline_tokens_per_s": c
                    / (
                        (steps + 1)
                        * max(
                            canvas_prog["bytes_per_step"] / peaks["bytes_per_s"],
                            canvas_prog["flops_per_step"] / peaks["flops_per_s"],
                        )
                    ),
                },
                "ar": {
                    **ar_prog,
                    "tokens_per_s": new_tokens / ar_gen_s,
                    "generation_s": ar_gen_s,
                    "ttft_s": ar_ttft,
                    "tokens_per_s_from_steps": 1 / ar_s,
                    "roofline_tokens_per_s": 1
                    / max(
                        ar_prog["bytes_per_step"] / peaks["bytes_per_s"],
                        ar_prog["flops_per_step"] / peaks["flops_per_s"],
                    ),
                },
            }
            if args.first_canvas and not fp8:
                line["first_canvas"] = first_canvas_figures(
                    args, generate, sampler, new_tokens, gen_s, ar_ttft, repeats
                )
            line["ratio"] = line["canvas"]["tokens_per_s"] / line["ar"]["tokens_per_s"]
            line["roofline_ratio"] = line["canvas"]["roofline_tokens_per_s"] / line["ar"]["roofline_tokens_per_s"]
            print(json.dumps(line), flush=True)
            lines.append(line)
    return lines


def first_canvas_figures(args, generate, sampler, new_tokens, plain_gen_s, ar_ttft, repeats) -> dict:
    """Time to first token with a shorter first canvas (`generate(first_canvas_length=F)`, its steps scaled to decide as
    many tokens per step as a full canvas), and what it costs over the whole answer: per F, the first canvas alone
    timed end to end (prefill, its steps, the commit: an upper bound on when its tokens exist), the full answer of
    `new_tokens` timed the same way, and both against the plain canvas and AR figures measured above."""
    out = {}
    for first in args.first_canvas:  # the same region and cache: [first, canvas, ..., canvas - first]
        ttft = median_time(lambda: generate(first, first=first), repeats)
        gen_s = median_time(lambda: generate(new_tokens, first=first), repeats)
        out[str(first)] = {
            "first_canvas_steps": max(1, math.ceil(sampler.num_steps * first / sampler.canvas_length)),
            "ttft_s": ttft,
            "ttft_over_ar": ttft / ar_ttft,
            "tokens_per_s": new_tokens / gen_s,
            "tokens_per_s_loss": 1 - plain_gen_s / gen_s,
        }
    return out


def markdown(lines: list[dict]) -> str:
    rows = [
        "| model | dtype | device | process | selection | steps/canvas | canvas step (ms) | canvas GB/s (frac of peak) "
        "| canvas TFLOP/s (frac) "
        "| canvas tok/s | AR step (ms) | AR GB/s (frac) | AR tok/s | ratio | TTFT canvas / AR (s) |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for line in lines:
        cv, ar = line["canvas"], line["ar"]
        rows.append(
            f"| {line['model']} | {line['dtype']} | {line['device']} | {line['process']} | "
            f"{line['selection']} | "
            f"{line['steps_per_canvas']} | "
            f"{1e3 * cv['step_s']:.2f} | {cv['gbps']:.1f} ({cv['frac_bw_peak']:.0%}) | "
            f"{cv['tflops']:.3f} ({cv['frac_flops_peak']:.0%}) | {cv['tokens_per_s']:.1f} | {1e3 * ar['step_s']:.2f} | "
            f"{ar['gbps']:.1f} ({ar['frac_bw_peak']:.0%}) | {ar['tokens_per_s']:.1f} | {line['ratio']:.2f} | "
            f"{cv['ttft_s']:.3f} / {ar['ttft_s']:.3f} |"
        )
    peaks = lines[0]["measured_peaks"] if lines else {}
    rows.append("")
    rows.append(
        f"Measured in the same run: memory bandwidth {peaks.get('memory_gbps', 0):.1f} GB/s (best streaming kernel), "
        f"{peaks.get('matmul_dtype')} matmul {peaks.get('matmul_tflops', 0):.3f} TFLOP/s."
    )
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small", help=f"one of {sorted(PRESETS)}")
    parser.add_argument("--steps", default="8,16", help="denoising steps per canvas, comma-separated")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--dispatch", default="", help="MoE dispatch override (ragged, sorted, dense)")
    parser.add_argument("--attention_impl", default="einsum", choices=["einsum", "dot_product"])
    parser.add_argument(
        "--canvas_loop",
        default="host",
        choices=["host", "device", "both"],
        help="generation's loop over canvases: a Python loop, one compiled loop (generate(on_device=True)), or both "
        "timed in turns (the canvas figures are the host loop's; canvas.device_loop_generation_s the other's)",
    )
    parser.add_argument(
        "--draw", default="gumbel_max", choices=sorted(DRAWS), help="how candidates are drawn (sampling/draws.py)"
    )
    parser.add_argument(
        "--selection",
        default="entropy_bound",
        help="the canvas sampler's selection rules, comma-separated, each timed at every --steps (their own defaults; "
        f"every canvas takes exactly the stated steps): {', '.join(sorted(SELECTION_RULES))}",
    )
    parser.add_argument(
        "--process",
        default="masking",
        help="masking, uniform or both (masking,uniform): the canvas sampler's noise, each timed with every rule and "
        "--steps (uniform: every undecided position is re-drawn from the prior at every step, as the reference)",
    )
    parser.add_argument(
        "--weights", default="native", help="native, fp8 or both (native,fp8): fp8 = weight-only FP8 step programs"
    )
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--canvas", type=int, default=256)
    parser.add_argument("--canvases", type=int, default=2)
    parser.add_argument(
        "--first_canvas",
        default="",
        help="comma-separated first-canvas lengths: also time generation with a shorter first canvas (its TTFT and "
        "the tokens/s it costs over the answer), e.g. 16,32",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bandwidth_mib", type=int, default=512, help="copy-kernel buffer (MiB)")
    parser.add_argument("--matmul_n", type=int, default=0, help="matmul peak size (0: 2048 on CPU, 8192 otherwise)")
    parser.add_argument("--out", default="", help="folder for decode_bench.jsonl and decode_bench.md")
    args = parser.parse_args()
    args.steps = [int(s) for s in args.steps.split(",") if s]
    args.selection = [r for r in args.selection.split(",") if r]
    if not args.selection or set(args.selection) - set(SELECTION_RULES):
        raise SystemExit(f"error: --selection must list rules of {sorted(SELECTION_RULES)}, got {args.selection}.")
    args.process = [w for w in args.process.split(",") if w]
    if not args.process or set(args.process) - {"masking", "uniform"}:
        raise SystemExit(f"error: --process must list masking and/or uniform, got {args.process}.")
    args.weights = [w for w in args.weights.split(",") if w]
    args.first_canvas = [int(f) for f in args.first_canvas.split(",") if f]
    if any(not 1 <= f <= args.canvas for f in args.first_canvas):
        raise SystemExit(
            f"error: --first_canvas lengths must lie in [1, --canvas={args.canvas}], got {args.first_canvas}"
        )
    if not args.weights or set(args.weights) - {"native", "fp8"}:
        raise SystemExit(f"error: --weights must list native and/or fp8, got {args.weights}.")
    if not args.steps or min(args.steps) < 1:
        raise SystemExit(f"error: --steps must be positive integers, got {args.steps}.")
    for name in ("prompt", "canvas", "canvases", "repeats"):
        if getattr(args, name) < 1:
            raise SystemExit(f"error: --{name} must be >= 1, got {getattr(args, name)}.")
    if not args.matmul_n:
        args.matmul_n = 2048 if jax.devices()[0].platform == "cpu" else 8192
    lines = run(args)
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "decode_bench.jsonl", "a") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
        with open(out / "decode_bench.md", "a") as f:
            f.write(markdown(lines))


if __name__ == "__main__":
    main()
