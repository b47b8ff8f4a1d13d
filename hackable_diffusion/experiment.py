"""One experiment from one config: the task's data, the model, the noise process, the objective.

`build(config, workdir)` asks the task (`tasks.get_task(config.data.task)`) for the data and the objective's adapter
and `builders` for everything generic; `train.py`, `sample.py`, `evaluate.py` and `sft.py` all start here, from the
config saved in the workdir, so sampling and evaluation reuse exactly the model shape, process and tokenizer that
training used. Everything built is a frozen dataclass, so a notebook can build the same pieces by hand and swap any
of them. `check_config` runs every check that needs no data before a command writes anything.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import pathlib
from typing import Any

import ml_collections

from hackable_diffusion import builders, run_config
from hackable_diffusion.diffusion.processes import NoiseProcess
from hackable_diffusion.models import transformer as T
from hackable_diffusion.tasks import Task, get_task
from hackable_diffusion.training import optimizers, sharding


@dataclasses.dataclass(frozen=True)
class Experiment:
    config: ml_collections.ConfigDict
    model: T.Transformer
    process: NoiseProcess | None  # None for the autoregressive baseline
    objective: Any
    tokenizer: Any  # the task's: a data.tokenizers.Tokenizer, or the Sudoku vocabulary
    data: Any  # the task's data (text: data.text.TextData)
    task: Task

    @property
    def is_autoregressive(self) -> bool:
        return self.process is None


def schedules_at_end(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The config a trained run is evaluated or sampled with. There every adaptation schedule is at its end, so the
    canvas curriculum's last size is the canvas the run is evaluated at: an override of `diffusion.canvas_len`
    (the ELBO of one network against the canvas it reads) moves it along instead of failing the training-time check
    that the curriculum ends at the target canvas. Returns `config` itself when there is nothing to move."""
    section = config.get("adaptation")
    sizes = tuple(section.get("canvas_sizes") or ()) if section is not None else ()
    canvas = config.get("diffusion", {}).get("canvas_len")
    if not sizes or not canvas or int(sizes[-1]) == int(canvas):
        return config
    config = copy.deepcopy(config)
    with config.unlocked():
        config.adaptation.canvas_sizes = (*sizes[:-1], int(canvas))
    return config


def build(config: ml_collections.ConfigDict, workdir: str, *, inference: bool = False) -> Experiment:
    """The experiment of `config`. inference: the run is evaluated, sampled or served, not trained
    (`schedules_at_end`)."""
    if inference:
        config = schedules_at_end(config)
    task = get_task(config.data.task)
    data = task.build_data(config, workdir)
    vocab_size = data.tokenizer.vocab_size
    if config.get("init", {}).get("kind", "scratch") != "scratch":  # pretrained weights keep their (padded) vocabulary
        vocab_size = max(int(config.model.vocab_size), vocab_size)
    model = builders.build_model(config, vocab_size)
    process = builders.build_process(config, vocab_size)
    objective = task.adapt_objective(config, model, builders.build_objective(config, model, process))
    if builders.build_adaptation(config) is not None and not getattr(objective, "uses_step", False):
        raise ValueError(
            f"config.adaptation: the {config.data.task!r} task replaces the objective with one that does not take "
            "the training step; remove config.adaptation for this task."
        )
    return Experiment(
        config=config, model=model, process=process, objective=objective, tokenizer=data.tokenizer, data=data, task=task
    )


def from_workdir(workdir: str) -> Experiment:
    """Rebuilds the experiment of a training run from its saved config and tokenizer."""

    return build(run_config.load_saved_config(workdir), workdir, inference=True)


def workdir_path(workdir: str) -> pathlib.Path:
    path = pathlib.Path(workdir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def check_config(config: ml_collections.ConfigDict) -> None:
    """Every check of a training config that needs no data and no compilation, so that a bad value stops the command
    before anything is written to the workdir: loop sizes, the optimizer schedule, the model shape, the process,
    objective and sampler, the task's own keys (text: that the corpus files exist), the mesh and batch divisibility.
    Raises ValueError (or FileNotFoundError for data) naming the key and how to fix it."""
    import jax

    t, d = config.train, config.data
    positive = {
        "train.num_steps": t.num_steps,
        "train.grad_accum_steps": t.grad_accum_steps,
        "train.keep_checkpoints": t.keep_checkpoints,
        "data.batch_size": d.batch_size,
    }
    for key, value in positive.items():
        if int(value) < 1:
            raise ValueError(f"config.{key}={value} must be >= 1.")
    for key in ("log_every", "eval_every", "checkpoint_every"):
        if int(t[key]) < 0:
            raise ValueError(f"config.train.{key}={t[key]} must be >= 0 (0 turns it off).")
    if not 0.0 <= float(t.ema_decay) < 1.0:
        raise ValueError(f"config.train.ema_decay={t.ema_decay} must be in [0, 1) (0: no EMA).")
    task = get_task(d.task)
    resolved = builders.optimizer_config(config)
    if int(resolved.warmup_steps) > int(resolved.total_steps):
        raise ValueError(
            f"config.optimizer.warmup_steps={resolved.warmup_steps} is longer than the run "
            f"({resolved.total_steps} steps); lower it or raise config.train.num_steps."
        )
    optimizers.make_optimizer(resolved)  # the optimizer name and schedule
    vocab = int(config.model.get("vocab_size") or 0) or 256
    model = builders.build_model(config, vocab)
    process = builders.build_process(config, vocab)
    builders.build_objective(config, model, process)
    if process is not None:
        builders.build_sampler(config, process)
    task.check_config(config)
    mesh = sharding.mesh_shape(config.mesh, jax.device_count())
    shards = mesh[0] * mesh[1]  # data x fsdp split the batch
    global_batch = int(d.batch_size) * jax.process_count()
    if global_batch % shards:
        raise ValueError(
            f"the global batch ({d.batch_size} per process x {jax.process_count()} processes = {global_batch}) is "
            f"not divisible by the mesh's data x fsdp = {shards} devices; set config.data.batch_size to a multiple "
            f"of {shards // math.gcd(shards, jax.process_count())} or change config.mesh."
        )
