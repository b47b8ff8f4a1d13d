"""Turns a config (plain values) into the objects of one experiment: data, model, process, objective, sampler.

Names in the config are looked up in small registries (schedules, time samplers, selection rules, early stopping);
everything built is a frozen dataclass, so a notebook can build the same pieces by hand and swap any of them.
`train.py`, `sample.py` and `evaluate.py` all start here, from the config saved in the workdir, so sampling and
evaluation reuse exactly the model shape, process and tokenizer that training used.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from hackable_diffusion.data import text as text_lib
from hackable_diffusion.data.tokenizers import BOS_ID, EOS_ID, MASK_ID, Tokenizer
from hackable_diffusion.diffusion import objectives as obj_lib
from hackable_diffusion.diffusion.processes import MaskingProcess, NoiseProcess, UniformProcess
from hackable_diffusion.diffusion.schedules import TIME_SAMPLERS, make_schedule
from hackable_diffusion.models import transformer as T
from hackable_diffusion.models.config import TransformerConfig
from hackable_diffusion.sampling import generate as gen_lib
from hackable_diffusion.sampling.canvas import DiffusionSampler
from hackable_diffusion.sampling.early_stopping import make_early_stopping
from hackable_diffusion.sampling.selection import make_selection
from hackable_diffusion.sampling.temperature import AnnealedTemperature


@dataclasses.dataclass(frozen=True)
class Experiment:
  config: ml_collections.ConfigDict
  model: T.Transformer
  process: NoiseProcess | None  # None for the autoregressive baseline
  objective: Any
  tokenizer: Tokenizer
  data: text_lib.TextData

  @property
  def is_autoregressive(self) -> bool:
    return self.process is None


def build_process(config: ml_collections.ConfigDict, vocab_size: int) -> NoiseProcess | None:
  d = config.diffusion
  if d.process == "none":
    return None
  schedule = make_schedule(d.schedule, eps=d.schedule_eps)
  if d.process == "masking":
    return MaskingProcess(vocab_size=vocab_size, schedule=schedule, mask_id=MASK_ID)
  if d.process == "uniform":
    return UniformProcess(vocab_size=vocab_size, schedule=schedule, excluded_ids=tuple(d.excluded_ids))
  raise ValueError(f"config.diffusion.process={d.process!r} must be 'uniform', 'masking' or 'none'.")


def build_objective(config: ml_collections.ConfigDict, model: T.Transformer, process: NoiseProcess | None):
  d = config.diffusion
  if d.objective == "ar" or process is None:
    return obj_lib.AutoregressiveObjective(model)
  if d.time_sampler not in TIME_SAMPLERS:
    raise ValueError(f"config.diffusion.time_sampler={d.time_sampler!r} is not one of {sorted(TIME_SAMPLERS)}.")
  sampler_cls = TIME_SAMPLERS[d.time_sampler]
  times = sampler_cls(d.t_min, d.t_max)
  common = dict(time_sampler=times, loss=d.loss, encoder_ar_weight=d.encoder_ar_weight,
                self_condition_prob=d.self_condition_prob, null_signal=d.null_signal)
  if d.objective == "pretrain":
    return obj_lib.DiffusionPretrainObjective(model, process, canvas_len=d.canvas_len or None, **common)
  if d.objective == "sft":
    return obj_lib.CanvasSFTObjective(model, process, canvas_len=d.canvas_len, **common)
  raise ValueError(f"config.diffusion.objective={d.objective!r} must be 'pretrain', 'sft' or 'ar'.")


def build_text_data(config: ml_collections.ConfigDict, workdir: str) -> text_lib.TextData:
  dc = config.data
  return text_lib.build_text_data(dc.corpus, dc.tokenizer, dc.vocab_size or None, dc.seq_len, workdir,
                                  data_dir=dc.data_dir or None)


def build_model(config: ml_collections.ConfigDict, vocab_size: int) -> T.Transformer:
  shape = config.model.to_dict()
  shape["vocab_size"] = vocab_size
  return T.Transformer(TransformerConfig.from_dict(shape))


def build(config: ml_collections.ConfigDict, workdir: str) -> Experiment:
  if config.data.task != "text":
    raise ValueError(f"config.data.task={config.data.task!r}: only 'text' is wired into train.py so far.")
  data = build_text_data(config, workdir)
  model = build_model(config, data.tokenizer.vocab_size)
  process = build_process(config, data.tokenizer.vocab_size)
  return Experiment(config=config, model=model, process=process, objective=build_objective(config, model, process),
                    tokenizer=data.tokenizer, data=data)


def build_sampler(config: ml_collections.ConfigDict, process: NoiseProcess, **overrides: Any) -> DiffusionSampler:
  s = config.sampler
  try:
    kwargs = json.loads(s.selection_kwargs) if s.selection_kwargs else {}
  except json.JSONDecodeError as err:
    raise ValueError(f"config.sampler.selection_kwargs must be a JSON object like '{{\"gamma\": 0.1}}', got "
                     f"{s.selection_kwargs!r} ({err}).") from None
  sampler = DiffusionSampler(
      process=process,
      selection=make_selection(s.selection, **kwargs),
      temperature=AnnealedTemperature(s.min_temperature, s.max_temperature, s.temperature_exponent),
      early_stopping=make_early_stopping(s.early_stopping),
      num_steps=s.num_steps,
      canvas_length=s.canvas_len,
      null_signal=config.diffusion.null_signal,
      forbidden_tokens=(0, 2, 3),  # never generate PAD, BOS or MASK
  )
  return sampler.replace(**overrides) if overrides else sampler


def sample_texts(exp: Experiment, params, prompts: list[str], *, seed: int = 0,
                 max_new_tokens: int | None = None) -> tuple[list[str], gen_lib.GenerationResult]:
  """Generates a continuation of each prompt with the experiment's sampler (diffusion) or AR decoding."""
  s = exp.config.sampler
  max_new = max_new_tokens or s.max_new_tokens
  ids = [[BOS_ID] + exp.tokenizer.encode(p) for p in prompts]
  if exp.is_autoregressive:
    result = gen_lib.generate_ar(exp.model, params, ids, key=seed, max_new_tokens=max_new,
                                 sampling=gen_lib.ARSampling(temperature=s.ar_temperature),
                                 forbidden_tokens=(0, 2, 3))
  else:
    sampler = build_sampler(exp.config, exp.process)
    max_new = int(math.ceil(max_new / sampler.canvas_length) * sampler.canvas_length)
    result = gen_lib.generate(exp.model, params, ids, sampler=sampler, key=seed, max_new_tokens=max_new,
                              stop_tokens=(EOS_ID,))
  texts = [exp.tokenizer.decode(np.asarray(row)) for row in result.tokens]
  return texts, result


def flops_per_token(model: T.Transformer, seq_len: int) -> float:
  """Training FLOPs per token of one forward+backward pass (6 N + attention), N = active matmul parameters."""
  from hackable_diffusion.models.param_count import count_params

  cfg = model.cfg
  counts = count_params(cfg)
  # Matmul parameters per token: active minus the embedding lookup, plus the tied head (V x D matmul).
  n = counts["active_params_per_token"] - counts["embedding_params"] + cfg.vocab_size * cfg.embed_dim
  attn = 0
  for layer_type in cfg.layer_types():
    head_dim = cfg.global_attn_head_dim if layer_type == "global" else cfg.head_dim
    span = seq_len if layer_type == "global" else min(seq_len, 2 * cfg.sliding_window)
    attn += 2 * 2 * cfg.num_heads * head_dim * span  # QK^T and PV, forward
  return float(3 * (2 * n + attn))


def objective_passes(config: ml_collections.ConfigDict) -> float:
  """Forward passes over the sequence per training step: 1 (AR, one canvas), 2 (encoder + decoder), +1 with
  self-conditioning (its first pass runs without gradients, counted fully here)."""
  d = config.diffusion
  if d.objective == "ar" or d.process == "none":
    return 1.0
  passes = 1.0 if (d.objective == "pretrain" and not d.canvas_len) else 2.0
  if d.self_condition_prob > 0 and config.model.get("self_conditioning", False):
    passes += 1.0
  return passes


def evaluate_likelihood(exp: Experiment, params, *, num_batches: int | None = None, seed: int = 0,
                        batch_size: int | None = None) -> dict[str, float]:
  """Validation NLL (AR) or ELBO (diffusion) in bits per token, per character (Shakespeare) or perplexity per word
  (PTB), with the Monte-Carlo standard error over batches (diffusion)."""
  batch_size = batch_size or exp.config.eval.batch_size
  batches = text_lib.make_eval_batches(exp.data.eval_sequences, batch_size)
  if num_batches:
    batches = batches[:num_batches]
  key_name = "nll_bits_per_token" if exp.is_autoregressive else "elbo_bits_per_token"
  fn = jax.jit(exp.objective)
  bits, tokens = [], []
  for i, batch in enumerate(batches):
    _, metrics = fn(params, {k: jnp.asarray(v) for k, v in batch.items()}, jax.random.key(seed * 100003 + i))
    n = float(np.sum(batch["weights"] > 0))
    bits.append(float(metrics[key_name]) * n)
    tokens.append(n)
  bits, tokens = np.asarray(bits), np.asarray(tokens)
  per_token = bits.sum() / tokens.sum()
  per_batch = bits / tokens
  se = float(np.std(per_batch, ddof=1) / np.sqrt(len(per_batch))) if len(per_batch) > 1 else float("nan")
  out = {"bits_per_token": float(per_token), "bits_per_token_se": se, "eval_tokens": int(tokens.sum())}
  full = exp.data.eval_num_tokens
  covered = tokens.sum() / max(full, 1)
  if exp.data.eval_num_chars:
    out["bits_per_char"] = float(per_token * full / exp.data.eval_num_chars)
  if exp.data.eval_num_words:
    out["ppl_per_word"] = float(2 ** (per_token * full / exp.data.eval_num_words))
  out["fraction_of_split"] = float(covered)
  return out


def workdir_path(workdir: str) -> pathlib.Path:
  path = pathlib.Path(workdir)
  path.mkdir(parents=True, exist_ok=True)
  return path


def optimizer_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The optimizer section with `total_steps` resolved (0 means `train.num_steps`)."""
  cfg = config.optimizer.copy_and_resolve_references()
  if not cfg.total_steps:
    cfg.total_steps = config.train.num_steps
  return cfg


def load_params(exp: Experiment, workdir: str, *, use_ema: bool = True, step: int | None = None):
  """Parameters of the latest (or given) checkpoint in `workdir/checkpoints`, on the default device.

  Returns (params, step). The EMA parameters are used when the run kept them and `use_ema`.
  """
  from hackable_diffusion.training import checkpointing, optimizers
  from hackable_diffusion.training.train_state import TrainState

  config = exp.config
  optimizer = optimizers.make_optimizer(optimizer_config(config))
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
        raise FileNotFoundError(f"No checkpoint in {workdir}/checkpoints: train first with python -m "
                                f"hackable_diffusion.train --config ... --workdir {workdir}.")
      state, step = restored
    else:
      state = ckpt.restore(step, abstract)
  finally:
    ckpt.close()
  params = state.ema_params if (use_ema and state.ema_params is not None) else state.params
  return params, int(step)


def from_workdir(workdir: str) -> Experiment:
  """Rebuilds the experiment of a training run from its saved config and tokenizer."""
  from hackable_diffusion import cli

  return build(cli.load_saved_config(workdir), workdir)
