"""The weights a fine-tuning run starts from, as `config.init` names them.

`load_base(config)` gives `sft` (and every command that trains from weights) its model, tokenizer and base params:
kind "toolbox": `init.checkpoint` is a toolbox workdir (or its `checkpoints/` folder); the params (EMA if
`init.weights == "ema"` and present) of its latest step are restored, and its `config.json` (model shape) and `tokenizer/` are
used when present. kind "params": `init.checkpoint` is a params directory written by `toolbox.save_params` (e.g. the
`fused_params` of an earlier SFT run; its parent's `config.json` and `tokenizer/` are used the same way). kind
"gemma": a gemma-layout orbax directory (`checkpoints.gemma.load_gemma_checkpoint`), shaped by `config.model`. kind
"hf": a Hugging Face DiffusionGemma / Gemma-4 directory (`checkpoints.hf.load_hf`: its config.json gives the model
shape, its tokenizer the tokenizer). kind "scratch": random init (smoke tests).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections

from hackable_diffusion import run_config
from hackable_diffusion.checkpoints import gemma as gemma_ckpt
from hackable_diffusion.checkpoints.toolbox import load_params_directory, load_toolbox_params
from hackable_diffusion.data import text as text_lib
from hackable_diffusion.data import tokenizers as tok_lib
from hackable_diffusion.data.tokenizers import Tokenizer
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig

PyTree = Any
INIT_KINDS = ("toolbox", "params", "gemma", "hf", "scratch")


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
    tokenizer: Tokenizer | None  # None: a toolbox run of a task with its own fixed vocabulary (Sudoku)
    params: PyTree
    source: str
    source_config: ml_collections.ConfigDict | None = None  # the source run's config.json, if any


def set_init_from(config: ml_collections.ConfigDict, spec: str) -> None:
    """Sets `config.init.kind` and `config.init.checkpoint` from a command's `--init_from KIND:PATH` (in place)."""
    kind, _, checkpoint = spec.partition(":")
    if kind not in INIT_KINDS or kind == "scratch" or not checkpoint:
        raise ValueError(f"--init_from={spec!r} must be KIND:PATH with KIND one of toolbox, params, gemma, hf.")
    config.init.kind, config.init.checkpoint = kind, checkpoint


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
        if not source.exists():
            raise ValueError(
                f"config.init.checkpoint={str(source)!r} does not exist: give a toolbox run directory (kind 'toolbox') "
                "or a params directory (kind 'params')."
            )
        run_dir = source.parent if (source.name == "checkpoints" or init.kind == "params") else source
        tokenizer_dir = run_dir / "tokenizer"
        shape, source_config = config.model.to_dict(), None
        if (run_dir / "config.json").is_file():
            source_config = run_config.load_saved_config(str(run_dir))
            shape = source_config.model.to_dict()
        if (tokenizer_dir / tok_lib.CONFIG_FILE).is_file():
            tokenizer = tok_lib.load_tokenizer(tokenizer_dir)
        elif (source_config or config).data.get("task", "text") != "text":
            tokenizer = None  # a task with a fixed vocabulary (Sudoku): the task builds it
        else:
            tokenizer = _corpus_tokenizer(config)
        cfg = _model_config(shape, tokenizer.vocab_size if tokenizer is not None else None)
        if init.kind == "params":
            params, where = load_params_directory(source), f"params:{source}"
        else:
            params, step = load_toolbox_params(source, weights=init.weights)
            where = f"toolbox:{source}@{step}"
        gemma_ckpt.check_toolbox_params(params, cfg, f"The params of {where}")
        return Base(T.Transformer(cfg), tokenizer, params, where, source_config)
    if init.kind == "hf":
        return _load_hf_base(config)
    own_vocabulary = config.data.get("task", "text") != "text"  # e.g. Sudoku: the task builds its vocabulary
    tokenizer = None if own_vocabulary else _corpus_tokenizer(config)
    # A gemma tree fixes the vocabulary (config.model.vocab_size); a scratch model takes the tokenizer's.
    if tokenizer is None or init.kind == "gemma":
        vocab = config.model.get("vocab_size") or tokenizer.vocab_size
    else:
        vocab = tokenizer.vocab_size
    cfg = _model_config(config.model.to_dict(), vocab)
    if init.kind == "gemma":
        cfg = cfg.dropless()  # pretrained weights: capacity dropping would change their outputs
    if tokenizer is not None and tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(f"The tokenizer has {tokenizer.vocab_size} ids but model.vocab_size={cfg.vocab_size}.")
    model = T.Transformer(cfg)
    if init.kind == "gemma":
        if not init.checkpoint:
            raise ValueError("config.init.kind='gemma' needs config.init.checkpoint (a gemma-layout orbax directory).")
        params = gemma_ckpt.load_gemma_checkpoint(
            init.checkpoint, cfg, dtype=cfg.param_dtype, ignore_unexpected=bool(init.get("ignore_unexpected", False))
        )
        return Base(model, tokenizer, params, f"gemma:{init.checkpoint}")
    params = jax.device_get(T.init_params(model, jax.random.key(config.seed)))
    return Base(model, tokenizer, params, "scratch")


def _load_hf_base(config: ml_collections.ConfigDict) -> Base:
    """A Hugging Face DiffusionGemma / Gemma-4 directory: its config, weights and tokenizer."""
    from hackable_diffusion.checkpoints import hf as hf_ckpt

    init = config.init
    if not init.checkpoint:
        raise ValueError("config.init.kind='hf' needs config.init.checkpoint (a Hugging Face checkpoint directory).")
    checkpoint = hf_ckpt.load_hf(
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
