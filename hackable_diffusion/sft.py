"""Supervised fine-tuning on prompt -> response canvases, from a toolbox checkpoint or a Gemma-4 tree, LoRA or full.

  python -m hackable_diffusion.sft --config configs/sft_shakespeare_lora.py --workdir runs/sft_lora

Follows DiffusionGemma's SFT recipe (docs/reference.md §3; HDA `sft_model.py`, configs
`sft_sudoku` / `sft_sudoku_full`): start from pretrained weights, chunk each response into canvases
(`data.canvas.CanvasChunker`), train `diffusion.objectives.CanvasSFTObjective` (canvas cross-entropy + encoder AR loss,
self-conditioning) with LoRA (`models.lora`, only the adapters trained) or fully, and write the fused weights.

Pieces, each usable alone:
- `load_base(config)`: the model, tokenizer and base params named by `config.init`:
  kind "toolbox": `init.checkpoint` is a toolbox workdir (or its `checkpoints/` folder); the params (EMA if
  `init.use_ema` and present) of its latest step are restored, and its `config.json` (model shape) and `tokenizer/`
  are used when present. kind "params": `init.checkpoint` is a params directory written by `save_params` (e.g. the
  `fused_params` of an earlier SFT run; its parent's `config.json` and `tokenizer/` are used the same way).
  kind "gemma": `init.checkpoint` is a gemma-layout orbax directory
  (`models.gemma_convert.load_gemma_checkpoint`), shaped by `config.model`. kind "hf": `init.checkpoint` is a Hugging
  Face DiffusionGemma / Gemma-4 directory (`models.hf_convert.load_hf`: its config.json gives the model shape, its
  tokenizer the tokenizer). kind "scratch": random init (smoke tests). `--init_from hf:DIR` (or gemma:, toolbox:,
  params:) on the command line sets both keys.
- `shakespeare_pairs` / `build_examples` / `make_example_iterator`: the self-contained demo task, tiny Shakespeare
  "prompt = `sft.prompt_lines` lines, response = the next `sft.response_lines` lines", as a grain pipeline whose state
  is checkpointed with the run.
- `run_sft(config, workdir)`: trains through `training.loop.train` and writes `workdir/fused_params` (toolbox layout,
  orbax), `workdir/lora_params` (adapters only, LoRA runs), optionally `workdir/gemma_params` (gemma layout) and
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
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from hackable_diffusion import cli, recipes
from hackable_diffusion.data import text as text_lib
from hackable_diffusion.data import tokenizers as tok_lib
from hackable_diffusion.data.canvas import CanvasChunker, collate_examples
from hackable_diffusion.data.tokenizers import BOS_ID, EOS_ID, Tokenizer
from hackable_diffusion.models import gemma_convert, lora as lora_lib, partitioning, presets
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig

PyTree = Any
INIT_KINDS = ("toolbox", "params", "gemma", "hf", "scratch")
FUSED_DIR, LORA_DIR, GEMMA_DIR, HF_DIR = "fused_params", "lora_params", "gemma_params", "hf"
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


def _step_dirs(checkpoints: pathlib.Path) -> list[int]:
    if not checkpoints.is_dir():
        return []
    return sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit() and (p / "state").is_dir())


def load_toolbox_params(
    path: str | os.PathLike, *, use_ema: bool = True, step: int | None = None
) -> tuple[PyTree, int]:
    """(params as numpy arrays, step) of a toolbox run's checkpoint (the EMA params if `use_ema` and kept).

    `path` is a training workdir or its `checkpoints/` folder; `step=None` takes the latest complete step.
    """
    path = pathlib.Path(path)
    checkpoints = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    steps = _step_dirs(checkpoints)
    if not steps:
        raise ValueError(
            f"No toolbox checkpoint in {str(path)!r} (looked for step folders with a 'state' item in "
            f"{str(checkpoints)!r}); train with hackable_diffusion.train first or fix init.checkpoint."
        )
    step = steps[-1] if step is None else int(step)
    if step not in steps:
        raise ValueError(f"Checkpoint step {step} not found in {str(checkpoints)!r}; available: {steps}.")
    item = (checkpoints / str(step) / "state").absolute()
    checkpointer = ocp.PyTreeCheckpointer()
    metadata = gemma_convert.tree_metadata(item)
    key = "ema_params" if use_ema and metadata.get("ema_params") else "params"
    if isinstance(metadata[key], Mapping) and set(metadata[key]) == {lora_lib.BASE_KEY, lora_lib.LORA_KEY}:
        raise ValueError(
            f"{str(path)!r} is a LoRA fine-tuning run (its params are {{'base', 'lora'}}); start from "
            f"its fused weights instead: init.kind='params', init.checkpoint='{path}/{FUSED_DIR}'."
        )
    subtree = {key: metadata[key]}
    restored = checkpointer.restore(
        item,
        args=ocp.args.PyTreeRestore(
            item=jax.tree.map(lambda m: np.empty(m.shape, m.dtype), subtree),
            restore_args=jax.tree.map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray), subtree),
            partial_restore=True,
        ),
    )
    return restored[key], step


def _corpus_tokenizer(config: ml_collections.ConfigDict) -> Tokenizer:
    if config.init.tokenizer_dir:
        return tok_lib.load_tokenizer(config.init.tokenizer_dir)
    if config.data.corpus != "shakespeare" or config.data.tokenizer != "char":
        raise ValueError(
            "Without init.tokenizer_dir the SFT demo fits a char tokenizer on Shakespeare; set "
            "data.corpus='shakespeare', data.tokenizer='char' or give init.tokenizer_dir."
        )
    return tok_lib.CharTokenizer.fit(text_lib.load_shakespeare("train", config.data.data_dir or None))


def _model_config(shape: Mapping[str, Any], vocab_size: int | None) -> TransformerConfig:
    shape = dict(shape)
    if vocab_size:
        shape["vocab_size"] = vocab_size
    return TransformerConfig.from_dict(shape)


@dataclasses.dataclass(frozen=True)
class Base:
    model: T.Transformer
    tokenizer: Tokenizer
    params: PyTree
    source: str
    source_config: ml_collections.ConfigDict | None = None  # the source run's config.json, if any


def load_base(config: ml_collections.ConfigDict) -> Base:
    """Model, tokenizer and base params as named by `config.init` (see the module docstring)."""
    init = config.init
    if init.kind not in INIT_KINDS:
        raise ValueError(f"config.init.kind={init.kind!r} must be one of {INIT_KINDS}.")
    if init.kind in ("toolbox", "params"):
        if not init.checkpoint:
            raise ValueError(
                f"config.init.kind={init.kind!r} needs config.init.checkpoint (a training workdir, or a "
                "params directory for kind 'params')."
            )
        source = pathlib.Path(init.checkpoint)
        run_dir = source.parent if (source.name == "checkpoints" or init.kind == "params") else source
        tokenizer_dir = run_dir / "tokenizer"
        tokenizer = (
            tok_lib.load_tokenizer(tokenizer_dir)
            if (tokenizer_dir / tok_lib.CONFIG_FILE).is_file()
            else _corpus_tokenizer(config)
        )
        shape, source_config = config.model.to_dict(), None
        if (run_dir / "config.json").is_file():
            source_config = cli.load_saved_config(str(run_dir))
            shape = source_config.model.to_dict()
        cfg = _model_config(shape, tokenizer.vocab_size)
        if init.kind == "params":
            params, where = load_params(source), f"params:{source}"
        else:
            params, step = load_toolbox_params(source, use_ema=init.use_ema)
            where = f"toolbox:{source}@{step}"
        gemma_convert.check_toolbox_params(params, cfg, f"The params of {where}")
        return Base(T.Transformer(cfg), tokenizer, params, where, source_config)
    if init.kind == "hf":
        return _load_hf_base(config)
    tokenizer = _corpus_tokenizer(config)
    # A gemma tree fixes the vocabulary (config.model.vocab_size); a scratch model takes the tokenizer's.
    vocab = (config.model.get("vocab_size") or tokenizer.vocab_size) if init.kind == "gemma" else tokenizer.vocab_size
    cfg = _model_config(config.model.to_dict(), vocab)
    if init.kind == "gemma":
        cfg = cfg.dropless()  # pretrained weights: capacity dropping would change their outputs
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(f"The tokenizer has {tokenizer.vocab_size} ids but model.vocab_size={cfg.vocab_size}.")
    model = T.Transformer(cfg)
    if init.kind == "gemma":
        if not init.checkpoint:
            raise ValueError("config.init.kind='gemma' needs config.init.checkpoint (a gemma-layout orbax directory).")
        params = gemma_convert.load_gemma_checkpoint(
            init.checkpoint, cfg, dtype=cfg.param_dtype, ignore_unexpected=bool(init.get("ignore_unexpected", False))
        )
        return Base(model, tokenizer, params, f"gemma:{init.checkpoint}")
    params = jax.device_get(T.init_params(model, jax.random.key(config.seed)))
    return Base(model, tokenizer, params, "scratch")


def _load_hf_base(config: ml_collections.ConfigDict) -> Base:
    """A Hugging Face DiffusionGemma / Gemma-4 directory: its config, weights and tokenizer."""
    from hackable_diffusion.models import hf_convert

    init = config.init
    if not init.checkpoint:
        raise ValueError("config.init.kind='hf' needs config.init.checkpoint (a Hugging Face checkpoint directory).")
    checkpoint = hf_convert.load_hf(
        init.checkpoint,
        dtype=init.get("dtype") or None,
        decoder_window=init.get("decoder_window", "per_token"),
        ignore_unexpected=bool(init.get("ignore_unexpected", False)),
    )
    try:
        tokenizer = tok_lib.PretrainedTokenizer.from_directory(init.checkpoint)
    except FileNotFoundError:
        tokenizer = _corpus_tokenizer(config)
    if tokenizer.vocab_size > checkpoint.config.vocab_size:
        raise ValueError(
            f"The tokenizer has {tokenizer.vocab_size} ids but the checkpoint's vocabulary is "
            f"{checkpoint.config.vocab_size}."
        )
    return Base(T.Transformer(checkpoint.config), tokenizer, checkpoint.params, f"hf:{init.checkpoint}")


def router_frozen_mask(params: PyTree) -> PyTree:
    """Full fine-tuning with `lora.freeze_router`: every leaf trained except the router's."""
    flat = gemma_convert.flatten_tree(params)
    return gemma_convert.unflatten_tree({p: not any(p.endswith(r) for r in ROUTER_LEAVES) for p in flat})


# ----------------------------------------------------------------------------------------------------------------
# Demo data: tiny Shakespeare line pairs.


def shakespeare_pairs(text: str, prompt_lines: int, response_lines: int) -> list[tuple[str, str]]:
    """Non-overlapping (prompt, response) windows of lines; the prompt keeps its trailing newline."""
    if prompt_lines < 1 or response_lines < 1:
        raise ValueError(f"prompt_lines and response_lines must be >= 1, got {prompt_lines}, {response_lines}.")
    lines = text.split("\n")
    window = prompt_lines + response_lines
    pairs = []
    for start in range(0, len(lines) - window + 1, window):
        prompt = "\n".join(lines[start : start + prompt_lines])
        if not prompt.strip():
            continue
        pairs.append((prompt + "\n", "\n".join(lines[start + prompt_lines : start + window])))
    return pairs


def build_examples(
    pairs: Sequence[tuple[str, str]], tokenizer: Tokenizer, chunker: CanvasChunker, max_examples: int = 0
) -> dict[str, np.ndarray]:
    """Collated CanvasChunker examples of the pairs (pairs with characters outside the vocabulary are skipped)."""
    examples = []
    for prompt, response in pairs:
        if max_examples and len(examples) >= max_examples:
            break
        try:
            examples.append(chunker(tokenizer.encode(prompt), tokenizer.encode(response)))
        except ValueError:
            continue
    if not examples:
        raise ValueError("No SFT example could be built (empty split, or every pair has unknown characters).")
    return collate_examples(examples)


@dataclasses.dataclass(frozen=True)
class GatherExamples:
    """Global batch of example indices -> this process's rows [start, stop) of every field."""

    examples: Mapping[str, np.ndarray]
    start: int
    stop: int

    def __call__(self, global_indices: np.ndarray) -> dict[str, np.ndarray]:
        rows = global_indices[self.start : self.stop]
        return {k: np.ascontiguousarray(v[rows]) for k, v in self.examples.items()}


def make_example_iterator(
    examples: Mapping[str, np.ndarray], batch_size: int, seed: int, process_index: int = 0, process_count: int = 1
) -> grain.DatasetIterator:
    """Shuffled, repeated batches of examples (per process), with a checkpointable grain state."""
    count = len(next(iter(examples.values())))
    if batch_size < 1 or count < 1:
        raise ValueError(f"need batch_size >= 1 and at least one example, got {batch_size} and {count}.")
    start = process_index * batch_size
    dataset = (
        grain.MapDataset.source(np.arange(count, dtype=np.int64))
        .seed(seed)
        .shuffle()
        .repeat()
        .batch(batch_size * process_count, drop_remainder=True)
        .map(GatherExamples(dict(examples), start, start + batch_size))
    )
    return iter(dataset.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)))


def eval_batches(examples: Mapping[str, np.ndarray], batch_size: int, num_batches: int) -> list[dict[str, np.ndarray]]:
    count = len(next(iter(examples.values())))
    out = []
    for begin in range(0, count - batch_size + 1, batch_size):
        out.append({k: v[begin : begin + batch_size] for k, v in examples.items()})
        if len(out) == num_batches:
            break
    return out


# ----------------------------------------------------------------------------------------------------------------
# Param directories.


def save_params(params: PyTree, directory: str | os.PathLike) -> str:
    """Writes a params pytree with orbax (StandardCheckpointer), replacing an existing directory."""
    directory = os.path.abspath(os.fspath(directory))
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(directory, params, force=True)
    checkpointer.wait_until_finished()
    return directory


def load_params(directory: str | os.PathLike) -> PyTree:
    """Reads a params pytree written by `save_params` (numpy arrays, on the host)."""
    directory = os.path.abspath(os.fspath(directory))
    checkpointer = ocp.PyTreeCheckpointer()
    metadata = gemma_convert.tree_metadata(directory)
    return checkpointer.restore(
        directory,
        args=ocp.args.PyTreeRestore(
            restore_args=jax.tree.map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
        ),
    )


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

    process = exp_lib.build_process(config, cfg.vocab_size)
    objective = exp_lib.build_objective(config, model, process)
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

    optimizer_cfg = config.optimizer.copy_and_resolve_references()
    if not optimizer_cfg.total_steps:
        optimizer_cfg.total_steps = config.train.num_steps
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
        total_steps=config.train.num_steps,
        optimizer_cfg=optimizer_cfg,
        mesh=mesh,
        param_logical_axes_fn=axes_fn,
        seed=config.seed,
        grad_accum_steps=config.train.grad_accum_steps,
        ema_decay=config.train.ema_decay,
        log_every=config.train.log_every,
        checkpoint_every=config.train.checkpoint_every,
        keep_checkpoints=config.train.keep_checkpoints,
        eval_fn=eval_fn if batches else None,
        eval_every=config.train.eval_every,
        tokens_per_example=s.prompt_len + s.num_canvases * c,
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
        sampler = exp_lib.build_sampler(config, process, forbidden_tokens=(0, 2, 3) + unused)
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
