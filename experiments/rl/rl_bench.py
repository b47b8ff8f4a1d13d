"""RL throughput at a config's batch: rollout tokens/s and update steps/s for each objective, side by side.

  python experiments/rl/rl_bench.py --config configs/rl_sudoku.py [--init_from toolbox:runs/sudoku_hard]
  python experiments/rl/rl_bench.py --config configs/countdown_rl.py --objectives diffu_grpo,wd1,elbo

Builds the RL run the config describes (`rl.command.setup`: the starting weights, the task's prompts, the rollout
sampler and the objective; without the starting run, `--init_from scratch` gives random weights of the same shape,
which time the same), then for each objective: one rollout (K prompts x G completions, the old and reference
log-probs of every inner update included) after a warm-up one, and the jitted update step (loss, gradients, the
optimizer) on that batch, the median of `--repeats` calls after a compiling one. Prints one JSON line: per objective
`rollout_s`, `rollout_tokens_per_s` (completion tokens the sampler generated per second), `update_s`,
`update_steps_per_s`, `steps_per_rollout_s` (what one rollout plus its mu updates cost) and
`compilations_per_rollout_after_first` (programs the timed rollout compiled: 0 expected), with the batch and the
machine.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import tempfile
import time

import jax
import numpy as np

from hackable_diffusion import builders, cli
from hackable_diffusion.rl import command
from hackable_diffusion.training import optimizers
from hackable_diffusion.training.compilations import count_compilations
from hackable_diffusion.training.train_state import TrainState, make_train_step


def time_objective(config, objective_name: str, repeats: int) -> dict:
    config = config.copy_and_resolve_references()
    config.rl.objective = objective_name
    with tempfile.TemporaryDirectory() as workdir:
        run = command.setup(config, workdir)
        params = run.trainable.init_fn(jax.random.key(0))
        run.stream.make_rollout(params, 0)  # warm-up rollout (compiles the sampler and the scorer)
        with count_compilations() as compiled:  # every rollout after the first reuses its programs: 0 expected
            start = time.perf_counter()
            batch = run.stream.make_rollout(params, 1)
            rollout_s = time.perf_counter() - start
        tokens = int(batch["completion"].sum())
        mu = run.stream.settings.inner_updates
        update = {k: v for k, v in batch.items() if not k.startswith("inner_")}
        for key in ("prompt_masked", "old_log_probs", "ref_log_probs"):
            update[key] = batch[f"inner_{key}"][0]
        update["update_seconds"] = np.zeros_like(batch["rewards"])
        optimizer = optimizers.make_optimizer(builders.optimizer_config(run.config), run.trainable.trainable_mask)
        state = TrainState.create(params, optimizer, jax.random.key(1), use_ema=False)
        step = jax.jit(make_train_step(run.loss_fn, optimizer, trainable_mask=run.trainable.trainable_mask))
        state, metrics = step(state, update)
        jax.block_until_ready(metrics)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            state, metrics = step(state, update)
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - start)
        update_s = statistics.median(times)
    return {
        "rollout_s": round(rollout_s, 4),
        "rollout_tokens_per_s": round(tokens / rollout_s, 1),
        "completion_tokens": tokens,
        "update_s": round(update_s, 4),
        "update_steps_per_s": round(1.0 / update_s, 3),
        "steps_per_rollout_s": round(rollout_s + mu * update_s, 4),
        "compilations_per_rollout_after_first": compiled.count,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="configs/rl_sudoku.py")
    parser.add_argument("--init_from", default="", help="KIND:PATH (default: the config's; 'scratch' if it is missing)")
    parser.add_argument("--objectives", default="diffu_grpo,wd1,elbo")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    config = cli.load_config_file(args.config)
    if args.init_from:
        kind, _, path = args.init_from.partition(":")
        config.init.kind, config.init.checkpoint = kind, path
    if config.init.kind == "toolbox" and not pathlib.Path(config.init.checkpoint).exists():
        config.init.kind = "scratch"  # the starting run is not here: random weights of the config's shape
    results = {name: time_objective(config, name, args.repeats) for name in args.objectives.split(",")}
    rl = config.rl
    print(
        json.dumps(
            {
                "benchmark": "rl",
                "config": args.config,
                "init": f"{config.init.kind}:{config.init.checkpoint}" if config.init.kind != "scratch" else "scratch",
                "prompts_per_rollout": int(rl.prompts_per_rollout),
                "group_size": int(rl.group_size),
                "inner_updates": int(rl.inner_updates),
                "objectives": results,
                "devices": [d.device_kind for d in jax.devices()],
                "cpu_count": os.cpu_count(),
                "machine": platform.machine(),
            }
        )
    )


if __name__ == "__main__":
    main()
