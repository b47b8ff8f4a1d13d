"""Few-step distillation of a diffusion run's canvas sampler: a k-step student from an N-step teacher.

  python -m hackable_diffusion.distill --config configs/distill_shakespeare_masking.py --workdir runs/distill

The teacher is the run `config.init` names (`--init_from toolbox:RUN|hf:DIR|params:DIR|gemma:DIR`), frozen; the
student starts as a copy of it (full, or LoRA adapters on it with `lora.rank > 0`, then the teacher is the LoRA-off
model and no second copy is held). From a toolbox run the student inherits the run's task, data, model shape,
diffusion recipe, sampler and solver sections (the layout the weights were trained in; `--config.<key>=value` on the
command line still applies to them); `distill.batch_size` canvases
per step, each giving `student_steps` rows. The teacher's trajectories (`teacher.py`) are made once with the task's
canvas sampler at `teacher_steps` (early stopping off; `consistency` draws near-greedily), cached in the run directory;
the method (`methods.py`) turns them into the student's rows, `student_loss.py` is the loss. The on-policy method
(`reverse_kl`) makes no trajectories: the task's training rows are its prompts (`PromptStream`), the student samples
at `student_steps` and `reverse_kl.py` is the loss. `fixed_order` keeps the teacher's own selection rule
(`distill.teacher_selection`, filled from the inherited sampler) and gives the student the `dilated` rule it is trained
in (a uniform student also `sampler.commit`). The run directory is the
usual one (orbax checkpoints with exact resume of the data position, SIGINT/SIGTERM safe, a workdir lock,
metrics.jsonl + TensorBoard, the task's evaluation every `train.eval_every` steps with the student's sampler); its
config.json holds `sampler.num_steps = student_steps`, so `sample` and `evaluate` on it run the student as trained.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from hackable_diffusion import builders, cli, finetune, run_config
from hackable_diffusion import experiment as exp_lib
from hackable_diffusion.checkpoints import base_weights
from hackable_diffusion.distill import methods as methods_lib
from hackable_diffusion.distill.reverse_kl import ReverseKLLoss
from hackable_diffusion.distill.student_loss import StudentLoss
from hackable_diffusion.distill.teacher import PromptStream, TeacherPool, build_pool
from hackable_diffusion.sampling import temperature as temperature_lib
from hackable_diffusion.sampling.early_stopping import NoEarlyStop
from hackable_diffusion.sampling.temperature import AnnealedTemperature
from hackable_diffusion.tasks.capabilities import HasCanvasSampler

DISTILL_KEYS = (
    "method", "teacher_steps", "student_steps", "pool_size", "batch_size", "greedy_temperature",
    "self_condition_prob", "keep", "teacher_selection", "student_process", "teacher_process",
    "student_temperature", "teacher_temperature",
)  # fmt: skip  (the run's keys; every method's fields are keys too: `distill_keys`)


def distill_keys() -> set[str]:
    """The keys a `config.distill` section may hold: the run's and every registered method's fields."""
    return set(DISTILL_KEYS) | set(methods_lib.method_settings())
#: sections a student takes from its teacher's run (the layout and task the weights were trained in)
INHERITED_SECTIONS = ("data", "diffusion", "sampler", "solver", "eval")


def check_distill_config(
    config: ml_collections.ConfigDict,
) -> methods_lib.DistillationMethod:
    """The checks of `config.distill` that need no weights; returns the method. ValueError names the key."""
    if "distill" not in config:
        raise ValueError("the config has no distill section: build it with hackable_diffusion.distill.settings.distill_sections.")
    d = config.distill
    unknown = sorted(set(d.keys()) - distill_keys())
    if unknown:
        raise ValueError(f"unknown config.distill keys {unknown}; valid keys: {sorted(distill_keys())}.")
    methods_lib.student_grid(int(d.teacher_steps), int(d.student_steps))
    if int(d.pool_size) < int(d.batch_size) or int(d.batch_size) < 1:
        raise ValueError(
            f"config.distill.batch_size={d.batch_size} must be >= 1 and <= pool_size={d.pool_size} (the teacher "
            "trajectories the run draws its batches from)."
        )
    if d.get("keep", "all") not in ("all", "correct"):
        raise ValueError(f"config.distill.keep={d.keep!r} must be 'all' or 'correct' (the teacher's successes).")
    if not 0 < float(d.greedy_temperature) <= 0.1:
        raise ValueError(f"config.distill.greedy_temperature={d.greedy_temperature} must lie in (0, 0.1].")
    return methods_lib.build_method(d)


def resolve_config(
    config: ml_collections.ConfigDict, base: base_weights.Base, overrides: Sequence[str] = ()
) -> ml_collections.ConfigDict:
    """The student run's config: the teacher's model shape; from a toolbox run also its data, diffusion, sampler,
    solver and eval sections, then the command line's `--config.a.b=value` `overrides` again (they may change what
    was inherited); the student's sampler at `student_steps`, the batch at `distill.batch_size`; with
    `distill.student_process` set, the student's process (the teacher's is kept as `distill.teacher_process`)."""
    config = config.copy_and_resolve_references()
    with config.unlocked():
        config.model = ml_collections.ConfigDict(dataclasses.asdict(base.model.cfg))
        source = base.source_config
        if source is not None:
            for name in INHERITED_SECTIONS:
                if name in source:
                    config[name] = source[name]
    if overrides:
        config = cli.parse_config_overrides(config, list(overrides))
    with config.unlocked():
        config.data.batch_size = int(config.distill.batch_size)
        config.sampler.num_steps = int(config.distill.student_steps)
        student_process = config.distill.get("student_process") or config.diffusion.process
        if student_process != config.diffusion.process:  # e.g. a masking student of a uniform teacher
            if config.distill.method != "fixed_order":
                raise ValueError(
                    f"config.distill.student_process={student_process!r} differs from the teacher's "
                    f"{config.diffusion.process!r}: only method='fixed_order' builds the student's states from the "
                    "teacher's end canvases alone; leave student_process empty."
                )
            if student_process not in ("masking", "uniform"):
                raise ValueError(f"config.distill.student_process={student_process!r} must be masking or uniform.")
            config.distill.teacher_process = config.diffusion.process
            config.diffusion.process = student_process
        if config.distill.method == "fixed_order":  # the student decodes in the order it is trained in
            if not config.distill.get("teacher_selection"):
                config.distill.teacher_selection = config.sampler.selection.copy_and_resolve_references()
            config.sampler.selection = ml_collections.ConfigDict(
                {"rule": methods_lib.FixedOrderDistillation.student_rule}
            )
            config.sampler.commit = config.diffusion.process != "masking"  # uniform: decided tokens stay
        student_temperature = config.distill.get("student_temperature") or ""
        if student_temperature:  # the student's own schedule; the teacher's trajectories keep the inherited one
            high, low, exponent = temperature_lib.parse_annealed(student_temperature)
            if not config.distill.get("teacher_temperature"):
                s = config.sampler
                config.distill.teacher_temperature = (
                    f"{s.max_temperature:g}/{s.min_temperature:g}^{s.get('temperature_exponent', 1.0):g}"
                )
            config.sampler.max_temperature, config.sampler.min_temperature = high, low
            if exponent is not None:
                config.sampler.temperature_exponent = exponent
    return config


def teacher_sampler(exp, config: ml_collections.ConfigDict, method, num_steps: int | None = None):
    """The task's own canvas sampler (`tasks.capabilities.HasCanvasSampler`; else the run's generic sampler) at
    `teacher_steps` (or `num_steps`: the student's, for on-policy rollouts), early stopping off; near-greedy for a
    greedy-teacher method."""
    d = config.distill
    if num_steps is None and d.get("teacher_process") and d.teacher_process != config.diffusion.process:
        config = config.copy_and_resolve_references()  # the teacher samples with its own process, not the student's
        with config.unlocked():
            config.diffusion.process = d.teacher_process
        exp = dataclasses.replace(exp, config=config, process=builders.build_process(config, exp.process.vocab_size))
    if isinstance(exp.task, HasCanvasSampler):
        sampler = exp.task.canvas_sampler(exp, config)
    else:
        sampler = builders.build_sampler(config, exp.process)
    canvas = int(config.diffusion.canvas_len or 0)
    steps = int(d.teacher_steps) if num_steps is None else num_steps
    overrides = dict(num_steps=steps, early_stopping=NoEarlyStop())
    if num_steps is None and d.get("teacher_selection"):  # the teacher's own rule (fixed_order: not the student's)
        overrides.update(selection=builders.build_selection(d.teacher_selection), commit=False)
    if num_steps is None and d.get("teacher_temperature"):  # the teacher's own schedule, not the student's
        high, low, exponent = temperature_lib.parse_annealed(d.teacher_temperature)
        overrides["temperature"] = AnnealedTemperature(low, high, 1.0 if exponent is None else exponent)
    if canvas:
        overrides["canvas_length"] = canvas
    if method.greedy_teacher:
        tau = float(d.greedy_temperature)
        overrides["temperature"] = AnnealedTemperature(tau, tau)
        overrides["score_temperature"] = sampler.score_temperature or 1.0  # rank by the model's own probabilities
    return sampler.replace(**overrides)


def run_distill(config: ml_collections.ConfigDict, workdir: str, overrides: Sequence[str] = ()):
    """Distils as `config` describes in `workdir` (rerunning resumes); returns the final TrainState. `overrides`
    (`--config.a.b=value` arguments) are applied again after the teacher's sections are inherited, so that a command
    line can change the inherited sampler or solver. The workdir is locked against a second writer meanwhile, and a
    start that fails before training begins removes what it wrote (`finetune.locked_start`)."""
    return finetune.locked_start(workdir, lambda started: _run_distill(config, workdir, overrides, started))


def _run_distill(config: ml_collections.ConfigDict, workdir: str, overrides: Sequence[str], started):
    method = check_distill_config(config)
    base_weights.check_init(config)
    if base_weights.init_kind(config) == "scratch":
        raise ValueError("distillation needs a teacher: set config.init (--init_from toolbox:RUN or hf:DIR).")
    path = exp_lib.workdir_path(workdir)
    base = base_weights.load_base(config)
    config = resolve_config(config, base, overrides)
    exp_lib.check_config(config)
    if jax.process_index() == 0:
        run_config.save_config(config, path / "config.json")
    base_weights.install_tokenizer(base, path)  # the teacher's own tokenizer folder: the ids its weights know
    exp = exp_lib.build(config, workdir)
    if exp.is_autoregressive or exp.process is None:
        raise ValueError("distillation shortens a diffusion sampler; the teacher run is autoregressive.")
    persistent = hasattr(exp.process, "mask_id")
    method.check_process(persistent)
    if not base_weights.has_checkpoints(path):  # the init table and init_report.json
        base_weights.report_start(base, exp.model, config, path)

    d = config.distill
    teacher = jax.tree.map(jnp.asarray, base.params)
    canvas_len = int(config.diffusion.canvas_len or 0)
    if method.on_policy:
        stream, objective, made = _on_policy(exp, config, method, teacher, canvas_len)
    else:
        stream, objective, made = _from_teacher_pool(exp, config, method, teacher, canvas_len, path, base.source)
    trainable = finetune.Trainable.from_config(config, base.params)
    selection = config.sampler.get("selection", {})
    if (
        jax.process_index() == 0
        and selection.get("rule") == "entropy_bound"
        and not selection.get("min_count")
        and canvas_len > int(d.student_steps)
    ):
        print(
            f"Note: the student's entropy-bound rule has no floor, so at {d.student_steps} steps per canvas of "
            f"{canvas_len} it decides what is left in its last step; --config.sampler.selection.min_count=even "
            "spreads the decisions evenly, and for a masking run --config.sampler.selection.rule=dilated (never two "
            "neighbours in one step) distilled best (results/text/README.md, 'Few-step decoding').",
            flush=True,
        )
    if jax.process_index() == 0:
        print(
            f"Distillation ({method.name}) from {base.source}: {trainable.describe()}; teacher {d.teacher_steps} "
            f"steps -> student {d.student_steps}; {made}, {d.batch_size} per step.",
            flush=True,
        )
    return finetune.finetune(
        config,
        workdir,
        trainable=trainable,
        loss_fn=trainable.loss_fn(objective),
        train_iterator=stream,
        started=started,
        task_eval=exp.task.eval_fn(exp, workdir),
    )


def _from_teacher_pool(exp, config, method, teacher, canvas_len: int, path, source: str):
    """(stream, objective, description) of the trajectory and consistency methods: a cached teacher pool."""
    d = config.distill
    pool = build_pool(
        model=exp.model,
        params=teacher,
        sampler=teacher_sampler(exp, config, method),
        prompt_batches=exp.task.train_iterator(exp, 0, 1),
        canvas_len=canvas_len,
        pool_size=int(d.pool_size),
        seed=int(config.seed),
        workdir=path,
        meta={"teacher": source, "method_teacher_greedy": method.greedy_teacher},
        keep_correct=d.get("keep", "all") == "correct",
    )
    stream = TeacherPool(
        pool,
        method,
        batch_size=int(d.batch_size),
        seed=int(config.seed),
        mask_id=getattr(exp.process, "mask_id", None),
        noise_ids=None if hasattr(exp.process, "mask_id") else np.flatnonzero(np.asarray(exp.process.allowed_vocab())),
    )
    objective = StudentLoss(
        exp.model, self_condition_prob=float(d.self_condition_prob), null_signal=str(config.diffusion.null_signal)
    )
    return stream, objective, f"{len(pool['trajectory']):,} teacher trajectories"


def _on_policy(exp, config, method, teacher, canvas_len: int):
    """(stream, objective, description) of the reverse-KL method: the task's training rows as prompts, the student's
    own samples at `student_steps` (the task's sampler, early stopping off), the frozen teacher's ELBO."""
    sampler = teacher_sampler(exp, config, method, num_steps=int(config.distill.student_steps))
    objective = ReverseKLLoss(
        exp.model,
        teacher,
        sampler,
        group_size=method.group_size,
        elbo_draws=method.elbo_draws,
        target_sharpness=method.target_sharpness,
        target_temperature=method.target_temperature,
        shared_noise=method.shared_noise,
        exact_entropy=method.exact_entropy,
    )
    stream = PromptStream(exp.task.train_iterator(exp, 0, 1), canvas_len)
    return stream, objective, f"on-policy, {method.group_size} samples per prompt, {method.elbo_draws} ELBO draws"


def define_flags(argv: list[str]):
    return cli.define_command_flags(
        argv,
        "Distillation config file (configs/distill_*.py); override keys: --config.a.b=value.",
        "Run directory: checkpoints, metrics, config.json (rerunning resumes).",
    )


def main(argv):
    from absl import flags

    del argv
    FLAGS = flags.FLAGS
    config = base_weights.config_from_command_flags(FLAGS, "configs/distill_shakespeare_masking.py")
    cli.quiet_library_logs()
    state = run_distill(config, FLAGS.workdir, overrides=[a for a in sys.argv[1:] if a.startswith("--config.")])
    print(
        f"Distillation done at step {int(state.step)}; evaluate with python -m hackable_diffusion.evaluate "
        f"--workdir {FLAGS.workdir}",
        flush=True,
    )
