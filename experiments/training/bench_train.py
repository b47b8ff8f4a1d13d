"""Training throughput and model FLOPs utilisation on this machine, with the peak matmul rate measured in the same run.

  python experiments/training/bench_train.py [--config small] [--objective ar|block] [--batch 16] [--seq_len 256]

Prints one JSON line: tokens/s, model FLOP/s (6N + attention per token, times the forward passes the objective
runs), the peak FLOP/s of a large `jnp.dot` measured side by side, and `mfu` = their ratio. The step timed is the
real jitted `train_step` of the toolbox (AdamW, global-norm clipping, donation), on one device.

`--profile OUT.md` then traces the same step (without donation) with `jax.profiler`, op by op, and writes where its
time goes (experiments/speed/profile_steps.py's categories plus the loss and the optimizer update, and the backward pass's
share) as a markdown table beside the JSON line's figures:

  python experiments/training/bench_train.py --config small --objective ar --batch 8 --seq_len 256 \\
      --profile results/text/profile_train_step.md
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from hackable_diffusion import builders, recipes
from hackable_diffusion.diffusion import objectives as obj_lib
from hackable_diffusion.diffusion.processes import MaskingProcess
from hackable_diffusion.diffusion.schedules import LinearSchedule
from hackable_diffusion.models import presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.param_count import count_params, training_flops_per_token
from hackable_diffusion.training import metrics, optimizers
from hackable_diffusion.training.train_state import TrainState, make_train_step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="small", choices=["small", "small_moe", "quickstart"])
    parser.add_argument("--objective", default="ar", choices=["ar", "block"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq_len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--scan_unroll", type=int, default=1, help="model.scan_unroll (1: rolled layer loop)")
    parser.add_argument("--remat", default="none", choices=["none", "full", "dots"], help="model.remat")
    parser.add_argument("--profile", default="", help="also trace the step op by op and write this markdown file")
    parser.add_argument("--profile_repeats", type=int, default=3)
    args = parser.parse_args()

    shape = {"small": presets.small(), "small_moe": presets.small(moe=True), "quickstart": presets.quickstart()}[
        args.config
    ]
    shape["compute_dtype"] = args.dtype
    shape["scan_unroll"], shape["remat"] = args.scan_unroll, args.remat
    config = recipes.text_config("shakespeare", "masking" if args.objective == "block" else "none", model=shape)
    model = builders.build_model(config, shape["vocab_size"])
    if args.objective == "ar":
        objective, passes = obj_lib.AutoregressiveObjective(model), 1.0
    else:
        process = MaskingProcess(vocab_size=model.cfg.vocab_size, schedule=LinearSchedule(), mask_id=3)
        objective, passes = obj_lib.DiffusionPretrainObjective(model, process, canvas_len=32), 2.0

    opt_cfg = ml_collections.ConfigDict(
        dict(
            name="adamw",
            peak_lr=1e-3,
            end_lr=1e-4,
            warmup_steps=10,
            total_steps=1000,
            weight_decay=0.01,
            b1=0.9,
            b2=0.99,
            eps=1e-8,
            clip_norm=1.0,
        )
    )
    tx = optimizers.make_optimizer(opt_cfg)
    params = T.init_params(model, jax.random.key(0))
    state = TrainState.create(params, tx, jax.random.key(1))
    step_fn = make_train_step(objective, tx)
    step = jax.jit(step_fn, donate_argnums=0)
    tokens = jax.random.randint(jax.random.key(2), (args.batch, args.seq_len), 4, model.cfg.vocab_size)
    batch = {"tokens": tokens}

    state, m = step(state, batch)  # compile
    jax.block_until_ready(m)
    peak = metrics.measure_peak_matmul_flops(2048, jnp.float32 if args.dtype == "float32" else jnp.bfloat16)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        state, m = step(state, batch)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - start)
    peak_after = metrics.measure_peak_matmul_flops(2048, jnp.float32 if args.dtype == "float32" else jnp.bfloat16)
    step_s = float(np.median(times))
    tok_s = args.batch * args.seq_len / step_s
    flops_tok = training_flops_per_token(model.cfg, args.seq_len) * passes
    model_flops = tok_s * flops_tok
    peak_flops = max(peak, peak_after)
    counts = count_params(model.cfg)
    figures = {
        "benchmark": "bench_train",
        "config": args.config,
        "objective": args.objective,
        "dtype": args.dtype,
        "scan_unroll": args.scan_unroll,
        "remat": args.remat,
        "params": counts["total_params"],
        "active_params": counts["active_params_per_token"],
        "batch": args.batch,
        "seq_len": args.seq_len,
        "step_ms": round(step_s * 1e3, 2),
        "tokens_per_s": round(tok_s, 1),
        "model_flops_per_token": flops_tok,
        "model_flop_per_s": round(model_flops / 1e9, 2) * 1e9,
        "peak_matmul_flop_per_s": round(peak_flops / 1e9, 2) * 1e9,
        "peak_before_after_gflops": [round(peak / 1e9, 1), round(peak_after / 1e9, 1)],
        "mfu": round(model_flops / peak_flops, 3),
        "target_mfu": 0.4,
        "final_loss": float(m["loss"]),
    }
    if args.profile:
        figures["profile"] = profile_step(jax.jit(step_fn), state, batch, args)
    print(json.dumps(figures))


TRAIN_CATEGORIES = [  # before benchmarking.CATEGORIES: what only a training step has
    ("optimizer update (AdamW, clipping, EMA)", r"optax|adam|scale_by|clip|global_norm|apply_updates|ema|tree_map"),
    ("loss (log-softmax, cross-entropy)", r"log_softmax|cross_entropy|logsumexp|take_along_axis|_nll|elbo"),
]


def profile_step(step, state, batch, args) -> dict:
    """The step's wall time and traced op time by category, written as markdown to `args.profile`."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "speed"))
    import benchmarking  # experiments/speed/benchmarking.py: the benchmarks' shared helpers

    categories = TRAIN_CATEGORIES + benchmarking.CATEGORIES
    result = benchmarking.profile(step, (state, batch), args.profile_repeats, categories)
    shares = result["share_by_category"]
    command = " ".join(
        f"--{k}={v}" for k, v in vars(args).items() if v not in ("", None) and k not in ("profile_repeats",)
    )
    lines = [
        f"Made by `python experiments/training/bench_train.py {command}` on {jax.devices()[0].device_kind}; the traced op time "
        f"by category ({result['traced_op_ms']:.0f} ms of ops per {result['wall_ms']:.0f} ms step; the backward pass "
        f"is {100 * result['backward_share']:.0f}% of the op time).",
        "",
        "| category | share of op time |",
        "|---|---:|",
        *(f"| {k} | {100 * v:.1f}% |" for k, v in shares.items()),
        "",
        "Top ops:",
        "",
        "| op | share | category | source (tail of op_name) |",
        "|---|---:|---|---|",
        *(
            f"| {o['op']} | {100 * o['share']:.1f}% | {o['category']} | `{o['op_name'][-70:]}` |"
            for o in result["top_ops"]
        ),
    ]
    out = pathlib.Path(args.profile)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return {k: result[k] for k in ("wall_ms", "traced_op_ms", "backward_share", "share_by_category")}


if __name__ == "__main__":
    main()
