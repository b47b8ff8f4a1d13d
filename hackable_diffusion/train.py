"""Training entry point.

  python -m hackable_diffusion.train --config configs/quickstart.py --workdir runs/quickstart [--config.a.b=value]

Builds the experiment from the config (data, model, process, objective, optimizer, mesh), trains with periodic
evaluation and checkpoints (running the same command again resumes from the workdir), then prints a sample from the
configured sampler, or whatever the task reports (`tasks/`: a puzzle task solves held-out puzzles). The resolved
config is printed and saved to `workdir/config.json` (rerunning with changed overrides, e.g. a longer
`train.num_steps`, prints the changed keys and appends them to `workdir/config_changes.jsonl`); an override of a key
that does not exist stops the command with the closest existing keys. Multi-host: pass --coordinator_address,
--num_processes and --process_id (or set JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID).

Starting from weights (`config.init`, `--init_from KIND:PATH`; default kind "scratch": random init): the model stays
this config's (its shape, process and objective, e.g. a masking run started from an autoregressive one) with the
source's vocabulary and tokenizer, and the source's parameters are mapped onto it strictly
(`checkpoints.weight_matching.match_params`): each is loaded with its shape checked, or is new and allowed by
`init.allow_new`; the table of loaded / new / unused parameters is printed and saved as `workdir/init_report.json`.
The optimizer state, the data iterator and the step counter start fresh. A workdir with checkpoints resumes from them
and does not read the source again.
"""

from __future__ import annotations

import json

import jax
from absl import app, flags

from hackable_diffusion import builders, cli, finetune, run_config
from hackable_diffusion import experiment as exp_lib
from hackable_diffusion.checkpoints import base_weights, weight_matching
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.param_count import count_params, training_flops_per_token
from hackable_diffusion.training import loop, metrics
from hackable_diffusion.training.distributed import maybe_initialize_distributed

FLAGS = flags.FLAGS


def define_flags(argv: list[str]):
    """Flags of the command (defined only when run as a program, so the module imports cleanly elsewhere)."""
    argv = cli.define_config_file_flag(
        argv, "Experiment config file (configs/*.py); override keys with --config.a.b=value."
    )
    flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics.jsonl, tensorboard/, tokenizer.")
    flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-host).")
    flags.DEFINE_integer("num_processes", None, "Number of processes (multi-host).")
    flags.DEFINE_integer("process_id", None, "This process's index (multi-host).")
    flags.DEFINE_integer("distributed_timeout_s", 60, "Seconds to wait for the other processes.")
    flags.DEFINE_bool("sample_at_end", True, "Print samples from the trained model at the end.")
    base_weights.define_init_from_flag()
    return argv


def run(config, workdir: str, *, sample_at_end: bool = True):
    """Trains the experiment described by `config` in `workdir`; returns (experiment, final state). The config is
    checked before anything is written (a workdir holding another run, of another task or model shape, is refused
    there too), and the workdir is locked against a second writer while training; a start that fails before training
    begins removes what it wrote. With `config.init` naming weights, a fresh run starts from them (the module
    docstring)."""
    exp_lib.check_config(config)  # before anything is written: a bad value leaves the workdir as it was
    if not base_weights.has_checkpoints(workdir):  # a resumed run does not read config.init
        base_weights.check_init(config)
    run_config.check_same_run(config, workdir)  # a workdir of another run is refused as it is
    return finetune.locked_start(workdir, lambda started: _run(config, workdir, sample_at_end, started))


def _run(config, workdir: str, sample_at_end: bool, started):
    path = exp_lib.workdir_path(workdir)
    base = loaded = report = None
    if base_weights.has_checkpoints(path):
        config = base_weights.resumed_train_config(config, path)  # the init applies to a fresh run only
    elif base_weights.init_kind(config) != "scratch":  # strict: every parameter loaded or allowed new, before writing
        base = base_weights.load_base(config)
        config = base_weights.resolve_train_config(config, base)
        shapes = weight_matching.param_shapes(builders.build_model(config, int(config.model.vocab_size)))
        allow_new = base_weights.allow_patterns(config)
        loaded, report = weight_matching.match_params(base.params, shapes, allow_new=allow_new, source=base.source)
    if jax.process_index() == 0:
        print("Config:\n" + json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str), flush=True)
        run_config.save_config(config, path / "config.json")
        if report is not None:
            print(report.table(), flush=True)
            report.save(path)
    if base is not None:
        base_weights.install_tokenizer(base, path)
    exp = exp_lib.build(config, workdir)
    init_fn = lambda key: T.init_params(exp.model, key)  # noqa: E731
    if loaded is not None:
        if exp.model.cfg.vocab_size != config.model.vocab_size:
            raise ValueError(
                f"the run's tokenizer has {exp.tokenizer.vocab_size} ids, more than the {config.model.vocab_size} "
                f"rows of the source's embedding ({base.source}); train with the source's tokenizer."
            )
        init_fn = weight_matching.start_init_fn(exp.model, loaded)
    counts = count_params(exp.model.cfg)
    if jax.process_index() == 0:
        print(
            f"Model: {counts['total_params'] / 1e6:.2f}M parameters ({counts['active_params_per_token'] / 1e6:.2f}M "
            f"active); vocab {exp.tokenizer.vocab_size}; train sequences {len(exp.data.train_sequences)} "
            f"x {config.data.seq_len}; process {config.diffusion.process}; objective {type(exp.objective).__name__}",
            flush=True,
        )
    seq_len = config.data.seq_len
    flops = training_flops_per_token(exp.model.cfg, seq_len) * builders.objective_passes(config)
    settings = loop.LoopConfig.from_config(
        config.train,
        seed=config.seed,
        tokens_per_example=seq_len,
        flops_per_token=flops,
        peak_flops=config.train.get("peak_flops", 0) or metrics.calibrated_peak_flops(exp.model.cfg.compute_dtype),
    )
    started()  # from here a failure keeps what the run wrote (its checkpoints, metrics)
    state = finetune.train_loop(  # the mesh's divisibility was checked by check_config
        config,
        workdir,
        init_fn=init_fn,
        loss_fn=exp.objective,
        train_iterator=exp.task.train_iterator(exp, jax.process_index(), jax.process_count()),
        loop_settings=settings,
        eval_fn=exp.task.eval_fn(exp, workdir),
    )
    if sample_at_end and jax.process_index() == 0:
        params = state.ema_params if state.ema_params is not None else state.params
        print("\n" + exp.task.report(exp, params) + "\n", flush=True)
    return exp, state


def main(argv):
    del argv
    if FLAGS.config is None:
        raise app.UsageError("--config is required: a config file such as configs/quickstart.py.")
    if FLAGS.workdir is None:
        raise app.UsageError("--workdir is required (the run directory; rerunning with it resumes).")
    cli.quiet_library_logs()

    maybe_initialize_distributed(
        FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id, FLAGS.distributed_timeout_s
    )
    config = FLAGS.config
    if FLAGS.init_from:
        base_weights.set_init_from(config, FLAGS.init_from)
    run(config, FLAGS.workdir, sample_at_end=FLAGS.sample_at_end)


if __name__ == "__main__":
    cli.run_command(define_flags, main, __doc__)
