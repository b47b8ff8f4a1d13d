"""Supervised fine-tuning on prompt -> response canvases from a toolbox run, an HF or gemma checkpoint, LoRA or full.

  python -m hackable_diffusion.sft --config configs/sft_shakespeare_lora.py --workdir runs/sft_lora

Follows DiffusionGemma's SFT recipe (docs/reference.md §3): start from pretrained weights, chunk each response into
canvases, train `diffusion.objectives.CanvasSFTObjective` (canvas cross-entropy + the encoder's AR loss,
self-conditioning) with LoRA (`models.lora`, only the adapters trained) or fully, and write the fused weights. The
run is an ordinary experiment: `experiment.build` assembles it from the config (the text task's SFT data,
`tasks/text_sft.py`), `training.loop.train` trains it with resume, and `sample` / `evaluate` read its directory.

What this command adds to `train`: the base weights (`checkpoints.base_weights.load_base`, `config.init`; `--init_from
hf:DIR` sets kind and path), the model shape and tokenizer they come with, the source run's diffusion recipe
(`INHERITED_DIFFUSION`, unless `init.inherit_diffusion=False`: fine-tuning a masking model with uniform noise would
train another model), the LoRA wrapping of the loss, and the outputs: `fused_params` (orbax, toolbox layout),
`lora_params` (adapters), optionally `gemma_params` and `hf` (a Hugging Face directory, LoRA merged). Deliberate
choice: a LoRA run's checkpoints hold `{"base", "lora"}` with the base frozen by the optimizer mask (the reference
checkpoints both as well); `lora.rank = 0` is full fine-tuning (`lora.freeze_router` keeps the router as pretrained).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from hackable_diffusion import builders, cli
from hackable_diffusion.checkpoints import base_weights, toolbox
from hackable_diffusion.models import lora as lora_lib
from hackable_diffusion.models import partitioning
from hackable_diffusion.training.workdir_lock import WorkdirLock

LORA_DIR, GEMMA_DIR, HF_DIR = "lora_params", "gemma_params", "hf"
#: diffusion fields taken from the source run's config.json (`objective` and `canvas_len` stay this config's)
INHERITED_DIFFUSION = (
    "process", "schedule", "schedule_eps", "excluded_ids", "loss", "time_sampler", "t_min", "t_max",
    "encoder_ar_weight", "self_condition_prob", "null_signal",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class SFTResult:
    state: Any  # the final TrainState (params = {"base", "lora"} for LoRA runs)
    fused_params: Any
    model: Any
    tokenizer: Any
    adapter: lora_lib.LoRA | None  # None: full fine-tuning


def resolve_config(config: ml_collections.ConfigDict, base: base_weights.Base) -> ml_collections.ConfigDict:
    """The run's config: the base weights' model shape and, unless `init.inherit_diffusion=False`, the source run's
    diffusion recipe."""
    config = config.copy_and_resolve_references()
    with config.unlocked():
        config.model = ml_collections.ConfigDict(dataclasses.asdict(base.model.cfg))
        source = base.source_config.get("diffusion") if base.source_config is not None else None
        if config.init.get("inherit_diffusion", True) and source is not None:
            inherited = {
                k: tuple(v) if isinstance(v, list) else v for k, v in source.items() if k in INHERITED_DIFFUSION
            }
            config.diffusion.update(inherited)
            if jax.process_index() == 0 and inherited:
                print("Diffusion recipe of the source run: " + ", ".join(f"{k}={v}" for k, v in inherited.items()))
    return config


def run_sft(config: ml_collections.ConfigDict, workdir: str, *, sample_at_end: bool = False) -> SFTResult:
    """Fine-tunes as described by `config` in `workdir` (rerunning resumes) and writes the outputs listed above; the
    workdir is locked against a second writer meanwhile, and a start that fails before training begins removes what
    it wrote (`WorkdirLock`'s undo_failed_start)."""
    lock = WorkdirLock(workdir, undo_failed_start=True) if jax.process_index() == 0 else None
    with lock if lock is not None else contextlib.nullcontext():
        started = lock.started if lock is not None else lambda: None
        return _run_sft(config, workdir, sample_at_end=sample_at_end, started=started)


def _run_sft(
    config: ml_collections.ConfigDict, workdir: str, *, sample_at_end: bool, started=lambda: None
) -> SFTResult:
    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.tasks import text_sft
    from hackable_diffusion.training import loop, sharding

    path = exp_lib.workdir_path(workdir)
    base = base_weights.load_base(config)
    config = resolve_config(config, base)
    base_weights.save_fine_tuning_files(config, base, path)
    exp = exp_lib.build(config, workdir)  # the base model's shape, the text task's SFT examples
    if base.source != "scratch" and not base_weights.has_checkpoints(path):  # the init table and init_report.json
        base_weights.report_start(base, exp.model, config, path)

    adapter = builders.build_adapter(config)
    base_params = base.params
    if adapter is None:
        init_fn = lambda key: jax.tree.map(jnp.asarray, base_params)  # noqa: E731
        loss_fn, axes_fn = exp.objective, partitioning.logical_axes
        mask = lora_lib.router_frozen_mask if config.lora.get("freeze_router", False) else None
    else:
        init_fn = functools.partial(lora_lib.init_state, adapter, base_params)
        loss_fn = lora_lib.lora_loss_fn(adapter, exp.objective)
        mask, axes_fn = lora_lib.trainable_mask, lora_lib.logical_axes
    s = config.sft
    if jax.process_index() == 0:
        counts = lora_lib.num_params(jax.eval_shape(adapter.init, base_params, jax.random.key(0))) if adapter else 0
        what = f"LoRA rank {adapter.rank}, alpha {adapter.alpha} ({counts:,} trainable)" if adapter else "full"
        print(
            f"SFT from {base.source}: {what}; {len(exp.data.train_examples['prompt']):,} train / "
            f"{len(exp.data.eval_examples['prompt']):,} eval examples (prompt {s.prompt_len}, {s.num_canvases} x "
            f"{config.diffusion.canvas_len} canvas tokens).",
            flush=True,
        )
    started()  # from here a failure keeps what the run wrote
    state = loop.train(
        workdir=workdir,
        init_fn=init_fn,
        loss_fn=loss_fn,
        train_iterator=exp.task.train_iterator(exp, jax.process_index(), jax.process_count()),
        loop=loop.LoopConfig.from_config(config.train, seed=config.seed, tokens_per_example=config.data.seq_len),
        optimizer_cfg=builders.optimizer_config(config),
        mesh=sharding.make_mesh(config.mesh, jax.devices()[: s.num_devices] if s.num_devices else None),
        param_logical_axes_fn=axes_fn,
        eval_fn=text_sft.sft_eval_fn(exp, loss_fn),
        trainable_mask=mask,
        compiler_options={"xla_backend_optimization_level": 0} if config.train.get("fast_compile") else None,
    )
    params = state.ema_params if state.ema_params is not None else state.params
    fused = params if adapter is None else jax.jit(adapter.merge)(params[lora_lib.BASE_KEY], params[lora_lib.LORA_KEY])
    fused = jax.device_get(fused)
    write_outputs(config, path, fused, None if adapter is None else jax.device_get(params[lora_lib.LORA_KEY]))
    if sample_at_end and jax.process_index() == 0:
        print("\n" + exp.task.report(exp, fused) + "\n", flush=True)
    return SFTResult(state=state, fused_params=fused, model=exp.model, tokenizer=exp.tokenizer, adapter=adapter)


def write_outputs(config: ml_collections.ConfigDict, path, fused: Any, lora: Any | None) -> None:
    """`config.output`: the fused weights, the adapters, a gemma tree and a Hugging Face directory."""
    from hackable_diffusion.models.config import TransformerConfig

    out, cfg = config.output, TransformerConfig.from_dict(config.model.to_dict())
    if out.save_fused:
        toolbox.save_params(fused, path / toolbox.FUSED_DIR)
    if out.save_lora and lora is not None:
        toolbox.save_params(lora, path / LORA_DIR)
    if out.save_gemma:
        from hackable_diffusion.checkpoints import gemma as gemma_ckpt

        gemma_ckpt.save_gemma_checkpoint(fused, cfg, path / GEMMA_DIR, force=True)
    if out.get("save_hf", False) and jax.process_index() == 0:
        from hackable_diffusion.checkpoints import hf as hf_ckpt

        hf_ckpt.save_hf(
            path / HF_DIR,
            cfg,
            fused,
            model_type=hf_ckpt.DIFFUSION_GEMMA if cfg.self_conditioning else hf_ckpt.GEMMA4_TEXT,
            canvas_length=int(config.diffusion.canvas_len),
            sampler=config.sampler.to_dict(),
            source=config.init.checkpoint if config.init.kind == "hf" else None,
        )


def define_flags(argv: list[str]):
    from absl import flags

    argv = cli.define_command_flags(
        argv,
        "SFT config file (configs/sft_*.py); override keys: --config.a.b=value.",
        "Run directory: checkpoints, fused_params, metrics, tokenizer.",
    )
    flags.DEFINE_bool("sample_at_end", True, "Print a sample from the fine-tuned model at the end.")
    return argv


def main(argv):
    from absl import flags

    del argv
    FLAGS = flags.FLAGS
    config = base_weights.config_from_command_flags(FLAGS, "configs/sft_shakespeare_lora.py")
    cli.quiet_library_logs()
    run_sft(config, FLAGS.workdir, sample_at_end=FLAGS.sample_at_end)


if __name__ == "__main__":
    cli.run_command(define_flags, main, __doc__)
