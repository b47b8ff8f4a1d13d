"""How noisy is the reverse-KL policy gradient, and how much do its variance reductions remove?

  python experiments/distill/reverse_kl_variance.py --run runs/distill_qs_reverse_kl --seeds 8

Takes a reverse-KL distillation run (its config names the teacher and the student's sampler; the student is the
run's latest checkpoint, or the teacher itself with `--at_start`) and one batch of its prompts. For each estimator
(plain; `shared_noise`: the group's ELBO draws share noise levels and masks; `exact_entropy`: the log q terms by their
conditional expectations; both) it computes the gradient of the loss for `--seeds` rollout keys at fixed weights and
reports the variance of one estimate (summed over parameters, about the estimator's own mean over the seeds) beside
the squared norm of the four estimators' mean gradient. The seeds are the same for every estimator, so they see the
same student samples. All four estimate the same expected gradient (tests/distill/test_reverse_kl.py checks that by
enumeration), so a variance ratio is the factor of rollouts one estimator saves over another. Prints one JSON line;
`--out FILE` also writes it as a file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time

import numpy as np

from hackable_diffusion import cli

ESTIMATORS = {
    "plain": dict(shared_noise=False, exact_entropy=False),
    "shared_noise": dict(shared_noise=True, exact_entropy=False),
    "exact_entropy": dict(shared_noise=False, exact_entropy=True),
    "both": dict(shared_noise=True, exact_entropy=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a reverse-KL distillation run directory")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--at_start", action="store_true", help="the gradient at the teacher's weights")
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.checkpoints import toolbox
    from hackable_diffusion.distill import command

    cli.quiet_library_logs()
    exp = exp_lib.from_workdir(args.run)
    config = exp.config
    if config.get("distill", {}).get("method") != "reverse_kl":
        cli.fail(f"--run {args.run} is not a reverse-KL distillation run (config.distill.method).")
    teacher_dir = config.init.checkpoint
    teacher_exp = exp_lib.from_workdir(teacher_dir)
    teacher, _ = toolbox.load_params(teacher_exp, teacher_dir)
    teacher = jax.tree.map(jnp.asarray, teacher)
    student, step = (teacher, 0) if args.at_start else toolbox.load_params(exp, args.run)
    method = command.check_distill_config(config)
    stream, objective, _ = command._on_policy(exp, config, method, teacher, int(config.diffusion.canvas_len))
    batch = {k: jnp.asarray(v) for k, v in next(stream).items()}

    estimates, seconds = {}, {}
    for name, settings in ESTIMATORS.items():
        loss = dataclasses.replace(objective, **settings)
        grad_fn = jax.jit(jax.grad(lambda p, k, loss=loss: loss(p, batch, k)[0]))
        jax.block_until_ready(grad_fn(student, jax.random.key(10_000)))  # compile
        start = time.perf_counter()
        rows = []
        for seed in range(args.seeds):
            g = grad_fn(student, jax.random.key(seed))
            rows.append(np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(g)]))
        seconds[name] = (time.perf_counter() - start) / args.seeds
        estimates[name] = np.stack(rows)
    common = np.mean([g.mean(axis=0) for g in estimates.values()], axis=0)
    out = {
        "run": args.run,
        "checkpoint_step": int(step),
        "prompts": int(batch["fixed"].shape[0]),
        "group_size": objective.group_size,
        "elbo_draws": objective.elbo_draws,
        "seeds": args.seeds,
        "mean_gradient_sq_norm": float(common @ common),
    }
    for name, g in estimates.items():
        out[f"{name}_variance"] = float(np.sum(np.var(g, axis=0, ddof=1)))
        out[f"{name}_seconds_per_gradient"] = seconds[name]
    for name in ESTIMATORS:
        out[f"{name}_variance_ratio"] = out[f"{name}_variance"] / out["plain_variance"]
    line = cli.json_line(out)
    print(line, flush=True)
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
