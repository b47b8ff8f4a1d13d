"""Checkpoint conversion entry point: Hugging Face directories, gemma-library orbax trees and toolbox runs.

  python -m hackable_diffusion.convert --from runs/sft_lora --to exported/        # a toolbox run -> Hugging Face
  python -m hackable_diffusion.convert --from hf_dir --to gemma_dir --to_format gemma
  python -m hackable_diffusion.convert --from gemma_dir --config configs/models/diffusiongemma_26b_a4b.py --to hf_dir

Formats are detected from the source (`--from_format` / `--to_format` override): `hf` (config.json + safetensors:
DiffusionGemma or Gemma-4, `checkpoints/hf.py`), `gemma` (an orbax tree in the gemma library's layout,
`checkpoints/gemma.py`), `workdir` (a run of `python -m hackable_diffusion.train` or `sft`; its EMA weights when it
kept them, an SFT run's merged `fused_params`). The targets are `hf` and `gemma`; a Hugging Face directory is used
directly by `sample`, `evaluate --workdir hf:DIR` and `sft --init_from hf:DIR`, so it needs no toolbox run.
A toolbox model with a self-conditioner is written as a DiffusionGemma checkpoint, one without as a text-only Gemma-4
(`--model_type` overrides); a run's export carries its tokenizer (a char run's as `tokenizer.json`, an spm run's
`tokenizer.model`), its vocabulary and training context, and its decoder-window convention: a run trained with the
per-token window is refused as DiffusionGemma (transformers decodes with `cache_tail`) unless
`--allow_decoder_window_mismatch` (docs/checkpoints.md). A gemma source needs the model shape: `--config` names a
model config file (configs/models/*.py), and `--config.<key>=value` overrides its keys. Prints one JSON line.

The target is written whole: a non-empty `--to` directory is refused unless `--overwrite`, which replaces it (nothing
of the old checkpoint stays); the new directory is written beside it and swapped in at the end, so a failure part-way
leaves the target as it was.
"""

from __future__ import annotations

import pathlib

from absl import app, flags

from hackable_diffusion import cli, run_config
from hackable_diffusion.data import safe_files

FLAGS = flags.FLAGS
FORMATS = ("hf", "gemma", "workdir")


def define_flags(argv: list[str]):
    argv = cli.define_config_file_flag(argv, "gemma sources: a model config file (configs/models/*.py) with the shape.")
    flags.DEFINE_string("from", None, "The source checkpoint: a Hugging Face directory, a gemma orbax tree or a run.")
    flags.DEFINE_string("to", None, "The directory to write.")
    flags.DEFINE_enum("from_format", None, list(FORMATS), "Source format (default: detected).")
    flags.DEFINE_enum("to_format", "hf", ["hf", "gemma"], "Target format.")
    flags.DEFINE_enum(
        "model_type", None, ["diffusion_gemma", "gemma4_text"], "hf target: default by the self-conditioner."
    )
    flags.DEFINE_string("dtype", "", "Cast the parameters (e.g. bfloat16); empty keeps the stored dtypes.")
    flags.DEFINE_bool("ignore_unexpected", False, "hf/gemma sources: skip tensors the model has no place for.")
    flags.DEFINE_bool("overwrite", False, "Replace a non-empty --to directory whole (refused without it).")
    flags.DEFINE_bool(
        "allow_decoder_window_mismatch",
        False,
        "A run trained with model.decoder_window=per_token exported as DiffusionGemma anyway: the toolbox's load_hf "
        "reproduces it (config.json records the convention), transformers' canvas logits differ past the window.",
    )
    return argv


def detect_format(path: pathlib.Path) -> str:
    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion.checkpoints import hf_files

    if hf_files.is_hf_directory(path):
        return "hf"
    if (path / "config.json").is_file() and ((path / "checkpoints").is_dir() or (path / "fused_params").is_dir()):
        return "workdir"
    if path.is_dir() and any(path.iterdir()):
        return "gemma"
    if not path.exists():
        raise FileNotFoundError(f"--from {path}: no such directory; pass an existing checkpoint directory or run.")
    if not path.is_dir():
        raise NotADirectoryError(f"--from {path} is a file; pass the checkpoint's directory (e.g. {path.parent}).")
    raise FileNotFoundError(
        f"--from {path} is empty: neither a Hugging Face directory (config.json + model.safetensors), a toolbox run "
        "(config.json + checkpoints/) nor an orbax tree."
    )


def check_paths(source: pathlib.Path, target: pathlib.Path, overwrite: bool) -> None:
    """Refuses, before anything is read, a target that would destroy the source or mix two checkpoints."""

    src, dst = source.resolve(), target.resolve()
    if src == dst or src in dst.parents or dst in src.parents:
        raise ValueError(
            f"--to {target} overlaps --from {source} (the same directory, or one inside the other): write the "
            "converted checkpoint to a separate directory."
        )
    safe_files.check_target(target, overwrite=overwrite, hint="--overwrite")


def load_source(path: pathlib.Path, fmt: str, *, model_config=None, dtype: str = "", ignore_unexpected: bool = False):
    """(TransformerConfig, params, extras) of a checkpoint; extras: what a writer may carry over."""
    import jax

    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion.checkpoints import gemma as gemma_ckpt
    from hackable_diffusion.checkpoints import hf as hf_ckpt
    from hackable_diffusion.models import quantize
    from hackable_diffusion.models.config import TransformerConfig

    if fmt == "hf":
        checkpoint = hf_ckpt.load_hf(path, dtype=dtype or None, ignore_unexpected=ignore_unexpected)
        return checkpoint.config, checkpoint.params, {"source": path, "canvas_length": checkpoint.info.canvas_length}
    if fmt == "gemma":
        if model_config is None:
            raise ValueError("a gemma source needs the model shape: --config configs/models/NAME.py.")
        cfg = TransformerConfig.from_dict(model_config.get("model", model_config).to_dict())
        params = gemma_ckpt.load_gemma_checkpoint(path, cfg, dtype=dtype or None, ignore_unexpected=ignore_unexpected)
        return cfg, params, {}
    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion import experiment as exp_lib
    from hackable_diffusion.checkpoints import toolbox

    config = run_config.load_saved_config(str(path))
    if config.diffusion.get("token_shift", False):
        raise ValueError(
            f"{path} was trained with diffusion.token_shift (each position read from the logits to its left); Gemma "
            "and DiffusionGemma checkpoints read every position's own logits, so the export would sample wrongly. "
            "Sample it with this toolbox (python -m hackable_diffusion.sample --workdir RUN)."
        )
    cfg = TransformerConfig.from_dict(config.model.to_dict())
    if (path / toolbox.FUSED_DIR).is_dir():  # an SFT run: its fused weights
        params = toolbox.load_params_directory(path / toolbox.FUSED_DIR)
    else:
        params, _ = toolbox.load_params(exp_lib.from_workdir(str(path)), str(path))
        # a quantized run (python -m hackable_diffusion.quantize): its FP8 weights dequantized, in param_dtype
        params = quantize.for_compute(params, cfg.param_dtype)
        cfg = cfg.replace(weight_dtype=None)
    params = jax.device_get(params)
    # The built model's vocabulary is the tokenizer's (experiment.build), which config.model.vocab_size (a preset's
    # default) need not be: config.json must describe the embedding the run trained.
    cfg = cfg.replace(vocab_size=int(params["embedder"]["input_embedding"].shape[0]))
    if dtype:
        import numpy as np

        # deferred: the command loads no jax before it runs (test_light_imports.py)
        from hackable_diffusion.models.config import resolve_dtype

        params = jax.tree.map(lambda x: np.asarray(x).astype(resolve_dtype(dtype)), params)
    canvas = int(config.diffusion.get("canvas_len") or config.sampler.get("canvas_len") or 256)
    extras = {
        "canvas_length": canvas,
        "sampler": config.sampler.to_dict(),
        "context": int(config.data.get("seq_len") or 0) or None,  # the run's training context
        "run": True,
        **run_tokenizer_file(path),
    }
    tokenizer_dir = path / "tokenizer"
    if (tokenizer_dir / "tokenizer.json").is_file():
        # deferred: the command loads no jax before it runs (test_light_imports.py)
        from hackable_diffusion.data import tokenizers as tok_lib

        extras["tokenizer"] = tok_lib.load_tokenizer(tokenizer_dir)  # written into the export beside the weights
    init = config.get("init") or {}
    if init.get("kind") == "hf" and init.get("checkpoint") and pathlib.Path(init.checkpoint).is_dir():
        extras["source"] = pathlib.Path(init.checkpoint)  # its vision tensors, generation and tokenizer files
    return cfg, params, extras


def run_tokenizer_file(run: pathlib.Path) -> dict:
    """{"tokenizer_file": FILE} when the run tokenizes with a Hugging Face checkpoint's own tokenizer (kind
    "pretrained": a tokenizers JSON or a SentencePiece model), which an exported directory must carry; else {}."""
    import json

    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion.data import tokenizers as tok_lib

    described = run / "tokenizer" / tok_lib.CONFIG_FILE
    if not described.is_file():
        return {}
    saved = json.loads(described.read_text())
    if saved.get("kind") != tok_lib.PretrainedTokenizer.kind or not saved.get("model_file"):
        return {}
    return {"tokenizer_file": run / "tokenizer" / saved["model_file"]}


def check_decoder_window(cfg, source: pathlib.Path, model_type: str, allow_mismatch: bool) -> str | None:
    """Refuses a toolbox run whose canvases transformers would decode otherwise than it was trained.

    transformers' DiffusionGemma decoder lets a canvas's local layers see the last `sliding_window - 1` cached tokens
    and the whole canvas (`decoder_window="cache_tail"`); a run trained with the gemma library's per-token window
    (`"per_token"`, the default) computes other canvas logits as soon as prompt + canvas exceeds the window. A run
    trained with `--config.model.decoder_window=cache_tail`, a model without local layers, or a Gemma-4 target (no
    decoder in transformers) passes. allow_mismatch: export anyway and return the warning to print."""
    if model_type != "diffusion_gemma" or cfg.decoder_window == "cache_tail" or "local" not in cfg.layer_pattern:
        return None
    what = (
        f"{source} was trained with model.decoder_window=per_token (the gemma library's window), but transformers' "
        "DiffusionGemma decodes canvases with decoder_window=cache_tail: its canvas logits differ from the run's once "
        f"prompt + canvas exceeds sliding_window={cfg.sliding_window}"
    )
    if not allow_mismatch:
        raise ValueError(
            f"{what}. Train with --config.model.decoder_window=cache_tail to export a model transformers decodes as "
            "trained, or pass --allow_decoder_window_mismatch (config.json then records per_token, which the "
            "toolbox's load_hf and hf:DIR follow)."
        )
    return f"warning: {what}; config.json records decoder_window=per_token, which the toolbox follows."


def convert(
    source: str,
    target: str,
    *,
    from_format: str | None = None,
    to_format: str = "hf",
    model_type: str | None = None,
    model_config=None,
    dtype: str = "",
    ignore_unexpected: bool = False,
    overwrite: bool = False,
    allow_decoder_window_mismatch: bool = False,
) -> dict:
    """Converts `source` to `target`; a non-empty target is refused unless `overwrite`, then replaced whole.

    A toolbox run exported as Hugging Face carries its tokenizer (`tokenizers.save_hf_tokenizer`), its training context
    as `max_position_embeddings` and its window convention (`check_decoder_window`)."""
    # deferred: the command loads no jax before it runs (test_light_imports.py)
    from hackable_diffusion.checkpoints import gemma as gemma_ckpt
    from hackable_diffusion.checkpoints import hf as hf_ckpt
    from hackable_diffusion.checkpoints import hf_files

    src, dst = pathlib.Path(source), pathlib.Path(target)
    check_paths(src, dst, overwrite)
    fmt = from_format or detect_format(src)
    cfg, params, extras = load_source(
        src, fmt, model_config=model_config, dtype=dtype, ignore_unexpected=ignore_unexpected
    )
    if to_format == "gemma":
        with safe_files.replacing_directory(dst, what="the gemma checkpoint") as staging:
            gemma_ckpt.save_gemma_checkpoint(params, cfg, staging)
    else:
        kind = model_type or (hf_ckpt.DIFFUSION_GEMMA if cfg.self_conditioning else hf_ckpt.GEMMA4_TEXT)
        warning = None
        if extras.get("run"):
            warning = check_decoder_window(cfg, src, kind, allow_decoder_window_mismatch)
        hf_ckpt.save_hf(
            dst,
            cfg,
            params,
            model_type=kind,
            canvas_length=extras.get("canvas_length") or 256,
            sampler=extras.get("sampler"),
            source=extras.get("source"),
            overwrite=True,  # checked above, before the source was read
            max_position_embeddings=extras.get("context"),
        )
        tokenizer = extras.get("tokenizer_file")
        if tokenizer is not None and not any((dst / n).exists() for n in hf_files.TOKENIZER_FILES):
            import shutil

            name = "tokenizer.json" if pathlib.Path(tokenizer).suffix == ".json" else "tokenizer.model"
            shutil.copyfile(tokenizer, dst / name)  # the run's own tokenizer, so that hf:DIR samples as the run did
        elif extras.get("tokenizer") is not None and not any((dst / n).exists() for n in hf_files.TOKENIZER_FILES):
            # deferred: the command loads no jax before it runs (test_light_imports.py)
            from hackable_diffusion.data import tokenizers as tok_lib

            tok_lib.save_hf_tokenizer(extras["tokenizer"], dst)  # a char run's tokenizer.json, an spm run's .model
        if warning:
            import sys

            print(warning, file=sys.stderr, flush=True)
    return {"from": str(src), "from_format": fmt, "to": str(dst), "to_format": to_format, "layers": cfg.num_layers}


def main(argv):
    del argv
    source, target = getattr(FLAGS, "from"), FLAGS.to
    if not source or not target:
        raise app.UsageError("--from and --to are required (a checkpoint to read and a directory to write).")
    cli.quiet_library_logs()
    result = convert(
        source,
        target,
        from_format=FLAGS.from_format,
        to_format=FLAGS.to_format,
        model_type=FLAGS.model_type,
        model_config=FLAGS.config,
        dtype=FLAGS.dtype,
        ignore_unexpected=FLAGS.ignore_unexpected,
        overwrite=FLAGS.overwrite,
        allow_decoder_window_mismatch=FLAGS.allow_decoder_window_mismatch,
    )
    print(cli.json_line(result))


if __name__ == "__main__":
    cli.run_command(define_flags, main, __doc__)
