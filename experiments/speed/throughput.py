"""Decode throughput: DiffusionGemma's canvas sampler vs autoregressive decoding with a KV cache, same network.

  python experiments/speed/throughput.py [--quick] [--sizes small,large,large_moe] [--fixed_steps 16] [--sweep_steps 6,8]

One JSON line per (model, batch) setting, both decoders measured side by side in one run (interleaved repeats,
median after a compiling warm-up): tokens/s for `--new_tokens` new tokens at batch 1 and batch 8, forward passes per
generated token, wall time per canvas, and the diffusion/AR ratio. Next to each figure, a roofline estimate: FLOPs and
bytes moved per generated token for both decoders, and the ratio they predict on an H100/H200-class GPU
(`aot/roofline.py`'s H100 SXM: 989.4 TFLOP/s bf16 dense, 3.35 TB/s) — where batch-1 AR decoding is memory-bound (every active weight read per token) and a
canvas step reads the weights once for 256 tokens.

The diffusion sampler is the reference one: canvas 256, entropy bound 0.1, annealed temperature 0.8 -> 0.4,
stability AND entropy <= 0.005 early stopping, up to 48 steps. Random weights do not converge, so for random-weight
models the step count is fixed (`--fixed_steps`, default 16: the 12–16 steps per canvas reported for the reference
with early stopping) with early stopping off; the value is printed in every line. With `--diffusion_workdir RUN
--ar_workdir RUN` the trained small models are measured first (the diffusion run's own sampler with early stopping on,
generative perplexity of both decoders' text under the AR run), and the large models then use the trained run's mean
steps per canvas (`--config.<path>=value` overrides the diffusion run's saved config, e.g. a step budget):

  python experiments/speed/throughput.py --diffusion_workdir runs/shakespeare_masking --ar_workdir runs/shakespeare_ar \
      --config.sampler.num_steps=12 --config.sampler.selection.gamma=0.1 --config.sampler.selection.min_count=even
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import jax
import numpy as np
from aot.roofline import HARDWARE
from benchmarking import model_shapes

from hackable_diffusion.diffusion.processes import UniformProcess
from hackable_diffusion.diffusion.schedules import LinearSchedule
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.models.param_count import count_params
from hackable_diffusion.sampling import autoregressive as ar_lib
from hackable_diffusion.sampling import generate as gen_lib
from hackable_diffusion.sampling.draws import DRAWS, make_draw
from hackable_diffusion.sampling.early_stopping import NoEarlyStop
from hackable_diffusion.sampling.sampler import DiffusionSampler

GPU = HARDWARE["H100 SXM"]  # the published peaks of aot/roofline.py: bf16 dense FLOP/s, HBM bandwidth
GPU_FLOPS, GPU_BYTES_PER_S = GPU.flops_per_s("bf16"), GPU.bytes_per_s


def roofline(cfg: TransformerConfig, batch: int, canvas: int, steps_per_canvas: float, context: int) -> dict:
    """Per generated token: matmul FLOPs and weight bytes for AR (one token per pass) and diffusion (a canvas of
    `canvas` tokens per pass, `steps_per_canvas` passes + one commit pass per canvas), bf16 weights."""
    counts = count_params(cfg)
    n = counts["active_params_per_token"] - counts["embedding_params"] + cfg.vocab_size * cfg.embed_dim
    kv_bytes = 0
    for layer_type in cfg.layer_types():
        heads = cfg.global_kv_heads if layer_type == "global" else cfg.num_kv_heads
        dim = cfg.global_attn_head_dim if layer_type == "global" else cfg.head_dim
        kv_bytes += 2 * heads * dim * 2 * context  # K and V, bf16, read once per pass
    # MoE: a batch of many tokens touches every expert; one token touches top-k of them.
    total_matmul = counts["total_params"] - counts["embedding_params"] + cfg.vocab_size * cfg.embed_dim
    ar_weight_bytes = 2 * (n if batch == 1 else min(total_matmul, n * batch))
    canvas_weight_bytes = 2 * total_matmul if cfg.moe is not None else 2 * n
    flops_token = 2 * n
    ar = dict(flops=flops_token, bytes=(ar_weight_bytes + batch * kv_bytes) / batch)
    passes = steps_per_canvas + 1  # denoising steps + the causal commit
    dif = dict(flops=flops_token * passes, bytes=passes * (canvas_weight_bytes + batch * kv_bytes) / (batch * canvas))
    t_ar = max(ar["flops"] / GPU_FLOPS, ar["bytes"] / GPU_BYTES_PER_S)
    t_dif = max(dif["flops"] / GPU_FLOPS, dif["bytes"] / GPU_BYTES_PER_S)
    return {
        "roofline_ar_flops_per_token": ar["flops"],
        "roofline_ar_bytes_per_token": ar["bytes"],
        "roofline_diffusion_flops_per_token": dif["flops"],
        "roofline_diffusion_bytes_per_token": dif["bytes"],
        "roofline_gpu_ratio": t_ar / t_dif,
    }


def unrolled(model: T.Transformer, args) -> T.Transformer:
    """The decode-time model: the layer scan unrolled by --scan_unroll groups (0: fully; params unchanged)."""
    return T.with_scan_unroll(model, None if args.scan_unroll == 0 else args.scan_unroll)


def measure(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        jax.block_until_ready(result.tokens)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def measure_trained(args, repeats: int) -> float:
    """The trained small models: the diffusion run's own sampler (entropy bound, annealed temperature, early
    stopping, its trained canvas length) vs AR decoding of the AR run (its own temperature); tokens/s side by side, and the
    generative perplexity of both decoders' text under the AR run. Returns the diffusion run's mean steps/canvas."""
    from hackable_diffusion import builders, cli
    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.checkpoints import toolbox
    from hackable_diffusion.data.tokenizers import BOS_ID, NEVER_GENERATED
    from hackable_diffusion.tasks import text

    dif = exp_lib.from_workdir(args.diffusion_workdir)
    if args.config_overrides:
        dif = dataclasses.replace(dif, config=cli.parse_config_overrides(dif.config, args.config_overrides))
    ar = exp_lib.from_workdir(args.ar_workdir)
    if dif.is_autoregressive or not ar.is_autoregressive:
        raise SystemExit("--diffusion_workdir must be a diffusion run and --ar_workdir an autoregressive run.")
    if dif.model.cfg.replace(self_conditioning=False) != ar.model.cfg.replace(self_conditioning=False):
        print("warning: the two runs have different backbone shapes", flush=True)
    dif_params, dif_step = toolbox.load_params(dif, args.diffusion_workdir)
    ar_params, ar_step = toolbox.load_params(ar, args.ar_workdir)
    dif_model, ar_model = unrolled(dif.model, args), unrolled(ar.model, args)
    sampler = builders.build_sampler(dif.config, dif.process)
    prompt = dif.config.sampler.prompt
    ids = [BOS_ID] + ar.tokenizer.encode(prompt)
    new_tokens = int(np.ceil(args.new_tokens / sampler.canvas_length) * sampler.canvas_length)
    steps_seen = []
    for batch in [int(b) for b in args.batches.split(",")]:
        prompts = np.array([ids] * batch, np.int32)

        def diffusion(key=0):
            return gen_lib.generate(
                dif_model, dif_params, prompts, sampler=sampler, key=key, max_new_tokens=new_tokens, stop_tokens=()
            )

        def autoregressive(key=0):
            return ar_lib.generate_ar(
                ar_model,
                ar_params,
                prompts,
                key=key,
                max_new_tokens=new_tokens,
                sampling=ar_lib.ARSampling(temperature=float(ar.config.sampler.ar_temperature)),
                stop_tokens=(),
                forbidden_tokens=NEVER_GENERATED,
            )

        d_result, a_result = diffusion(), autoregressive()  # compile
        d_times, a_times = [], []
        for _ in range(repeats):
            d_times.append(measure(diffusion, 1))
            a_times.append(measure(autoregressive, 1))
        d_s, a_s = float(np.median(d_times)), float(np.median(a_times))
        steps = np.asarray(d_result.steps)
        mean_steps = float(steps[steps > 0].mean())
        steps_seen.append(mean_steps)
        texts = {
            "diffusion": [dif.tokenizer.decode(np.asarray(r)) for r in d_result.tokens],
            "ar": [ar.tokenizer.decode(np.asarray(r)) for r in a_result.tokens],
        }
        gen = {
            name: text.generative_perplexity(
                ar, ar_params, [ids] * len(t), [ar.tokenizer.encode(x) for x in t], batch_size=max(batch, 1)
            )
            for name, t in texts.items()
        }
        new = batch * new_tokens
        canvases = new_tokens // sampler.canvas_length
        line = {
            "benchmark": "throughput",
            "model": "trained_small",
            "diffusion_workdir": args.diffusion_workdir,
            "ar_workdir": args.ar_workdir,
            "checkpoint_steps": [dif_step, ar_step],
            "params": count_params(dif.model.cfg)["total_params"],
            "active_params": count_params(dif.model.cfg)["active_params_per_token"],
            "weights": "trained",
            "batch": batch,
            "new_tokens": new_tokens,
            "canvas": sampler.canvas_length,
            "sampler": f"{builders.build_selection(dif.config.sampler.selection)}, temperature "
            f"{dif.config.sampler.max_temperature}->{dif.config.sampler.min_temperature}, early stopping "
            f"{dif.config.sampler.early_stopping.rule}, <= {sampler.num_steps} steps",
            "steps_per_canvas": mean_steps,
            "diffusion_tokens_per_s": new / d_s,
            "ar_tokens_per_s": new / a_s,
            "ratio": a_s / d_s,
            "diffusion_forward_passes_per_token": d_result.forward_passes / new_tokens,
            "ar_forward_passes_per_token": a_result.forward_passes / new_tokens,
            "diffusion_wall_s_per_canvas": d_s / canvases,
            "diffusion_gen_ppl": gen["diffusion"]["gen_ppl"],
            "ar_gen_ppl": gen["ar"]["gen_ppl"],
            "diffusion_unigram_entropy_bits": gen["diffusion"]["gen_unigram_entropy_bits"],
            "ar_unigram_entropy_bits": gen["ar"]["gen_unigram_entropy_bits"],
            "ar_temperature": float(ar.config.sampler.ar_temperature),
            "scan_unroll": args.scan_unroll,
            "diffusion_wall_s": d_s,
            "ar_wall_s": a_s,
        }
        line.update(roofline(dif.model.cfg, batch, sampler.canvas_length, mean_steps, context=len(ids) + new_tokens))
        print(json.dumps(line), flush=True)
        if batch == 1:
            print("diffusion sample: " + repr(prompt + texts["diffusion"][0][:300]), flush=True)
            print("ar sample: " + repr(prompt + texts["ar"][0][:300]), flush=True)
    return float(np.mean(steps_seen))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one layer group per model, one timed repeat (after the compiling warm-up), 256 new tokens unless "
        "--new_tokens is given; batches 1 and 8 for the small model, 1 for the large (< 5 min)",
    )
    parser.add_argument("--sizes", default="small,large,large_moe")
    parser.add_argument("--new_tokens", type=int, default=None, help="new tokens per row (default 512; --quick: 256)")
    parser.add_argument("--canvas", type=int, default=256)
    parser.add_argument("--fixed_steps", type=int, default=16)
    parser.add_argument(
        "--sweep_steps",
        default="",
        help="more steps per canvas for the random-weight sizes, each measured beside the same AR runs "
        "(one line per count), e.g. 6,8,9,10: where the ratio crosses a target",
    )
    parser.add_argument(
        "--draw",
        default="gumbel_max",
        choices=sorted(DRAWS),
        help="how the random-weight sizes' sampler draws candidates (sampling/draws.py); a trained run uses its own "
        "config.sampler.draw (--config.sampler.draw.rule=...)",
    )
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--large_batches", default="", help="batches for the large sizes (default: --batches)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--scan_unroll",
        type=int,
        default=1,
        help="layer groups per scan iteration at decode time for both decoders (1: rolled, as trained; 0: fully)",
    )
    parser.add_argument(
        "--diffusion_workdir", default="", help="a trained diffusion run (e.g. runs/shakespeare_uniform)"
    )
    parser.add_argument("--ar_workdir", default="", help="the trained AR run of the same shape (runs/shakespeare_ar)")
    argv = sys.argv[1:]
    overrides = [a for a in argv if a.startswith("--config.")]  # of the diffusion run's saved config
    args = parser.parse_args([a for a in argv if not a.startswith("--config.")])
    args.config_overrides = overrides
    repeats = 1 if args.quick else args.repeats
    if args.new_tokens is None:
        args.new_tokens = 256 if args.quick else 512
    if args.quick and not args.large_batches:
        args.large_batches = "1"  # the large sizes at batch 1 only: batch 8 of them alone takes minutes
    shapes = model_shapes(args.quick)
    sweep_steps = [int(s) for s in args.sweep_steps.split(",") if s]
    fixed_steps_note = "fixed (random weights; early stopping off)"
    if args.diffusion_workdir and args.ar_workdir:
        mean_steps = measure_trained(args, repeats)
        args.fixed_steps = max(1, int(round(mean_steps)))
        fixed_steps_note = (
            f"fixed to {args.fixed_steps}, the mean steps per canvas of the trained diffusion run "
            f"({mean_steps:.2f}); random weights, early stopping off"
        )
    for name in [n for n in args.sizes.split(",") if n]:
        cfg = TransformerConfig.from_dict(shapes[name])
        trained_shape = T.Transformer(cfg)
        params = T.init_params(trained_shape, jax.random.key(0))
        model = unrolled(trained_shape, args)
        process = UniformProcess(cfg.vocab_size, LinearSchedule(), excluded_ids=(0, 1, 2, 3))
        step_counts = list(dict.fromkeys([args.fixed_steps, *sweep_steps]))  # the main count first, each once
        samplers = {
            steps: DiffusionSampler(
                process=process,
                canvas_length=args.canvas,
                num_steps=steps,
                early_stopping=NoEarlyStop(),
                forbidden_tokens=(0, 1, 2, 3),
                draw=make_draw(args.draw),
            )
            for steps in step_counts
        }
        counts = count_params(cfg)
        size_batches = args.batches if name == "small" else (args.large_batches or args.batches)
        for batch in [int(b) for b in size_batches.split(",")]:
            prompts = np.array(jax.random.randint(jax.random.key(1), (batch, 16), 4, cfg.vocab_size))
            prompts[:, 0] = 2

            def diffusion(steps):
                return gen_lib.generate(
                    model,
                    params,
                    prompts,
                    sampler=samplers[steps],
                    key=0,
                    max_new_tokens=args.new_tokens,
                    stop_tokens=(),
                )

            def autoregressive():
                return ar_lib.generate_ar(
                    model,
                    params,
                    prompts,
                    key=0,
                    max_new_tokens=args.new_tokens,
                    stop_tokens=(),
                    forbidden_tokens=(0, 1, 2, 3),
                )

            d_results = {steps: diffusion(steps) for steps in step_counts}  # compile
            a_result = autoregressive()
            d_times, a_times = {steps: [] for steps in step_counts}, []
            for r in range(repeats):  # interleaved: every decoder sees the same machine state
                # the step counts take turns going first (on these machines the first run after the AR one is faster)
                for steps in step_counts[r % len(step_counts) :] + step_counts[: r % len(step_counts)]:
                    d_times[steps].append(measure(lambda: diffusion(steps), 1))
                a_times.append(measure(autoregressive, 1))
            a_s = float(np.median(a_times))
            new = batch * args.new_tokens
            canvases = args.new_tokens // args.canvas
            for steps in step_counts:
                d_s = float(np.median(d_times[steps]))
                line = {
                    "benchmark": "throughput",
                    "model": name,
                    "params": counts["total_params"],
                    "active_params": counts["active_params_per_token"],
                    "weights": "random",
                    "batch": batch,
                    "new_tokens": args.new_tokens,
                    "canvas": args.canvas,
                    "steps_per_canvas": steps,
                    "steps_note": fixed_steps_note
                    if steps == args.fixed_steps
                    else "--sweep_steps, early stopping off",
                    "quick": args.quick,
                    "scan_unroll": args.scan_unroll,
                    "draw": args.draw,
                    "diffusion_tokens_per_s": new / d_s,
                    "ar_tokens_per_s": new / a_s,
                    "ratio": a_s / d_s,
                    "diffusion_forward_passes_per_token": d_results[steps].forward_passes / args.new_tokens,
                    "ar_forward_passes_per_token": a_result.forward_passes / args.new_tokens,
                    "diffusion_wall_s_per_canvas": d_s / canvases,
                    "diffusion_wall_s": d_s,
                    "ar_wall_s": a_s,
                }
                line.update(roofline(cfg, batch, args.canvas, steps, context=16 + args.new_tokens))
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
