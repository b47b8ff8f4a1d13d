"""RL from verifiable rewards on any toolbox run with any registered objective (`objectives.OBJECTIVES`).

  python -m hackable_diffusion.rl --config configs/rl_sudoku.py --workdir runs/rl_sudoku

Starts from the weights `config.init` names (`--init_from KIND:PATH`: a toolbox run, a params directory, a gemma tree,
a Hugging Face directory), takes their model shape and, from a toolbox run, its diffusion recipe (the layout the
weights were trained in), and trains with `config.rl` (objectives: docs/rl.md). Full fine-tuning (`lora.rank=0`) or
LoRA; the reference of the KL term is the starting weights (LoRA: the base, no second copy). Rerunning the command
with the same --workdir resumes exactly (the rollout state is in the checkpoint).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from hackable_diffusion import cli, finetune, run_config
from hackable_diffusion import experiment as exp_lib
from hackable_diffusion.checkpoints import base_weights
from hackable_diffusion.rl import objectives as rl_objectives
from hackable_diffusion.rl.rollouts import RolloutSettings, RolloutStream
from hackable_diffusion.rl.scorers import AutoregressiveScorer, MeanFieldScorer, TrajectoryScorer
from hackable_diffusion.tasks import get_task
from hackable_diffusion.tasks.capabilities import (
    CutsCompletionsAtEos,
    RecordsCommitOrder,
    RestrictsRolloutTokens,
    RewardTask,
    require,
)
from hackable_diffusion.training import sharding
from hackable_diffusion.training.train_state import APPLY_UPDATE

RL_KEYS = (
    "objective", "prompts_per_rollout", "group_size", "inner_updates", "prompt_mask_prob", "advantage_scale",
    "kl_beta", "shaped_reward", "temperature", "dynamic_sampling", "scorer", "trajectory_passes_per_forward",
    "loss_normalization", "skip_uninformative_steps", "stop_at_eos",
)  # fmt: skip  (the keys every objective shares; each objective's own are its section config.rl.<name>)
MOVED_KEYS = {  # flat keys of configs written before each objective had its section -> where they are now
    "clip_eps": "diffu_grpo.clip_eps / ar_grpo.clip_eps", "wd1_psi": "wd1.psi",
    "wd1_negative_weight": "wd1.negative_weight", "wd1_zero_tied_groups": "wd1.zero_tied_groups",
    "elbo_draws": "elbo.draws / expert_iteration.draws",
}  # fmt: skip
SCORERS = ("mean_field", "trajectory")


def objective_section(rl: ml_collections.ConfigDict, cls) -> dict:
    """The objective's section: its defaults (`cls.settings()`) with what `config.rl.<name>` sets; ValueError for a
    key it does not have."""
    given = rl.get(cls.name, {})
    given = given.to_dict() if isinstance(given, ml_collections.ConfigDict) else dict(given)
    unknown = sorted(set(given) - set(cls.settings()))
    if unknown:
        raise ValueError(
            f"unknown config.rl.{cls.name} keys {unknown}; valid keys: {sorted(cls.settings())} "
            f"(the fields of {cls.__module__}.{cls.__name__})."
        )
    return {**cls.settings(), **given}


def check_rl_config(config: ml_collections.ConfigDict, *, autoregressive: bool | None = None) -> None:
    """Every `config.rl` check that needs no data (`autoregressive=None`: before the run's layout is known, the checks
    that do not depend on it); raises ValueError naming the key. What each objective accepts is declared on its class
    (`objectives.base.PolicyObjective`): no objective is named here."""
    rl = config.rl
    moved = sorted(set(rl.keys()) & set(MOVED_KEYS))
    if moved:
        raise ValueError(
            f"config.rl keys {moved} are now in each objective's section: "
            + ", ".join(f"rl.{key} -> rl.{MOVED_KEYS[key]}" for key in moved)
            + "."
        )
    unknown = sorted(set(rl.keys()) - set(RL_KEYS) - set(rl_objectives.OBJECTIVES))
    if unknown:
        raise ValueError(
            f"unknown config.rl keys {unknown}; valid keys: {sorted(RL_KEYS)} and the objectives' sections "
            f"{sorted(rl_objectives.OBJECTIVES)}."
        )
    cls = rl_objectives.objective_class(rl.objective)
    for other in rl_objectives.OBJECTIVES.values():
        objective_section(rl, other)
    cls.check_settings(objective_section(rl, cls))
    if float(rl.kl_beta) < 0 or float(rl.temperature) <= 0:
        raise ValueError(
            f"config.rl.kl_beta={rl.kl_beta} must be >= 0 and temperature={rl.temperature} > 0 (rollouts need "
            "randomness)."
        )
    extra = rl.get("dynamic_sampling", 0)
    if isinstance(extra, bool) or not isinstance(extra, int) or extra < 0:
        raise ValueError(
            f"config.rl.dynamic_sampling={extra!r} must be an integer >= 0: the most extra draws of "
            "prompts_per_rollout x group_size per rollout to fill the batch with groups whose rewards differ (0: off)."
        )
    scorer = rl.get("scorer", "mean_field")
    if scorer not in SCORERS:
        raise ValueError(f"config.rl.scorer={scorer!r} must be one of {SCORERS}.")
    per_forward = rl.get("trajectory_passes_per_forward", 1)
    if isinstance(per_forward, bool) or not isinstance(per_forward, int) or per_forward < 1:
        raise ValueError(
            f"config.rl.trajectory_passes_per_forward={per_forward!r} must be an integer >= 1 (the sampler passes "
            "scored from one forward of the trajectory scorer)."
        )
    accum = int(config.get("train", {}).get("grad_accum_steps", 1))
    if accum > 1:
        raise ValueError(
            f"config.train.grad_accum_steps={accum}: RL's losses are normalised over the whole rollout batch and wd1 "
            "weighs whole groups, which strided micro-batches would split; set it to 1 (lower rl.prompts_per_rollout "
            "or rl.group_size to fit memory)."
        )
    if not isinstance(rl.get("stop_at_eos", False), bool):
        raise ValueError(f"config.rl.stop_at_eos={rl.get('stop_at_eos')!r} must be True or False.")
    if rl.get("stop_at_eos", False):
        require(
            get_task(config.get("data", {}).get("task", "text")),
            CutsCompletionsAtEos,
            "config.rl.stop_at_eos (it cuts a completion at its first EOS)",
            "set it to False",
        )
    settings = rollout_settings(config)
    check_paper_options(config)
    if not cls.has_kl and float(rl.kl_beta):
        raise ValueError(
            f"config.rl.kl_beta={rl.kl_beta}: {rl.objective} imitates completions that are not the policy's samples "
            "(a search's), so the k3 estimate would not estimate the KL; set config.rl.kl_beta=0."
        )
    if not cls.grouped and extra:
        raise ValueError(
            f"config.rl.dynamic_sampling draws again for groups whose rewards tie; {rl.objective} uses no groups: "
            "set it to 0."
        )
    if cls.grouped and settings.group_size < 2:
        ungrouped = [name for name, c in rl_objectives.OBJECTIVES.items() if not c.grouped]
        raise ValueError(
            f"config.rl.group_size={settings.group_size}: {rl.objective} compares the completions of one prompt, so "
            f"it needs group_size >= 2 (a group of one is for {ungrouped})."
        )
    if autoregressive is None:
        return
    if autoregressive and scorer != "mean_field":
        raise ValueError(
            f"config.rl.scorer={scorer!r} scores a diffusion sampler's passes; an autoregressive run's log-probs are "
            "exact already: leave config.rl.scorer='mean_field'."
        )
    if scorer == "trajectory" and not cls.trajectory_scorer:
        takes = [name for name, c in rl_objectives.OBJECTIVES.items() if c.trajectory_scorer]
        raise ValueError(
            f"config.rl.scorer='trajectory' is for {takes}; objective={rl.objective!r} scores its own way (its file "
            f"{cls.__module__})."
        )
    kind = "autoregressive" if autoregressive else "diffusion"
    if kind not in cls.run_kinds:
        fits = [name for name, c in rl_objectives.OBJECTIVES.items() if kind in c.run_kinds]
        runs = " or ".join(("an " if k[0] in "aeiou" else "a ") + f"{k} run" for k in cls.run_kinds)
        raise ValueError(
            f"config.rl.objective={rl.objective!r} needs {runs}; this run "
            f"is {kind}: use one of {fits}."
        )
    if autoregressive and settings.prompt_mask_prob:
        raise ValueError("config.rl.prompt_mask_prob masks the prompt of a diffusion run; set it to 0 for an AR run.")


def check_paper_options(config: ml_collections.ConfigDict) -> None:
    """The `config.rl` options that choose between a paper's definition and a variant (docs/rl.md)."""
    rl = config.rl
    norm = rl.get("loss_normalization", "paper")
    cls = rl_objectives.objective_class(rl.objective)
    if cls.normalization_kind is not None:
        rl_objectives.resolve_normalization(cls.normalization_kind, norm)
    elif norm != "paper":
        raise ValueError(
            f"config.rl.loss_normalization={norm!r}: objective={rl.objective!r} has one normalisation; "
            "leave it 'paper'."
        )
    if rl.get("scorer", "mean_field") == "trajectory" and float(rl.prompt_mask_prob):
        raise ValueError(
            f"config.rl.scorer='trajectory' scores the sampler's own probability, which never masks the prompt; set "
            f"config.rl.prompt_mask_prob=0 (got {rl.prompt_mask_prob})."
        )


def check_unshifted_start(config: ml_collections.ConfigDict) -> None:
    """Refuses starting weights trained with `diffusion.token_shift` (the scorers read each position's own logits),
    from the config and the starting run's config.json alone: before any weights are read."""
    if starting_diffusion(config).get("token_shift", False):
        raise ValueError(
            "the starting run was trained with diffusion.token_shift (each position read from the logits to its left), "
            "which the RL scorers do not read; start RL from a run trained without it."
        )


def with_update_gate(loss_fn: Any, *, grouped: bool = True) -> Any:
    """`loss_fn` reporting `train_state.APPLY_UPDATE` = 1 when the batch holds an informative group (an objective
    that is not `grouped`, e.g. expert iteration, whose groups of one always tie: an accepted completion), else 0
    (`rl.skip_uninformative_steps`: the train step then leaves the weights, optimizer state and EMA untouched)."""
    useful = "valid" if grouped else "solved"  # the rows the objective learns from

    def loss(params, batch, key):
        value, metrics = loss_fn(params, batch, key)
        return value, {**metrics, APPLY_UPDATE: (jnp.max(batch[useful]) > 0).astype(jnp.float32)}

    return loss


def rollout_settings(config: ml_collections.ConfigDict) -> RolloutSettings:
    rl = config.rl
    return RolloutSettings(
        prompts_per_rollout=int(rl.prompts_per_rollout),
        group_size=int(rl.group_size),
        inner_updates=int(rl.inner_updates),
        prompt_mask_prob=float(rl.prompt_mask_prob),
        advantage_scale=str(rl.advantage_scale),
        seed=int(config.seed),
        dynamic_sampling=int(rl.get("dynamic_sampling", 0)),  # absent from configs saved before it existed
    )


def resolve_config(config: ml_collections.ConfigDict, base: base_weights.Base) -> ml_collections.ConfigDict:
    """The run's config: the starting weights' model shape and, from a toolbox run, its task and diffusion recipe."""
    config = config.copy_and_resolve_references()
    with config.unlocked():
        config.model = ml_collections.ConfigDict(dataclasses.asdict(base.model.cfg))
        source = base.source_config
        if source is not None:
            if source.data.task != config.data.task:
                raise ValueError(
                    f"config.data.task={config.data.task!r} but the starting run {base.source} is a "
                    f"{source.data.task!r} run; RL keeps the task the weights were trained on."
                )
            config.diffusion = source.diffusion  # the layout and process the weights were trained in
    return config


def starting_diffusion(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The diffusion section the RL run will train with, from the configs alone (no weight is read): a toolbox run's
    own (its saved config.json), as `resolve_config` takes it, or else this config's."""
    import pathlib

    diffusion = config.get("diffusion", {})
    kind = base_weights.init_kind(config)
    checkpoint = str(config.get("init", {}).get("checkpoint", "") or "")
    if kind in ("toolbox", "params") and checkpoint:
        source = pathlib.Path(checkpoint)
        run_dir = source.parent if (source.name == "checkpoints" or kind == "params") else source
        if (run_dir / "config.json").is_file():
            diffusion = run_config.load_saved_config(str(run_dir)).diffusion
    return diffusion


def rollout_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The sampler settings of rollouts: the run's, with tokens drawn at `rl.temperature`."""
    out = config.copy_and_resolve_references()
    temperature = float(config.rl.temperature)
    out.sampler.min_temperature = out.sampler.max_temperature = temperature
    out.sampler.ar_temperature = temperature
    return out


def build_objective(config: ml_collections.ConfigDict, exp) -> Any:
    rl = config.rl
    forbidden = tuple(exp.task.rollout_forbidden_tokens(exp)) if isinstance(exp.task, RestrictsRolloutTokens) else ()
    if exp.is_autoregressive:
        scorer = AutoregressiveScorer(exp.model, forbidden_tokens=forbidden)
    else:
        if not hasattr(exp.process, "mask_id"):
            raise ValueError(
                f"RL scores completions with the masking process's one-pass estimator; this run's process is "
                f"{config.diffusion.process!r}. Start from a masking run (or an autoregressive one with 'ar_grpo')."
            )
        null = str(config.diffusion.get("null_signal", "zeros"))
        if rl.get("scorer", "mean_field") == "trajectory":
            require(
                exp.task,
                RecordsCommitOrder,
                "config.rl.scorer='trajectory' (it reads the pass that wrote each completion token)",
                "use 'mean_field'",
            )
            scorer = TrajectoryScorer(
                exp.model,
                exp.process.mask_id,
                num_passes=int(config.sampler.num_steps),
                passes_per_forward=int(rl.get("trajectory_passes_per_forward", 1)),
                null_signal=null,
                forbidden_tokens=forbidden,
            )
        else:
            scorer = MeanFieldScorer(exp.model, exp.process.mask_id, null_signal=null, forbidden_tokens=forbidden)
    cls = rl_objectives.objective_class(rl.objective)
    run = rl_objectives.RunPieces(
        scorer=scorer,
        group_size=int(rl.group_size),
        kl_beta=float(rl.kl_beta),
        normalization=str(rl.get("loss_normalization", "paper")),  # absent from configs saved before it existed
        objective=exp.objective,
    )
    return cls.build(objective_section(rl, cls), run)


class RolloutReport:
    """Prints the rollouts' figures every `every` steps (means over the steps since the last line): a loop hook."""

    SHOWN = (
        ("reward_mean", "reward {:.3f}"), ("reward_std", "+- {:.3f}"), ("solve_rate", "| solved {:.1%}"),
        ("groups_used", "| groups used {:.0%}"), ("kl", "| KL {:.4f}"), ("entropy", "| entropy {:.3f}"),
        ("draws", "| draws {:.2f}"), ("clip_fraction", "| clipped {:.1%}"), ("rollout_seconds", "| rollout {:.2f}s"),
        ("update_seconds", "| update {:.2f}s"),
    )  # fmt: skip

    def __init__(self, every: int):
        self.every, self.history = every, []

    def __call__(self, step: int, state, metrics) -> None:
        del state
        self.history.append(metrics)
        if self.every and step % self.every == 0 and jax.process_index() == 0:
            mean = {k: sum(h[k] for h in self.history) / len(self.history) for k in self.history[-1]}
            shown = " ".join(fmt.format(mean[k]) for k, fmt in self.SHOWN if k in mean)
            print(f"  rollouts to step {step}: {shown}", flush=True)
            self.history = []


def with_draws_metric(loss_fn: Any) -> Any:
    """`loss_fn` with the `draws` metric added: the rollout draws that made the batch (`rl.dynamic_sampling`)."""

    def loss(params, batch, key):
        value, metrics = loss_fn(params, batch, key)
        if "draws" in batch:
            metrics = {**metrics, "draws": jnp.mean(batch["draws"])}
        return value, metrics

    return loss


@dataclasses.dataclass(frozen=True)
class RLRun:
    """The pieces of an RL run, built once from its config (`setup`): what `run_rl` hands the training loop, and
    what a notebook or a benchmark drives by hand."""

    config: ml_collections.ConfigDict
    exp: Any
    base: base_weights.Base
    objective: Any
    stream: RolloutStream
    trainable: finetune.Trainable  # full or LoRA: init, mask, axes, merged weights (`trainable.weights`)
    loss_fn: Any  # the objective as a loss of the state's parameters, with the rollout metrics


def setup(config: ml_collections.ConfigDict, workdir: str) -> RLRun:
    """Loads the starting weights, resolves and saves the config, builds the experiment, objective and rollouts."""
    if "rl" not in config:
        raise ValueError("the config has no rl section: build it with hackable_diffusion.rl.settings.rl_sections (configs/rl_sudoku.py).")
    autoregressive = starting_diffusion(config).process == "none"
    check_rl_config(config, autoregressive=autoregressive)  # the objective fits the run, before any weight is read
    check_unshifted_start(config)
    path = exp_lib.workdir_path(workdir)
    base = base_weights.load_base(config)
    config = resolve_config(config, base)
    exp_lib.check_config(config)
    base_weights.save_fine_tuning_files(config, base, path)
    exp = exp_lib.build(config, workdir)
    if base.source != "scratch" and not base_weights.has_checkpoints(path):  # the init table and init_report.json
        base_weights.report_start(base, exp.model, config, path)
    check_rl_config(config, autoregressive=exp.is_autoregressive)
    require(exp.task, RewardTask, "RL (rl_prompts, rollout, reward and policy_rows)")
    objective = build_objective(config, exp)
    trainable = finetune.Trainable.from_config(config, base.params)
    loss_fn = with_draws_metric(trainable.loss_fn(objective))
    if config.rl.get("skip_uninformative_steps", False):
        loss_fn = with_update_gate(loss_fn, grouped=type(objective).grouped)
    stream = RolloutStream(
        exp=exp,
        settings=rollout_settings(config),
        rollout_config=rollout_config(config),
        scorer=objective.scorer,
        policy_params=trainable.weights,
        reference_params=trainable.reference if float(config.rl.kl_beta) > 0 else None,
        needs_old_log_probs=objective.needs_old_log_probs,
        reward_kwargs={"shaped": True} if config.rl.shaped_reward else None,
    )
    return RLRun(config, exp, base, objective, stream, trainable, loss_fn)


def run_rl(config: ml_collections.ConfigDict, workdir: str):
    """Trains as `config` describes in `workdir` (rerunning resumes); returns the final TrainState. The workdir is
    locked against a second writer meanwhile, and a start that fails before training begins removes what it wrote
    (`finetune.locked_start`)."""
    return finetune.locked_start(workdir, lambda started: _run_rl(config, workdir, started))


def _run_rl(config: ml_collections.ConfigDict, workdir: str, started):
    if jax.process_count() > 1:
        raise ValueError("RL rollouts run in one process; start `hackable_diffusion.rl` without jax.distributed.")
    run = setup(config, workdir)
    config, settings = run.config, run.stream.settings
    mesh = sharding.make_mesh(config.mesh)
    if settings.batch_rows % mesh.devices.size:
        raise ValueError(
            f"a rollout batch of {settings.batch_rows} rows (rl.prompts_per_rollout x rl.group_size) does not divide "
            f"over the {mesh.devices.size} devices of the mesh; change one of them or config.mesh."
        )
    if jax.process_index() == 0:
        print(
            f"RL ({config.rl.objective}) from {run.base.source}: {run.trainable.describe()}; "
            f"{len(run.stream.prompts):,} prompts, "
            f"{settings.prompts_per_rollout} x {settings.group_size} completions per rollout, "
            f"{settings.inner_updates} update(s) per rollout"
            + (
                f", up to {settings.dynamic_sampling} extra draw(s) to fill it with informative groups."
                if settings.dynamic_sampling
                else "."
            ),
            flush=True,
        )
    return finetune.finetune(
        config,
        workdir,
        trainable=run.trainable,
        loss_fn=run.loss_fn,
        train_iterator=run.stream,
        started=started,
        task_eval=run.exp.task.eval_fn(run.exp, workdir),
        mesh=mesh,
        hooks=(RolloutReport(int(config.train.log_every)),),
        before_step=(run.stream.prepare,),
    )


def define_flags(argv: list[str]):
    return cli.define_command_flags(
        argv,
        "RL config file (configs/rl_*.py); override keys: --config.a.b=value.",
        "Run directory: checkpoints, metrics, config.json (rerunning resumes).",
    )


def main(argv):
    from absl import flags

    del argv
    FLAGS = flags.FLAGS
    config = base_weights.config_from_command_flags(FLAGS, "configs/rl_sudoku.py")
    cli.quiet_library_logs()
    state = run_rl(config, FLAGS.workdir)
    print(
        f"RL done at step {int(state.step)}; evaluate with python -m hackable_diffusion.evaluate --workdir "
        f"{FLAGS.workdir}",
        flush=True,
    )
