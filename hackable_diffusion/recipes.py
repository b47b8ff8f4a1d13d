"""Config builders shared by the files in `configs/` (md4 / big_vision style `ml_collections` configs).

A config file composes these: a model shape from `models.presets`, a data section, a diffusion section (process,
schedule, time sampler, objective, loss), the optimizer, the training loop, the mesh, evaluation and the sampler used
for evaluation samples. Every field is a plain value so that any of them can be overridden on the command line
(`--config.diffusion.process=masking`); `hackable_diffusion.experiment` turns the values into objects.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from hackable_diffusion.models import presets

PROCESSES = ("uniform", "masking", "none")  # "none": the autoregressive baseline
OBJECTIVES = ("pretrain", "sft", "ar")


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.model = ml_collections.ConfigDict(presets.tiny())
  c.data = ml_collections.ConfigDict(dict(
      task="text",  # "text" (packed corpus) | "sudoku"
      corpus="shakespeare",  # "shakespeare" | "ptb"
      tokenizer="char",  # "char" | "spm"
      vocab_size=0,  # spm only (0 = char tokenizer decides)
      seq_len=128,
      batch_size=16,  # per process
      data_dir="",  # "" = $HD_DATA_DIR or ../shared/data
  ))
  c.diffusion = ml_collections.ConfigDict(dict(
      process="uniform",
      schedule="linear",
      schedule_eps=1e-4,
      excluded_ids=(0, 1, 2, 3),  # ids uniform noise never produces (PAD, EOS, BOS, MASK); () = the reference
      objective="pretrain",
      canvas_len=32,  # 0 = one canvas per sequence (MD4/MDLM)
      loss="elbo",  # "elbo" | "canvas_ce"
      time_sampler="antithetic",  # "uniform" | "antithetic" | "clipped_uniform"
      t_min=0.0,
      t_max=1.0,
      encoder_ar_weight=0.0,
      self_condition_prob=0.0,
      null_signal="zeros",
  ))
  c.optimizer = ml_collections.ConfigDict(dict(
      name="adamw", peak_lr=3e-3, end_lr=3e-4, warmup_steps=50, total_steps=0,  # 0: train.num_steps
      weight_decay=0.01, b1=0.9,
      b2=0.99, eps=1e-8, clip_norm=1.0))
  c.train = ml_collections.ConfigDict(dict(
      num_steps=500, grad_accum_steps=1, ema_decay=0.0, log_every=25, eval_every=250, checkpoint_every=250,
      keep_checkpoints=3))
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, expert=1, tensor=1))
  c.eval = ml_collections.ConfigDict(dict(num_batches=8, batch_size=32, num_samples=2))
  c.sampler = ml_collections.ConfigDict(dict(
      selection="entropy_bound",  # any key of sampling.selection.SELECTION_RULES
      selection_kwargs='{"gamma": 0.1}',  # JSON: the rule's arguments, e.g. '{"tau": 0.9}' for "threshold"
      early_stopping="diffusiongemma",  # any key of sampling.early_stopping.EARLY_STOPPING
      min_temperature=0.4, max_temperature=0.8, temperature_exponent=1.0,
      num_steps=32, canvas_len=32, max_new_tokens=128, prompt="ROMEO:", ar_temperature=0.8))
  return c


def text_config(corpus: str = "shakespeare", process: str = "uniform", *, model: dict[str, Any] | None = None,
                steps: int = 500, seq_len: int = 128, batch_size: int = 16, canvas_len: int = 32,
                diffusiongemma_recipe: bool | None = None) -> ml_collections.ConfigDict:
  """A text pretraining experiment. `process="uniform"` defaults to DiffusionGemma's recipe (canvas CE, encoder
  AR loss, self-conditioning); "masking" to the MD4/MDLM ELBO over block canvases; "none" to the AR baseline."""
  if process not in PROCESSES:
    raise ValueError(f"process={process!r} is not one of {PROCESSES}.")
  c = base_config()
  c.model = ml_collections.ConfigDict(model or presets.tiny())
  c.data.corpus = corpus
  c.data.seq_len = seq_len
  c.data.batch_size = batch_size
  if corpus == "ptb":
    c.data.tokenizer, c.data.vocab_size = "spm", 2048
    c.sampler.prompt = "the company said"
  c.diffusion.process = process
  c.diffusion.canvas_len = canvas_len
  c.sampler.canvas_len = canvas_len
  c.train.num_steps = steps
  recipe = process == "uniform" if diffusiongemma_recipe is None else diffusiongemma_recipe
  if process == "none":
    c.diffusion.objective = "ar"
  elif recipe:
    c.diffusion.loss = "canvas_ce"
    c.diffusion.encoder_ar_weight = 1.0
    c.diffusion.self_condition_prob = 0.5
    c.diffusion.time_sampler = "uniform"
    c.diffusion.t_min, c.diffusion.t_max = 1e-4, 1.0 - 1e-4
    c.model.self_conditioning = True
  return c
