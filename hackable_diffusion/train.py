"""Training entry point.

  python -m hackable_diffusion.train --config configs/quickstart.py --workdir runs/quickstart [--config.a.b=value]

Builds the experiment from the config (data, model, process, objective, optimizer, mesh), trains with periodic
evaluation and checkpoints (running the same command again resumes from the workdir), then prints a sample from the
configured sampler (Sudoku, `config.data.task="sudoku"`: solves held-out generated puzzles instead). The resolved
config is printed and saved to `workdir/config.json` (rerunning with changed overrides, e.g. a longer
`train.num_steps`, prints the changed keys and appends them to `workdir/config_changes.jsonl`); an override of a key
that does not exist stops the command with the closest existing keys. Multi-host: pass --coordinator_address,
--num_processes and --process_id (or set JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID).
"""

from __future__ import annotations

import json

from absl import app, flags

from hackable_diffusion import cli

FLAGS = flags.FLAGS


def define_flags(argv: list[str]):
    """Flags of the command (defined only when run as a program, so the module imports cleanly elsewhere)."""
    cli.define_config_file_flag(argv, "Experiment config file (configs/*.py); override keys with --config.a.b=value.")
    flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics.jsonl, tensorboard/, tokenizer.")
    flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-host).")
    flags.DEFINE_integer("num_processes", None, "Number of processes (multi-host).")
    flags.DEFINE_integer("process_id", None, "This process's index (multi-host).")
    flags.DEFINE_integer("distributed_timeout_s", 60, "Seconds to wait for the other processes.")
    flags.DEFINE_bool("sample_at_end", True, "Print samples from the trained model at the end.")


def run(config, workdir: str, *, sample_at_end: bool = True):
    """Trains the experiment described by `config` in `workdir`; returns (experiment, final state). The config is
    checked before anything is written, and the workdir is locked against a second writer while training."""
    import contextlib

    import jax

    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.training.workdir_lock import WorkdirLock

    exp_lib.check_config(config)  # before anything is written: a bad value leaves the workdir as it was
    with WorkdirLock(workdir) if jax.process_index() == 0 else contextlib.nullcontext():
        return _run(config, workdir, sample_at_end=sample_at_end)


def _run(config, workdir: str, *, sample_at_end: bool):
    import jax

    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.data import text as text_lib
    from hackable_diffusion.models import partitioning
    from hackable_diffusion.models import transformer as T
    from hackable_diffusion.models.param_count import count_params
    from hackable_diffusion.training import loop, metrics, sharding

    path = exp_lib.workdir_path(workdir)
    if jax.process_index() == 0:
        print("Config:\n" + json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str), flush=True)
        cli.save_config(config, path / "config.json")
    exp = exp_lib.build(config, workdir)
    counts = count_params(exp.model.cfg)
    is_sudoku = config.data.task == "sudoku"
    if jax.process_index() == 0:
        print(
            f"Model: {counts['total_params'] / 1e6:.2f}M parameters ({counts['active_params_per_token'] / 1e6:.2f}M "
            f"active); vocab {exp.tokenizer.vocab_size}; train sequences {len(exp.data.train_sequences)} "
            f"x {config.data.seq_len}; process {config.diffusion.process}; objective {type(exp.objective).__name__}",
            flush=True,
        )

    mesh = sharding.make_mesh(config.mesh)  # its divisibility was checked by check_config
    if is_sudoku:
        train_iter = exp_lib.make_sudoku_train_iterator(
            exp.data.train_tokens,
            exp.data.train_fixed,
            config.data.batch_size,
            config.seed,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
        )
    else:
        train_iter = text_lib.make_train_iterator(
            exp.data.train_sequences,
            config.data.batch_size,
            config.seed,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
        )

    def sudoku_scores(params, num_puzzles: int) -> dict:
        out = exp_lib.evaluate_sudoku(
            exp,
            params,
            exp.data.eval_puzzles[:num_puzzles],
            exp.data.eval_solutions[:num_puzzles],
            seed=config.seed,
            batch_size=config.eval.batch_size,
        )
        keys = ("accuracy", "blank_accuracy", "forward_passes_per_puzzle")
        return {f"sudoku_{k}" if not k.startswith("sudoku") else k: out[k] for k in keys}

    def sudoku_eval_fn(params, ema_params):
        use = ema_params if ema_params is not None else params
        out = exp_lib.evaluate_sudoku_elbo(exp, use, num_batches=config.eval.num_batches)
        if config.eval.num_puzzles and jax.process_count() == 1:
            out.update(sudoku_scores(use, config.eval.num_puzzles))
        return {k: v for k, v in out.items() if isinstance(v, (int, float))}

    def eval_fn(params, ema_params):
        use = ema_params if ema_params is not None else params
        out = exp_lib.evaluate_likelihood(exp, use, num_batches=config.eval.num_batches)
        if config.eval.num_samples and jax.process_count() == 1:
            prompts = [config.sampler.prompt] * config.eval.num_samples
            texts, result = exp_lib.sample_texts(exp, use, prompts, seed=config.seed)
            out["sample_forward_passes"] = result.forward_passes
            with open(path / "samples.txt", "a") as f:
                f.write("--- eval samples ---\n" + "".join(f"{config.sampler.prompt}{t}\n" for t in texts))
            print("eval sample: " + repr(config.sampler.prompt + texts[0][:200]), flush=True)
        return {k: v for k, v in out.items() if isinstance(v, (int, float))}

    optimizer_cfg = exp_lib.optimizer_config(config)
    seq_len = config.data.seq_len
    flops = exp_lib.flops_per_token(exp.model, seq_len) * exp_lib.objective_passes(config)
    state = loop.train(
        workdir=workdir,
        init_fn=lambda key: T.init_params(exp.model, key),
        loss_fn=exp.objective,
        train_iterator=train_iter,
        total_steps=config.train.num_steps,
        optimizer_cfg=optimizer_cfg,
        mesh=mesh,
        param_logical_axes_fn=partitioning.logical_axes,
        seed=config.seed,
        grad_accum_steps=config.train.grad_accum_steps,
        ema_decay=config.train.ema_decay,
        log_every=config.train.log_every,
        checkpoint_every=config.train.checkpoint_every,
        keep_checkpoints=config.train.keep_checkpoints,
        eval_fn=sudoku_eval_fn if is_sudoku else eval_fn,
        eval_every=config.train.eval_every,
        tokens_per_example=seq_len,
        flops_per_token=flops,
        peak_flops=config.train.get("peak_flops", 0) or metrics.calibrated_peak_flops(exp.model.cfg.compute_dtype),
    )
    if sample_at_end and jax.process_index() == 0 and is_sudoku:
        params = state.ema_params if state.ema_params is not None else state.params
        num = config.eval.num_puzzles or 16
        scores = sudoku_scores(params, num)
        print(
            f"\nSolved held-out puzzles ({config.sampler.selection}, {scores['sudoku_forward_passes_per_puzzle']:.1f} "
            f"forward passes each): accuracy {scores['sudoku_accuracy']:.3f}, blank accuracy "
            f"{scores['sudoku_blank_accuracy']:.3f} over {min(num, len(exp.data.eval_puzzles))} puzzles\n",
            flush=True,
        )
    elif sample_at_end and jax.process_index() == 0:
        params = state.ema_params if state.ema_params is not None else state.params
        texts, result = exp_lib.sample_texts(exp, params, [config.sampler.prompt], seed=config.seed)
        kind = "autoregressive" if exp.is_autoregressive else f"diffusion ({config.sampler.selection})"
        print(
            f"\nSample ({kind}, {result.forward_passes} forward passes):\n{config.sampler.prompt}{texts[0]}\n",
            flush=True,
        )
    return exp, state


def main(argv):
    del argv
    if FLAGS.config is None:
        raise app.UsageError("--config is required: a config file such as configs/quickstart.py.")
    if FLAGS.workdir is None:
        raise app.UsageError("--workdir is required (the run directory; rerunning with it resumes).")
    from hackable_diffusion.training.distributed import maybe_initialize_distributed

    cli.quiet_library_logs()

    maybe_initialize_distributed(
        FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id, FLAGS.distributed_timeout_s
    )
    run(FLAGS.config, FLAGS.workdir, sample_at_end=FLAGS.sample_at_end)


if __name__ == "__main__":
    cli.run_command(define_flags, main, __doc__)
