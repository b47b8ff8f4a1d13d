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

import dataclasses
from typing import Any

import jax
import ml_collections

from hackable_diffusion import cli, finetune, recipes
from hackable_diffusion import experiment as exp_lib
from hackable_diffusion.checkpoints import base_weights, toolbox
from hackable_diffusion.checkpoints import gemma as gemma_ckpt
from hackable_diffusion.checkpoints import hf as hf_ckpt
from hackable_diffusion.models import lora as lora_lib
from hackable_diffusion.models import presets
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.tasks import text_sft
from hackable_diffusion.training import loop, sharding

LORA_DIR, GEMMA_DIR, HF_DIR = "lora_params", "gemma_params", "hf"
#: diffusion fields taken from the source run's config.json (`objective` and `canvas_len` stay this config's);
#: `schedule` is a whole section (`recipes.schedule_section`: the name and every field), so a schedule's own fields
#: are inherited without being listed here
INHERITED_DIFFUSION = (
    "process", "schedule", "excluded_ids", "loss", "time_sampler", "t_min", "t_max",
    "encoder_ar_weight", "self_condition_prob", "null_signal",
)  # fmt: skip


def sft_config(
    *,
    model: dict[str, Any] | None = None,
    init_kind: str = "toolbox",
    checkpoint: str = "",
    lora_rank: int = 8,
    lora_alpha: float | None = 16.0,
    steps: int = 300,
    batch_size: int = 8,
    prompt_len: int = 64,
    num_canvases: int = 2,
    canvas_len: int = 32,
) -> ml_collections.ConfigDict:
    """An SFT experiment on tiny Shakespeare line pairs (DiffusionGemma's SFT objective), LoRA or full (rank 0), run
    by `python -m hackable_diffusion.sft` (its base weights: `config.init`, `checkpoints.base_weights`)."""
    c = recipes.base_config()
    c.model = ml_collections.ConfigDict(model or presets.quickstart())
    c.model.self_conditioning = True
    c.init = recipes.init_section(init_kind, checkpoint)
    c.lora = ml_collections.ConfigDict(
        dict(
            rank=lora_rank,  # 0 = full fine-tuning
            alpha=lora_alpha if lora_alpha is not None else float(max(lora_rank, 1)),
            targets=lora_lib.DEFAULT_TARGETS,  # or ("all-linear",)
            include_experts=False,
            freeze_router=False,  # True: the router (projection, scales) stays as pretrained, LoRA or full
        )
    )
    c.sft = ml_collections.ConfigDict(
        dict(
            prompt_lines=1,
            response_lines=2,
            prompt_len=prompt_len,
            num_canvases=num_canvases,
            max_examples=0,  # 0 = every pair of the training split
            eval_examples=64,
            num_devices=0,  # 0 = every device
        )
    )
    c.data.seq_len = prompt_len + num_canvases * canvas_len
    c.data.batch_size = batch_size
    d = c.diffusion
    d.process, d.objective, d.canvas_len = "uniform", "sft", canvas_len
    d.loss, d.encoder_ar_weight, d.self_condition_prob, d.null_signal = "canvas_ce", 1.0, 0.5, "mean_embedding"
    d.time_sampler, d.t_min, d.t_max = "uniform", 1e-4, 1.0 - 1e-4
    c.optimizer = ml_collections.ConfigDict(
        dict(
            name="adamw",
            peak_lr=2e-3 if lora_rank else 5e-4,
            end_lr=2e-4 if lora_rank else 5e-5,
            warmup_steps=30,
            total_steps=0,
            weight_decay=1e-4,
            b1=0.95,
            b2=0.99,
            eps=1e-8,
            clip_norm=1.0,
        )
    )
    c.train = ml_collections.ConfigDict(
        dict(
            num_steps=steps,
            grad_accum_steps=1,
            ema_decay=0.0,
            log_every=25,
            eval_every=100,
            checkpoint_every=100,
            keep_checkpoints=2,
            fast_compile=False,  # XLA backend optimisation level 0: ~2.5x faster CPU compiles, slower steps (tests)
        )
    )
    c.eval.num_batches = 4
    c.eval.batch_size = batch_size
    c.output = ml_collections.ConfigDict(dict(save_fused=True, save_lora=True, save_gemma=False, save_hf=False))
    c.sampler.canvas_len = canvas_len
    c.sampler.max_new_tokens = num_canvases * canvas_len
    c.sampler.prompt = "ROMEO:\n"
    return c


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
                shown = (f"{k}={v.to_dict() if hasattr(v, 'to_dict') else v}" for k, v in inherited.items())
                print("Diffusion recipe of the source run: " + ", ".join(shown))
    return config


def run_sft(config: ml_collections.ConfigDict, workdir: str, *, sample_at_end: bool = False) -> SFTResult:
    """Fine-tunes as described by `config` in `workdir` (rerunning resumes) and writes the outputs listed above; the
    workdir is locked against a second writer meanwhile, and a start that fails before training begins removes what
    it wrote (`finetune.locked_start`)."""
    return finetune.locked_start(workdir, lambda started: _run_sft(config, workdir, sample_at_end, started))


def _run_sft(config: ml_collections.ConfigDict, workdir: str, sample_at_end: bool, started) -> SFTResult:
    path = exp_lib.workdir_path(workdir)
    base = base_weights.load_base(config)
    config = resolve_config(config, base)
    base_weights.save_fine_tuning_files(config, base, path)
    exp = exp_lib.build(config, workdir)  # the base model's shape, the text task's SFT examples
    if base.source != "scratch" and not base_weights.has_checkpoints(path):  # the init table and init_report.json
        base_weights.report_start(base, exp.model, config, path)

    trainable = finetune.Trainable.from_config(config, base.params)
    loss_fn = trainable.loss_fn(exp.objective)
    s = config.sft
    if jax.process_index() == 0:
        print(
            f"SFT from {base.source}: {trainable.describe()}; {len(exp.data.train_examples['prompt']):,} train / "
            f"{len(exp.data.eval_examples['prompt']):,} eval examples (prompt {s.prompt_len}, {s.num_canvases} x "
            f"{config.diffusion.canvas_len} canvas tokens).",
            flush=True,
        )
    state = finetune.finetune(
        config,
        workdir,
        trainable=trainable,
        loss_fn=loss_fn,
        train_iterator=exp.task.train_iterator(exp, jax.process_index(), jax.process_count()),
        started=started,
        param_eval=text_sft.sft_eval_fn(exp, loss_fn),
        loop_settings=loop.LoopConfig.from_config(config.train, seed=config.seed, tokens_per_example=config.data.seq_len),
        mesh=sharding.make_mesh(config.mesh, jax.devices()[: s.num_devices] if s.num_devices else None),
    )
    fused = finetune.final_weights(trainable, state)
    params = state.ema_params if state.ema_params is not None else state.params
    adapters = trainable.adapters(params)
    write_outputs(config, path, fused, None if adapters is None else jax.device_get(adapters))
    if sample_at_end and jax.process_index() == 0:
        print("\n" + exp.task.report(exp, fused) + "\n", flush=True)
    return SFTResult(
        state=state, fused_params=fused, model=exp.model, tokenizer=exp.tokenizer, adapter=trainable.adapter
    )


def write_outputs(config: ml_collections.ConfigDict, path, fused: Any, lora: Any | None) -> None:
    """`config.output`: the fused weights, the adapters, a gemma tree and a Hugging Face directory."""
    out, cfg = config.output, TransformerConfig.from_dict(config.model.to_dict())
    if out.save_fused:
        toolbox.save_params(fused, path / toolbox.FUSED_DIR)
    if out.save_lora and lora is not None:
        toolbox.save_params(lora, path / LORA_DIR)
    if out.save_gemma:
        gemma_ckpt.save_gemma_checkpoint(fused, cfg, path / GEMMA_DIR, force=True)
    if out.get("save_hf", False) and jax.process_index() == 0:
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
