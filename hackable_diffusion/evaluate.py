"""Evaluation entry point: what is measured is the run's own task's evaluation.

  python -m hackable_diffusion.evaluate --workdir runs/NAME [--config.<path>=value] [the task's flags]

A text run reports its validation likelihood: the exact NLL of an autoregressive run, the ELBO of a diffusion run
(`--num_batches`, `--repeats`; `--num_samples N` also samples, `--scorer_workdir AR_RUN` scores them); a Sudoku run
solves held-out grids from a CSV file or the generator with its solver settings. Each task declares its evaluation
and flags (`tasks/text_evaluation.py`, `tasks/sudoku/evaluation.py`); `--help` with a `--workdir` lists
the flags of that run's task. `--config.<path>=value` overrides any key of the run's saved config (the sampler, the
Sudoku solver, `model.depth_loops` of a looped model...); the overridden keys are reported with the result. Prints
one JSON line.
"""

from __future__ import annotations

from typing import Any

import ml_collections
from absl import app, flags

from hackable_diffusion import cli

FLAGS = flags.FLAGS
COUNT_FLAGS = ("batch_size", "limit", "num_batches", "num_samples", "max_new_tokens", "subset", "step")  # of any task
_SAVED: dict[str, ml_collections.ConfigDict] = {}  # the run's saved config, read once while the flags are defined


def define_flags(argv: list[str]):
    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion.tasks import TASKS, get_task

    config, saved = cli.define_workdir_config_flag(argv)
    if saved is not None:
        _SAVED["config"] = saved
    flags.DEFINE_string("workdir", None, "A training workdir, or hf:DIR for a Hugging Face checkpoint directory.")
    flags.DEFINE_integer("seed", 0, "Seed for the noise levels, the samples and the solver.")
    flags.DEFINE_integer("batch_size", 0, "Evaluation batch size (0: the task's default).")
    flags.DEFINE_enum(
        "weights", "ema", ["ema", "raw"], "ema: the run's EMA weights when it kept them; raw: the trained."
    )
    flags.DEFINE_integer("step", 0, "The checkpoint step to evaluate (0: the latest).")
    names = [config.data.task] if saved is not None else list(TASKS)  # no run yet (a dry parse): every task's flags
    for name in names:
        get_task(name).define_evaluation_flags(FLAGS)


def load_run(
    workdir: str, *, weights: str = "ema", config: ml_collections.ConfigDict | None = None, step: int | None = None
):
    """(experiment, params, checkpoint step, weights used) of the run in `workdir`; `config`: its saved config with
    overrides (None: as saved); `step`: the checkpoint to read (None: the latest)."""
    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion import run_config
    from hackable_diffusion.checkpoints import toolbox

    toolbox.check_weights(weights)
    config = config if config is not None else run_config.load_saved_config(workdir)
    exp = exp_lib.build(config, workdir, inference=True)
    used = "ema" if weights == "ema" and exp.config.train.ema_decay > 0 else "raw"
    params, step = toolbox.load_params(exp, workdir, weights=used, step=step)
    return exp, params, step, used


def run(
    workdir: str,
    evaluation: Any,
    *,
    config: ml_collections.ConfigDict | None = None,
    saved: ml_collections.ConfigDict | None = None,
    weights: str = "ema",
    seed: int = 0,
    step: int | None = None,
) -> dict:
    """Runs `evaluation` (a task's `Evaluation`, e.g. `tasks.text_evaluation.Likelihood()` or
    `tasks.sudoku.evaluation.SolvePuzzles(...)`) on the run in `workdir`. `config`: the run's saved config with
    overrides (None: as saved); `saved`: that saved config when the caller already read it; `step`: the checkpoint to
    evaluate (None: the latest)."""
    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion import run_config

    saved = saved if saved is not None else run_config.load_saved_config(workdir)
    exp, params, step, used = load_run(
        workdir, weights=weights, config=config if config is not None else saved, step=step
    )
    result = evaluation(exp, params, seed=seed, load_run=lambda other: load_run(other)[:2])
    changed = run_config.config_changes(saved.to_dict(), exp.config.to_dict())
    head = {
        "task": exp.task.name,
        "evaluation": type(evaluation).__name__,
        "workdir": workdir,
        "checkpoint_step": step,
        "weights": used,
        "config_overrides": {key: [old, new] for key, (old, new) in changed.items()},
    }
    return {**head, **result}


def main(argv):
    del argv
    if FLAGS.workdir is None:
        raise app.UsageError("--workdir is required.")
    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion.checkpoints import hf_runs
    from hackable_diffusion.tasks import get_task

    cli.quiet_library_logs()
    for name in COUNT_FLAGS:  # bad counts first, whatever the workdir holds
        if name in FLAGS and FLAGS[name].value is not None and FLAGS[name].value < 0:
            raise app.UsageError(f"--{name}={FLAGS[name].value} must be >= 0 (0: the default).")
    workdir = hf_runs.resolve_workdir(FLAGS.workdir)  # hf:DIR -> the run directory that stands for the checkpoint
    if "config" not in _SAVED:  # the workdir holds no run (define_flags found no config.json there)
        # deferred: the command loads no jax before it runs (test_light_imports.py)
        from hackable_diffusion import run_config

        run_config.load_saved_config(workdir)  # raises the clear error
    evaluation = get_task(FLAGS.config.data.task).evaluation_from_flags(FLAGS)
    result = run(
        workdir,
        evaluation,
        config=FLAGS.config,
        saved=_SAVED["config"],
        weights=FLAGS.weights,
        seed=FLAGS.seed,
        step=FLAGS.step or None,
    )
    print(cli.json_line(result))


if __name__ == "__main__":
    cli.run_command(define_flags, main, __doc__)
