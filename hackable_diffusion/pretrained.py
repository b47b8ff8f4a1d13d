"""Weights a run starts from or is scored with: its own orbax checkpoints, or a Hugging Face checkpoint directory.

`load_params` reads a run's latest (or a given) checkpoint onto one device, the EMA weights when the run kept them;
a run made from a Hugging Face checkpoint (`config.init.kind == "hf"`) reads the checkpoint's safetensors instead.
`--workdir hf:DIR` on `sample` / `evaluate` stands for such a run: `hf_run_dir` writes its config (model shape and
the sampler of the checkpoint's generation_config.json) and tokenizer to a cache directory, never into the checkpoint.

`load_base(config)` gives fine-tuning (`sft.py`) its model, tokenizer and base params as `config.init` names them:
kind "toolbox": `init.checkpoint` is a toolbox workdir (or its `checkpoints/` folder); the params (EMA if
`init.use_ema` and present) of its latest step are restored, and its `config.json` (model shape) and `tokenizer/` are
used when present. kind "params": `init.checkpoint` is a params directory written by `save_params` (e.g. the
`fused_params` of an earlier SFT run; its parent's `config.json` and `tokenizer/` are used the same way). kind
"gemma": a gemma-layout orbax directory (`models.gemma_convert.load_gemma_checkpoint`), shaped by `config.model`. kind
"hf": a Hugging Face DiffusionGemma / Gemma-4 directory (`models.hf_convert.load_hf`: its config.json gives the model
shape, its tokenizer the tokenizer). kind "scratch": random init (smoke tests).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from hackable_diffusion import builders, cli, recipes
from hackable_diffusion.data import text as text_lib
from hackable_diffusion.data import tokenizers as tok_lib
from hackable_diffusion.data.tokenizers import Tokenizer
from hackable_diffusion.models import gemma_convert
from hackable_diffusion.models import lora as lora_lib
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig

PyTree = Any
INIT_KINDS = ("toolbox", "params", "gemma", "hf", "scratch")
FUSED_DIR = "fused_params"  # the fused weights an SFT run writes (kind "params" reads them)

if TYPE_CHECKING:
    from hackable_diffusion.experiment import Experiment


def load_params(exp: Experiment, workdir: str, *, use_ema: bool = True, step: int | None = None):
    """Parameters of the latest (or given) checkpoint in `workdir/checkpoints`, on the default device.

    Returns (params, step). The EMA parameters are used when the run kept them and `use_ema`.
    """
    from hackable_diffusion.training import checkpointing, optimizers
    from hackable_diffusion.training.train_state import TrainState

    config = exp.config
    if exp.model.cfg.weight_dtype == "float8_e4m3fn":  # a run written by `python -m hackable_diffusion.quantize`
        return load_quantized_run(workdir)
    if config.get("init", {}).get("kind") == "hf":  # a run made from a Hugging Face checkpoint: its weights
        from hackable_diffusion.models import hf_convert

        return hf_convert.load_hf(config.init.checkpoint, dtype=exp.model.cfg.param_dtype).params, 0
    optimizer = optimizers.make_optimizer(builders.optimizer_config(config))
    with_ema = config.train.ema_decay > 0

    def create():
        params = T.init_params(exp.model, jax.random.key(0))
        return TrainState.create(params, optimizer, jax.random.key(0), use_ema=with_ema)

    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), jax.eval_shape(create))
    ckpt = checkpointing.Checkpointer(str(pathlib.Path(workdir) / "checkpoints"), async_save=False)
    try:
        if step is None:
            restored = ckpt.restore_latest(abstract)
            if restored is None:
                raise FileNotFoundError(
                    f"No checkpoint in {workdir}/checkpoints: train first with python -m "
                    f"hackable_diffusion.train --config ... --workdir {workdir}."
                )
            state, step = restored
        else:
            state = ckpt.restore(step, abstract)
    finally:
        ckpt.close()
    params = state.ema_params if (use_ema and state.ema_params is not None) else state.params
    return params, int(step)


QUANTIZED_DIR = "fp8_params"  # a quantized run's weights (models/quantize.py)
QUANTIZED_SOURCE = "quantized_from.json"  # the run and step they were quantized from


def load_quantized_run(workdir: str):
    """(QuantizedParams, step) of a run written by `python -m hackable_diffusion.quantize`."""
    from hackable_diffusion.models import quantize as Q

    run = pathlib.Path(workdir)
    if not (run / QUANTIZED_DIR).is_dir():
        raise FileNotFoundError(
            f"{workdir} says model.weight_dtype='float8_e4m3fn' but has no {QUANTIZED_DIR}/: make it with python -m "
            f"hackable_diffusion.quantize --workdir TRAINED_RUN --out {workdir}."
        )
    source = json.loads((run / QUANTIZED_SOURCE).read_text())
    return Q.load_quantized(run / QUANTIZED_DIR), int(source["step"])


HF_PREFIX = "hf:"  # --workdir hf:DIR: a Hugging Face checkpoint directory used as a run


def hf_experiment_config(path: str) -> ml_collections.ConfigDict:
    """The toolbox config of a run made from a Hugging Face checkpoint: its model shape, and the sampler its
    generation_config.json describes (DiffusionGemma: uniform noise over the whole vocabulary as transformers draws it,
    entropy bound, linear temperature, stable-and-confident stopping, its canvas length); a Gemma-4 causal LM is an
    autoregressive run. Data: tiny Shakespeare through the checkpoint's own tokenizer."""
    from hackable_diffusion.models import hf_convert

    hf = hf_convert.read_config(path)
    cfg, info = hf_convert.config_from_hf(hf)
    model = dataclasses.asdict(cfg)
    diffusion = info.model_type == hf_convert.DIFFUSION_GEMMA
    canvas = int(info.canvas_length or 256)
    config = recipes.text_config(
        "shakespeare", "uniform" if diffusion else "none", canvas_len=canvas, seq_len=canvas * 2
    )
    config.model = ml_collections.ConfigDict(model)
    config.data.tokenizer = "pretrained"
    config.diffusion.excluded_ids = ()  # transformers draws noise over every token id
    config.init = ml_collections.ConfigDict(dict(kind="hf", checkpoint=str(pathlib.Path(path).resolve())))
    generation_file = pathlib.Path(path) / hf_convert.GENERATION_CONFIG_FILE
    generation = json.loads(generation_file.read_text()) if generation_file.is_file() else {}
    s = config.sampler
    s.num_steps = int(generation.get("max_denoising_steps") or 48)
    bound = (generation.get("sampler_config") or {}).get("entropy_bound", 0.1)
    s.selection = recipes.selection("entropy_bound", gamma=float(bound))
    s.min_temperature = float(generation.get("t_min") or 0.4)
    s.max_temperature = float(generation.get("t_max") or 0.8)
    s.early_stopping = "transformers"
    s.canvas_len, s.max_new_tokens, s.prompt = canvas, canvas, ""
    return config


def hf_run_dir(path: str) -> pathlib.Path:
    """A run directory standing for a Hugging Face checkpoint (config.json + the checkpoint's tokenizer), kept under
    `$HACKABLE_DIFFUSION_CACHE/hf_runs/` so that the checkpoint directory itself is never written to. The weights
    stay in the checkpoint: `load_params` reads them from there."""
    import hashlib
    import os

    from hackable_diffusion import cli
    from hackable_diffusion.data.tokenizers import PretrainedTokenizer

    source = pathlib.Path(path).resolve()
    cache = pathlib.Path(
        os.environ.get("HACKABLE_DIFFUSION_CACHE", pathlib.Path.home() / ".cache" / "hackable_diffusion")
    )
    run = cache / "hf_runs" / (source.name + "-" + hashlib.sha256(str(source).encode()).hexdigest()[:12])
    if not (run / "tokenizer").is_dir():
        PretrainedTokenizer.from_directory(source).save(run / "tokenizer", metadata={"kind": "pretrained"})
    cli.save_config(hf_experiment_config(str(source)), run / "config.json")
    return run


# ----------------------------------------------------------------------------------------------------------------
# Base weights of a fine-tuning run, and params directories.


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
            params, where = load_params_directory(source), f"params:{source}"
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


def save_params(params: PyTree, directory: str | os.PathLike) -> str:
    """Writes a params pytree with orbax (StandardCheckpointer), replacing an existing directory."""
    directory = os.path.abspath(os.fspath(directory))
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(directory, params, force=True)
    checkpointer.wait_until_finished()
    return directory


def load_params_directory(directory: str | os.PathLike) -> PyTree:
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
