"""Supervised fine-tuning on prompt -> response canvases, from a toolbox checkpoint or a Gemma-4 tree, LoRA or full.

  python -m hackable_diffusion.sft --config configs/sft_shakespeare_lora.py --workdir runs/sft_lora

Follows DiffusionGemma's SFT recipe (docs/reference.md §3; HDA `sft_model.py`, configs
`sft_sudoku` / `sft_sudoku_full`): start from pretrained weights, chunk each response into canvases
(`data.canvas.CanvasChunker`), train `diffusion.objectives.CanvasSFTObjective` (canvas cross-entropy + encoder AR loss,
self-conditioning) with LoRA (`models.lora`, only the adapters trained) or fully, and write the fused weights.

Pieces, each usable alone:
- `pretrained.load_base(config)`: the model, tokenizer and base params named by `config.init` (kind toolbox, params,
  gemma, hf or scratch; see `pretrained.py`). `--init_from hf:DIR` (or gemma:, toolbox:, params:) on the command line
  sets both keys.
- `tasks.text.shakespeare_pairs` / `build_examples` / `make_example_iterator`: the self-contained demo task, tiny
  Shakespeare "prompt = `sft.prompt_lines` lines, response = the next `sft.response_lines` lines", as a grain pipeline
  whose state is checkpointed with the run.
- `run_sft(config, workdir)`: trains through `training.loop.train` and writes `workdir/fused_params` (toolbox layout,
  orbax; `pretrained.load_params_directory` reads it), `workdir/lora_params` (adapters only, LoRA runs), optionally `workdir/gemma_params` (gemma layout) and
  `workdir/hf` (a Hugging Face directory, LoRA merged, `output.save_hf`), plus
  `config.json` and `tokenizer/` so the workdir can be sampled like a pretraining run.

Deliberate choices (differences from the reference):
- LoRA state: `{"base", "lora"}` params with the base frozen by the optimizer mask; checkpoints therefore hold the
  base too (the reference checkpoints both as well, through Kauldron's state). `lora.rank = 0` is full fine-tuning.
- The model shape comes from the source run's `config.json` when there is one (a mismatched shape would not load),
  and so does the diffusion recipe (`INHERITED_DIFFUSION`: process, schedule, loss, time sampler, encoder AR weight,
  self-conditioning; `init.inherit_diffusion=False` keeps this config's): fine-tuning a masking model with uniform
  noise, or the reverse, would train a different model. The objective is always the canvas SFT one.
- Demo data: non-overlapping windows of lines; windows whose prompt is blank are skipped; prompts longer than
  `prompt_len - 1` keep their end (`truncate_prompt=True`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from hackable_diffusion import builders, cli, recipes
from hackable_diffusion.data import text as text_lib
from hackable_diffusion.data import tokenizers as tok_lib
from hackable_diffusion.data.canvas import CanvasChunker
from hackable_diffusion.data.tokenizers import BOS_ID, EOS_ID, NEVER_GENERATED, Tokenizer
from hackable_diffusion.models import gemma_convert, partitioning, presets
from hackable_diffusion.models import lora as lora_lib
from hackable_diffusion.models import transformer as T
from hackable_diffusion.pretrained import FUSED_DIR, INIT_KINDS, load_base, save_params
from hackable_diffusion.tasks.text import build_examples, eval_batches, make_example_iterator, shakespeare_pairs

PyTree = Any
LORA_DIR, GEMMA_DIR, HF_DIR = "lora_params", "gemma_params", "hf"
ROUTER_LEAVES = ("moe/router_logits", "moe/router_scale", "moe/per_expert_scale")
#: diffusion fields taken from the source run's config.json (init.inherit_diffusion): fine-tune with the process and
#: loss recipe the model was trained with; `objective` and `canvas_len` stay this config's.
INHERITED_DIFFUSION = (
    "process",
    "schedule",
    "schedule_eps",
    "excluded_ids",
    "loss",
    "time_sampler",
    "t_min",
    "t_max",
    "encoder_ar_weight",
    "self_condition_prob",
    "null_signal",
)


# ----------------------------------------------------------------------------------------------------------------
# Config.


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
    """An SFT experiment on tiny Shakespeare line pairs (DiffusionGemma's SFT objective), LoRA or full (rank 0)."""
    c = recipes.base_config()
    c.model = ml_collections.ConfigDict(model or presets.quickstart())
    c.model.self_conditioning = True
    c.init = ml_collections.ConfigDict(
        dict(
            kind=init_kind,  # "toolbox" | "params" | "gemma" | "hf" | "scratch"
            checkpoint=checkpoint,  # toolbox workdir (or checkpoints/) | params dir | gemma orbax dir | Hugging Face dir
            use_ema=True,  # toolbox: take ema_params when the run kept an EMA
            inherit_diffusion=True,  # toolbox/params: take the noise process and loss recipe of the source run
            tokenizer_dir="",  # gemma/scratch: a saved tokenizer; "" = char tokenizer fitted on the corpus
            ignore_unexpected=False,  # gemma/hf: skip checkpoint tensors the model has no place for (e.g. other towers)
            decoder_window="per_token",  # hf: "cache_tail" reproduces transformers' decoder (TransformerConfig)
            dtype="",  # hf: parameter dtype ("" = the checkpoint's, e.g. bfloat16)
        )
    )
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


# ----------------------------------------------------------------------------------------------------------------
# Base weights.


def router_frozen_mask(params: PyTree) -> PyTree:
    """Full fine-tuning with `lora.freeze_router`: every leaf trained except the router's."""
    flat = gemma_convert.flatten_tree(params)
    return gemma_convert.unflatten_tree({p: not any(p.endswith(r) for r in ROUTER_LEAVES) for p in flat})


# ----------------------------------------------------------------------------------------------------------------
# Demo data: tiny Shakespeare line pairs.


# ----------------------------------------------------------------------------------------------------------------
# Param directories.


# ----------------------------------------------------------------------------------------------------------------
# The run.


@dataclasses.dataclass(frozen=True)
class SFTResult:
    state: Any  # the final TrainState (params = {"base", "lora"} for LoRA runs)
    fused_params: PyTree
    model: T.Transformer
    tokenizer: Tokenizer
    adapter: lora_lib.LoRA | None


def make_adapter(config: ml_collections.ConfigDict) -> lora_lib.LoRA | None:
    lc = config.lora
    if lc.rank == 0:
        return None
    targets = tuple(lc.targets)
    if targets == (lora_lib.ALL_LINEAR,):
        targets = lora_lib.ALL_LINEAR
    if lc.get("freeze_router", False):
        if targets == lora_lib.ALL_LINEAR:
            targets = lora_lib.DEFAULT_TARGETS
        targets = tuple(t for t in targets if "router" not in t)
    return lora_lib.LoRA(
        rank=int(lc.rank),
        alpha=float(lc.alpha) if lc.alpha else None,
        targets=targets,
        include_experts=bool(lc.include_experts),
    )


def run_sft(config: ml_collections.ConfigDict, workdir: str, *, sample_at_end: bool = False) -> SFTResult:
    """Fine-tunes as described by `config` in `workdir` (rerunning resumes) and writes the outputs listed above; the
    workdir is locked against a second writer meanwhile."""
    import contextlib

    from hackable_diffusion.training.workdir_lock import WorkdirLock

    with WorkdirLock(workdir) if jax.process_index() == 0 else contextlib.nullcontext():
        return _run_sft(config, workdir, sample_at_end=sample_at_end)


def _run_sft(config: ml_collections.ConfigDict, workdir: str, *, sample_at_end: bool) -> SFTResult:
    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.sampling import generate as gen_lib
    from hackable_diffusion.training import loop, sharding

    path = exp_lib.workdir_path(workdir)
    base = load_base(config)
    model, tokenizer = base.model, base.tokenizer
    cfg = model.cfg
    config = config.copy_and_resolve_references()
    with config.unlocked():
        config.model = ml_collections.ConfigDict(dataclasses.asdict(cfg))
        source_diffusion = base.source_config.get("diffusion") if base.source_config is not None else None
        if config.init.get("inherit_diffusion", True) and source_diffusion is not None:
            inherited = {
                k: tuple(v) if isinstance(v, list) else v
                for k, v in source_diffusion.items()
                if k in INHERITED_DIFFUSION
            }
            config.diffusion.update(inherited)
            if jax.process_index() == 0 and inherited:
                print(
                    "Diffusion recipe of the source run: " + ", ".join(f"{k}={v}" for k, v in inherited.items()),
                    flush=True,
                )
    if jax.process_index() == 0:
        cli.save_config(config, path / "config.json")
        if not (path / "tokenizer" / tok_lib.CONFIG_FILE).is_file():
            tokenizer.save(path / "tokenizer", metadata={"source": base.source})

    process = builders.build_process(config, cfg.vocab_size)
    objective = builders.build_objective(config, model, process)
    s = config.sft
    c = config.diffusion.canvas_len
    chunker = CanvasChunker(s.prompt_len, s.num_canvases, c, truncate_prompt=True)
    data_dir = config.data.data_dir or None
    train_examples = build_examples(
        shakespeare_pairs(text_lib.load_shakespeare("train", data_dir), s.prompt_lines, s.response_lines),
        tokenizer,
        chunker,
        s.max_examples,
    )
    eval_examples = build_examples(
        shakespeare_pairs(text_lib.load_shakespeare("validation", data_dir), s.prompt_lines, s.response_lines),
        tokenizer,
        chunker,
        s.eval_examples,
    )
    train_iter = make_example_iterator(
        train_examples, config.data.batch_size, config.seed, jax.process_index(), jax.process_count()
    )

    adapter = make_adapter(config)
    base_params = base.params
    if adapter is None:
        init_fn = lambda key: jax.tree.map(jnp.asarray, base_params)
        loss_fn, mask, axes_fn = objective, None, partitioning.logical_axes
        if config.lora.get("freeze_router", False):
            mask = router_frozen_mask
    else:
        init_fn = lambda key: {
            lora_lib.BASE_KEY: jax.tree.map(jnp.asarray, base_params),
            lora_lib.LORA_KEY: adapter.init(base_params, key),
        }
        loss_fn, mask, axes_fn = (
            lora_lib.lora_loss_fn(adapter, objective),
            lora_lib.trainable_mask,
            lora_lib.logical_axes,
        )

    batches = eval_batches(eval_examples, config.eval.batch_size, config.eval.num_batches)
    eval_loss = jax.jit(loss_fn)

    def eval_fn(params, ema_params):
        use = ema_params if ema_params is not None else params
        totals: dict[str, float] = {}
        for i, batch in enumerate(batches):
            _, metrics = eval_loss(use, {k: jnp.asarray(v) for k, v in batch.items()}, jax.random.key(10_007 + i))
            for k in ("loss", "diffusion_loss", "encoder_ar_loss", "elbo_bits_per_token"):
                totals[k] = totals.get(k, 0.0) + float(metrics[k]) / len(batches)
        return totals

    devices = jax.devices()[: s.num_devices] if s.num_devices else None
    mesh = sharding.make_mesh(config.mesh, devices)
    if jax.process_index() == 0:
        counts = lora_lib.num_params(jax.eval_shape(adapter.init, base_params, jax.random.key(0))) if adapter else 0
        what = f"LoRA rank {adapter.rank}, alpha {adapter.alpha} ({counts:,} trainable)" if adapter else "full"
        print(
            f"SFT from {base.source}: {what}; {len(train_examples['prompt']):,} train / "
            f"{len(eval_examples['prompt']):,} eval examples (prompt {s.prompt_len}, {s.num_canvases} x {c} "
            "canvas tokens).",
            flush=True,
        )
    state = loop.train(
        workdir=workdir,
        init_fn=init_fn,
        loss_fn=loss_fn,
        train_iterator=train_iter,
        loop=loop.LoopConfig.from_config(
            config.train, seed=config.seed, tokens_per_example=s.prompt_len + s.num_canvases * c
        ),
        optimizer_cfg=builders.optimizer_config(config),
        mesh=mesh,
        param_logical_axes_fn=axes_fn,
        eval_fn=eval_fn if batches else None,
        trainable_mask=mask,
        compiler_options={"xla_backend_optimization_level": 0} if config.train.get("fast_compile") else None,
    )

    params = state.ema_params if state.ema_params is not None else state.params
    if adapter is None:
        fused = params
    else:
        fused = jax.jit(adapter.merge)(params[lora_lib.BASE_KEY], params[lora_lib.LORA_KEY])
    fused = jax.device_get(fused)
    out = config.output
    if out.save_fused:
        save_params(fused, path / FUSED_DIR)
    if out.save_lora and adapter is not None:
        save_params(jax.device_get(params[lora_lib.LORA_KEY]), path / LORA_DIR)
    if out.save_gemma:
        gemma_convert.save_gemma_checkpoint(fused, cfg, path / GEMMA_DIR, force=True)
    if out.get("save_hf", False) and jax.process_index() == 0:
        from hackable_diffusion.models import hf_convert

        hf_convert.save_hf(
            path / HF_DIR,
            cfg,
            fused,
            model_type=hf_convert.DIFFUSION_GEMMA if cfg.self_conditioning else hf_convert.GEMMA4_TEXT,
            canvas_length=int(config.diffusion.canvas_len),
            sampler=config.sampler.to_dict(),
            source=config.init.checkpoint if config.init.kind == "hf" else None,
        )
    if sample_at_end and jax.process_index() == 0:
        unused = tuple(range(tokenizer.vocab_size, cfg.vocab_size))  # ids the tokenizer cannot decode
        sampler = builders.build_sampler(config, process, forbidden_tokens=NEVER_GENERATED + unused)
        prompt = config.sampler.prompt
        max_new = -(-config.sampler.max_new_tokens // sampler.canvas_length) * sampler.canvas_length
        result = gen_lib.generate(
            model,
            fused,
            [[BOS_ID] + tokenizer.encode(prompt)],
            sampler=sampler,
            key=config.seed,
            max_new_tokens=max_new,
            stop_tokens=(EOS_ID,),
        )
        print(
            f"\nSample ({result.forward_passes} forward passes):\n{prompt}"
            f"{tokenizer.decode(np.asarray(result.tokens[0]))}\n",
            flush=True,
        )
    return SFTResult(state=state, fused_params=fused, model=model, tokenizer=tokenizer, adapter=adapter)


# ----------------------------------------------------------------------------------------------------------------
# Command line.


def define_flags(argv: list[str]):
    from absl import flags

    cli.define_config_file_flag(argv, "SFT config file (configs/sft_*.py); override keys with --config.a.b=value.")
    flags.DEFINE_string(
        "init_from",
        None,
        "Where the base weights come from, as KIND:PATH with KIND hf (a Hugging Face directory), gemma, toolbox or "
        "params; sets config.init.kind and config.init.checkpoint.",
    )
    flags.DEFINE_string("workdir", None, "Run directory: checkpoints, fused_params, metrics, tokenizer.")
    flags.DEFINE_bool("sample_at_end", True, "Print a sample from the fine-tuned model at the end.")


def main(argv):
    from absl import app, flags

    del argv
    FLAGS = flags.FLAGS
    if FLAGS.config is None:
        raise app.UsageError("--config is required: an SFT config file such as configs/sft_shakespeare_lora.py.")
    if FLAGS.workdir is None:
        raise app.UsageError("--workdir is required (the run directory; rerunning with it resumes).")
    cli.quiet_library_logs()
    config = FLAGS.config
    if FLAGS.init_from:
        kind, _, checkpoint = FLAGS.init_from.partition(":")
        if kind not in INIT_KINDS or kind == "scratch" or not checkpoint:
            raise app.UsageError(
                f"--init_from={FLAGS.init_from!r} must be KIND:PATH with KIND one of hf, gemma, toolbox, params."
            )
        config.init.kind, config.init.checkpoint = kind, checkpoint
    if jax.process_index() == 0:
        print("Config:\n" + json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str), flush=True)
    run_sft(config, FLAGS.workdir, sample_at_end=FLAGS.sample_at_end)


if __name__ == "__main__":
    cli.run_command(define_flags, main, __doc__)
