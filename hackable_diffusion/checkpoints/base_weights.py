"""The weights a run starts from, as `config.init` names them, and how they enter the new model.

Every command that trains takes the same `config.init` section (`recipes.init_section`; `--init_from KIND:PATH` sets
kind and checkpoint, `set_init_from`). `load_base(config)` gives the model, tokenizer and params of the source.
kind "toolbox": `init.checkpoint` is a toolbox workdir (or its `checkpoints/` folder); the params (EMA if
`init.weights == "ema"` and present) of its latest step, or of `init.step`, are restored, and its `config.json` (model
shape) and `tokenizer/` are used when present. kind "params": `init.checkpoint` is a params directory written by
`toolbox.save_params` (e.g. the `fused_params` of an earlier SFT run; its parent's `config.json` and `tokenizer/` are
used the same way). kind "gemma": a gemma-layout orbax directory (`checkpoints.gemma.load_gemma_checkpoint`), shaped
by `config.model`. kind "hf": a Hugging Face DiffusionGemma / Gemma-4 directory (`checkpoints.hf.load_hf`: its
config.json gives the model shape, its tokenizer the tokenizer). kind "scratch": random init.

`sft` and `rl` train the source's own shape. `train` keeps its config's model and recipe (e.g. a masking run started
from an autoregressive one, whose parameter trees are the same) and maps the source onto it strictly
(`match_params`, `weight_matching.py`): every parameter of the new model is loaded (its shape checked) or is new, and
a new parameter is an error unless a glob of `init.allow_new` matches its path (default `recipes.ALLOW_NEW`: the
self-conditioner that DiffusionGemma's recipe adds); source parameters the new model has no place for are reported as
unused. The outcome is an `InitReport`, printed as one table and saved as `init_report.json` in the run directory.
The init applies to a fresh run only: a workdir with checkpoints resumes from them (`has_checkpoints`).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections
import numpy as np

from hackable_diffusion import recipes, run_config
from hackable_diffusion.checkpoints import gemma as gemma_ckpt
from hackable_diffusion.checkpoints.toolbox import load_params_directory, load_toolbox_params
from hackable_diffusion.checkpoints.weight_matching import InitReport, match_params, param_shapes
from hackable_diffusion.data import text as text_lib
from hackable_diffusion.data import tokenizers as tok_lib
from hackable_diffusion.data.tokenizers import Tokenizer
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig

PyTree = Any
INIT_KINDS = ("toolbox", "params", "gemma", "hf", "scratch")
INIT_FROM_HELP = (
    "The starting weights, KIND:PATH with KIND one of toolbox (a training workdir), params (a params directory), "
    "gemma (a gemma-layout orbax tree), hf (a Hugging Face directory); sets config.init.kind and "
    "config.init.checkpoint."
)


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
    tokenizer_dir: pathlib.Path | None = None  # the folder the tokenizer was read from (a run's tokenizer/), if any


def define_init_from_flag() -> None:
    """The `--init_from KIND:PATH` flag of every command that trains (train, sft, rl)."""
    from absl import flags

    flags.DEFINE_string("init_from", None, INIT_FROM_HELP)


def set_init_from(config: ml_collections.ConfigDict, spec: str) -> None:
    """Sets `config.init.kind` and `config.init.checkpoint` from a command's `--init_from KIND:PATH` (in place); a
    config without an init section gets the default one first (`recipes.init_section`)."""
    kind, _, checkpoint = spec.partition(":")
    if kind not in INIT_KINDS or kind == "scratch" or not checkpoint:
        raise ValueError(f"--init_from={spec!r} must be KIND:PATH with KIND one of toolbox, params, gemma, hf.")
    if "init" not in config:
        with config.unlocked():
            config.init = recipes.init_section()
    config.init.kind, config.init.checkpoint = kind, checkpoint


def init_kind(config: ml_collections.ConfigDict) -> str:
    """`config.init.kind`, "scratch" for a config without an init section."""
    return str(config.get("init", {}).get("kind", "scratch") or "scratch")


def allow_patterns(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The globs of `config.init.allow_new` (a comma-separated string, or a sequence of globs)."""
    value = config.get("init", {}).get("allow_new", recipes.ALLOW_NEW)
    items = value.split(",") if isinstance(value, str) else list(value or ())
    return tuple(p.strip() for p in items if p and p.strip())


def check_init(config: ml_collections.ConfigDict) -> None:
    """The checks of `config.init` that read no weights (run before a command writes anything): a known kind, and a
    checkpoint path that exists for the kinds that read one."""
    kind = init_kind(config)
    if kind not in INIT_KINDS:
        raise ValueError(f"config.init.kind={kind!r} must be one of {INIT_KINDS}.")
    if kind == "scratch":
        return
    checkpoint = config.init.get("checkpoint", "")
    if not checkpoint:
        raise ValueError(
            f"config.init.kind={kind!r} needs config.init.checkpoint (or --init_from {kind}:PATH); set "
            "config.init.kind=scratch to train from random init."
        )
    if not pathlib.Path(checkpoint).exists():
        raise ValueError(f"config.init.checkpoint={checkpoint!r} does not exist (config.init.kind={kind!r}).")


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
            params, step = load_toolbox_params(source, weights=init.weights, step=int(init.get("step", 0)) or None)
            where = f"toolbox:{source}@{step}"
        gemma_ckpt.check_toolbox_params(params, cfg, f"The params of {where}")
        saved_tokenizer = tokenizer_dir if (tokenizer_dir / tok_lib.CONFIG_FILE).is_file() else None
        return Base(T.Transformer(cfg), tokenizer, params, where, source_config, saved_tokenizer)
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
        saved_tokenizer = pathlib.Path(init.tokenizer_dir) if init.get("tokenizer_dir") else None
        return Base(model, tokenizer, params, f"gemma:{init.checkpoint}", tokenizer_dir=saved_tokenizer)
    params = jax.device_get(T.init_params(model, jax.random.key(config.seed)))
    return Base(model, tokenizer, params, "scratch")


def _load_hf_base(config: ml_collections.ConfigDict) -> Base:
    """A Hugging Face DiffusionGemma / Gemma-4 directory: its config, weights and tokenizer."""
    from hackable_diffusion.checkpoints import hf as hf_ckpt  # deferred: read by Hugging Face starts alone

    init = config.init
    if not init.checkpoint:
        raise ValueError("config.init.kind='hf' needs config.init.checkpoint (a Hugging Face checkpoint directory).")
    checkpoint = hf_ckpt.load_hf(
        init.checkpoint,
        dtype=init.get("dtype") or None,
        decoder_window=init.get("decoder_window") or None,  # None: the convention config.json records
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


def has_checkpoints(workdir: str | pathlib.Path) -> bool:
    """Whether `workdir/checkpoints` holds a finished step (a step folder: orbax names them by the step alone), so
    that the run resumes from it and `config.init` is not applied again."""
    checkpoints = pathlib.Path(workdir) / "checkpoints"
    return checkpoints.is_dir() and any(p.name.isdigit() and p.is_dir() for p in checkpoints.iterdir())


def report_start(
    base: Base, model: T.Transformer, config: ml_collections.ConfigDict, workdir: str | pathlib.Path | None
) -> tuple[dict[str, np.ndarray], InitReport]:
    """`match_params` of `base` onto `model` with the config's `init.allow_new`; prints the table and, with a
    `workdir`, saves `init_report.json` there (process 0). Returns the loaded arrays and the report."""
    allow_new = allow_patterns(config)
    loaded, report = match_params(base.params, param_shapes(model), allow_new=allow_new, source=base.source)
    if jax.process_index() == 0:
        print(report.table(), flush=True)
        if workdir is not None:
            report.save(workdir)
    return loaded, report


def _data_keys(config: ml_collections.ConfigDict) -> dict[str, Any]:
    d = config.data
    keys = {"task": d.get("task", "text")}
    if keys["task"] == "text":
        keys.update(corpus=d.get("corpus"), tokenizer=d.get("tokenizer"), vocab_size=d.get("vocab_size", 0) or 0)
    return keys


def resolve_train_config(config: ml_collections.ConfigDict, base: Base) -> ml_collections.ConfigDict:
    """The config of a `train` run that starts from `base`: this config's model shape and recipe, with the source's
    vocabulary (`model.vocab_size`: the rows of its embedding, indexed by its tokenizer). The task, and for text the
    corpus and tokenizer settings the source's saved tokenizer was made with, must be the source run's."""
    if base.source_config is not None:
        source, this = _data_keys(base.source_config), _data_keys(config)
        keys = ("task",) if base.tokenizer_dir is None else tuple(source)
        differing = [k for k in keys if k in this and source.get(k) != this.get(k)]
        if differing:
            shown = ", ".join(f"config.data.{k}={this[k]!r} (the source: {source[k]!r})" for k in differing)
            fix = " ".join(f"--config.data.{k}={source[k]}" for k in differing)
            raise ValueError(
                f"config.init: the source {base.source} was trained on other data: {shown}. Its embedding rows are "
                f"the ids of its own tokenizer; train on the same data settings ({fix})."
            )
    if isinstance(base.tokenizer, tok_lib.PretrainedTokenizer) and config.data.get("tokenizer") != "pretrained":
        raise ValueError(
            f"config.init: the source {base.source} brings its own tokenizer; set --config.data.tokenizer=pretrained "
            "so that the run tokenizes with it."
        )
    config = config.copy_and_resolve_references()
    with config.unlocked():
        config.model.vocab_size = int(base.model.cfg.vocab_size)
    return config


def resumed_train_config(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> ml_collections.ConfigDict:
    """The config of a `train` run that resumes from its checkpoints: `config.init` applies to a fresh run only, so a
    resumed run keeps the init section its config.json saved (scratch when it saved none) and, when that started
    from weights, the vocabulary it was given then; the source is not read again."""
    path = pathlib.Path(workdir) / "config.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    saved_init = saved.get("init") or {"kind": "scratch"}
    if init_kind(config) == "scratch" and saved_init.get("kind", "scratch") == "scratch":
        return config  # a run from scratch, then and now
    section = recipes.init_section()
    section.update({k: v for k, v in saved_init.items() if k in section})
    config = config.copy_and_resolve_references()
    if jax.process_index() == 0:
        given = f"{init_kind(config)}:{config.get('init', {}).get('checkpoint', '')}".rstrip(":")
        kept = f"{section.kind}:{section.checkpoint}".rstrip(":")
        print(
            f"{pathlib.Path(workdir) / 'checkpoints'} holds checkpoints: resuming from them. config.init applies to a "
            f"fresh run only; this run keeps the init it started with ({kept}; given now: {given}).",
            flush=True,
        )
    with config.unlocked():
        config.init = section
        vocab = saved.get("model", {}).get("vocab_size")
        if section.kind != "scratch" and vocab:
            config.model.vocab_size = int(vocab)
    return config


def save_fine_tuning_files(config: ml_collections.ConfigDict, base: Base, workdir: str | pathlib.Path) -> None:
    """`sft` and `rl` (process 0): the run's config.json, and the base's tokenizer the first time (a task without a
    tokenizer, Sudoku or Countdown, has none to save)."""
    if jax.process_index() != 0:
        return
    path = pathlib.Path(workdir)
    run_config.save_config(config, path / "config.json")
    if base.tokenizer is not None and not (path / "tokenizer" / tok_lib.CONFIG_FILE).is_file():
        base.tokenizer.save(path / "tokenizer", metadata={"source": base.source})


def config_from_command_flags(flag_values, example: str) -> ml_collections.ConfigDict:
    """The `--config` of a fine-tuning command (sft, rl) after its usage checks, with `--init_from` applied, printed."""
    from absl import app

    if flag_values.config is None:
        raise app.UsageError(f"--config is required: a config file such as {example}.")
    if flag_values.workdir is None:
        raise app.UsageError("--workdir is required (the run directory; rerunning with it resumes).")
    config = flag_values.config
    if flag_values.init_from:
        set_init_from(config, flag_values.init_from)
    print("Config:\n" + json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str), flush=True)
    return config


def install_tokenizer(base: Base, workdir: str | pathlib.Path) -> None:
    """Puts the source's tokenizer in `workdir/tokenizer` (process 0), so that the run's token ids are the ones its
    weights were trained on: a copy of the folder it was read from, or a checkpoint's own tokenizer saved as kind
    "pretrained". A workdir that already holds another tokenizer is an error."""
    if jax.process_index() != 0:
        return
    target = pathlib.Path(workdir) / "tokenizer"
    if base.tokenizer_dir is not None and base.tokenizer_dir.resolve() != target.resolve():
        if not (target / tok_lib.CONFIG_FILE).is_file():
            shutil.copytree(base.tokenizer_dir, target, dirs_exist_ok=True)
            return
        differ = [
            f.name
            for f in base.tokenizer_dir.iterdir()
            if f.is_file() and (not (target / f.name).is_file() or (target / f.name).read_bytes() != f.read_bytes())
        ]
        if differ:
            raise ValueError(
                f"{target} holds another tokenizer than the source's {base.tokenizer_dir} ({', '.join(differ)} "
                "differ); start the run in a new workdir or remove that tokenizer folder."
            )
    elif isinstance(base.tokenizer, tok_lib.PretrainedTokenizer) and not (target / tok_lib.CONFIG_FILE).is_file():
        base.tokenizer.save(target, metadata={"kind": "pretrained"})
