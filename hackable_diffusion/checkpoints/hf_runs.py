"""A Hugging Face checkpoint directory used as a run: `--workdir hf:DIR` on `sample`, `evaluate`, `quantize`.

`hf_run_dir` writes the run files that stand for the checkpoint (config.json: the model shape and the sampler its
generation_config.json describes; the checkpoint's tokenizer) to a cache directory, never into the checkpoint; the
weights stay where they are and `toolbox.load_params` reads them from there.
"""

from __future__ import annotations

import dataclasses
import pathlib

import ml_collections

from hackable_diffusion import recipes, run_config
from hackable_diffusion.checkpoints import hf as hf_ckpt
from hackable_diffusion.checkpoints import hf_files
from hackable_diffusion.data.tokenizers import PretrainedTokenizer

HF_PREFIX = "hf:"  # --workdir hf:DIR: a Hugging Face checkpoint directory used as a run


def resolve_workdir(workdir: str | None) -> str | None:
    """A run directory for `--workdir`: the directory itself, or for `hf:DIR` the run directory that stands for it."""
    if workdir is None or not workdir.startswith(HF_PREFIX):
        return workdir
    return str(hf_run_dir(workdir[len(HF_PREFIX) :]))


def hf_experiment_config(path: str) -> ml_collections.ConfigDict:
    """The toolbox config of a run made from a Hugging Face checkpoint: its model shape, and the sampler its
    generation_config.json describes (DiffusionGemma: uniform noise over the whole vocabulary as transformers draws it,
    entropy bound, linear temperature, stable-and-confident stopping, its canvas length); a Gemma-4 causal LM is an
    autoregressive run. Data: tiny Shakespeare through the checkpoint's own tokenizer."""
    cfg, info = hf_files.read_model_config(path)  # a missing directory or a broken config.json, by name
    model = dataclasses.asdict(cfg)
    diffusion = info.model_type == hf_ckpt.DIFFUSION_GEMMA
    canvas = int(info.canvas_length or 256)
    config = recipes.text_config(
        "shakespeare", "uniform" if diffusion else "none", canvas_len=canvas, seq_len=canvas * 2
    )
    config.model = ml_collections.ConfigDict(model)
    config.data.tokenizer = "pretrained"
    config.diffusion.excluded_ids = ()  # transformers draws noise over every token id
    config.init = ml_collections.ConfigDict(dict(kind="hf", checkpoint=str(pathlib.Path(path).resolve())))
    generation_file = pathlib.Path(path) / hf_files.GENERATION_CONFIG_FILE
    generation = hf_files.read_json(generation_file) if generation_file.is_file() else {}
    s = config.sampler
    s.num_steps = int(generation.get("max_denoising_steps") or 48)
    bound = (generation.get("sampler_config") or {}).get("entropy_bound", 0.1)
    s.selection = recipes.selection("entropy_bound", gamma=float(bound))
    s.min_temperature = float(generation.get("t_min") or 0.4)
    s.max_temperature = float(generation.get("t_max") or 0.8)
    s.early_stopping = recipes.early_stopping("transformers")
    s.canvas_len, s.max_new_tokens, s.prompt = canvas, canvas, ""
    return config


def hf_run_dir(path: str) -> pathlib.Path:
    """A run directory standing for a Hugging Face checkpoint (config.json + the checkpoint's tokenizer), kept under
    `$HACKABLE_DIFFUSION_CACHE/hf_runs/` so that the checkpoint directory itself is never written to. The weights
    stay in the checkpoint: `load_params` reads them from there."""
    import hashlib
    import os

    source = pathlib.Path(path).resolve()
    cache = pathlib.Path(
        os.environ.get("HACKABLE_DIFFUSION_CACHE", pathlib.Path.home() / ".cache" / "hackable_diffusion")
    )
    run = cache / "hf_runs" / (source.name + "-" + hashlib.sha256(str(source).encode()).hexdigest()[:12])
    if not (run / "tokenizer").is_dir():
        PretrainedTokenizer.from_directory(source).save(run / "tokenizer", metadata={"kind": "pretrained"})
    run_config.save_config(hf_experiment_config(str(source)), run / "config.json")
    return run
